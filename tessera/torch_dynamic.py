"""Shape buckets for PyTorch modules and dynamo graphs (issue 16).

`BucketedModule` runs a module (or a graph dynamo captured with dynamic sizes) through one
tessera plan per bucket of its dynamic sizes, as `runtime/buckets.py` does for ONNX artifacts:
a call pads its tensors with zeros up to the smallest bucket that holds their sizes, runs that
bucket's plan, and cuts the outputs back. Buckets are powers of two (capped by the dim's upper
bound), or the sizes the user listed.

Padding a dim is checked once per bucket, on its first padded call, by running the module itself
(eager) on the real inputs and on the padded ones: the outputs' real part must agree, and the
output axes that differ are the ones cut back. A dim that fails runs exact-size plans from then on.
"""
from __future__ import annotations

import contextlib
import copy
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from tessera.errors import ShapeError, TesseraError
from tessera.log import logger
from tessera.runtime.buckets import bucket_keys, pad_to, power_of_two_buckets, size_inside
from tessera.tolerance import TOLERANCE, rel_l2


@dataclass
class TorchDim:
    """A dynamic size `symbol`, on each (argument index, axis) of `uses`; `ints` are the integer
    arguments that carry the size itself (dynamo passes symbolic sizes as ints). `buckets` are the
    sizes compiled for (None: powers of two, on demand, up to `high`)."""
    symbol: str
    uses: list[tuple[int, int]]
    ints: list[int] = field(default_factory=list)
    buckets: tuple[int, ...] | None = None
    low: int = 1
    high: int | None = None
    pad: bool | None = None  # None: not checked yet

    def bucket_for(self, size: int) -> int:
        if size < self.low or (self.high is not None and size > self.high):
            i, axis = self.uses[0]
            raise ShapeError(f"argument {i} axis {axis} ({self.symbol}) is {size}; the compiled range is "
                             f"{self.low}..{self.high}")
        if self.pad is False:
            return size
        if self.buckets is not None:
            return next(b for b in self.buckets if b >= size)
        b = 1
        while b < size:
            b *= 2
        return min(b, self.high) if self.high is not None else b


def _flat(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


_HALF = (torch.float16, torch.bfloat16)


def _in_fp32(fn: Any, args: Sequence[Any]) -> tuple[Any, list[Any]]:
    """`fn` and `args` with half floats widened to float32, so that the padding check sees a leak
    of 1e-5 (fp16 rounding would hide it). A module gets a float32 copy; a dynamo graph takes its
    parameters as arguments, which are widened with the rest."""
    wide = [x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x for x in args]
    if isinstance(fn, torch.nn.Module) and not isinstance(fn, torch.fx.GraphModule) and \
            any(p.dtype in _HALF for p in list(fn.parameters()) + list(fn.buffers())):
        fn = copy.deepcopy(fn).float()
    return fn, wide


@contextlib.contextmanager
def _no_tf32() -> Iterator[None]:
    """Full fp32 matmuls and convolutions while checking (tf32 would blur the comparison)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


class BucketedModule:
    """`fn` (a module or a dynamo graph) through one plan per bucket (module doc). `compile_plan(args)`
    compiles a plan for args of one bucket's shapes."""

    def __init__(self, fn: Callable[..., Any], dims: Sequence[TorchDim], name: str,
                 compile_plan: Callable[[Sequence[Any]], Callable[..., Any]], scalars: Sequence[int] = ()) -> None:
        self.fn, self.dims, self.name, self.compile_plan = fn, list(dims), name, compile_plan
        # 0-d tensor arguments a plan bakes in (module scalars dynamic=True lifts): part of the key
        self.scalars = list(scalars)
        self.plans: dict[tuple[Any, ...], Callable[..., Any]] = {}
        # output index -> [(axis, symbol)] to cut back after a padded call (from the padding checks)
        self.output_axes: dict[int, list[tuple[int, str]]] = {}
        self.checked: set[tuple[str, int]] = set()
        # threads meeting one new bucket (or padding check) at once: one compiles, the others wait
        self._compiling = threading.RLock()

    def sizes(self, args: Sequence[Any]) -> tuple[int, ...]:
        out = []
        for d in self.dims:
            seen = {int(args[i].shape[a]) for i, a in d.uses}
            if len(seen) != 1:
                raise ShapeError(f"{self.name}: the arguments disagree on {d.symbol}: sizes {sorted(seen)}")
            out.append(seen.pop())
        return tuple(out)

    def padded(self, args: Sequence[Any], key: Sequence[int]) -> list[Any]:
        """`args` for bucket `key`: tensors zero-padded on their dynamic axes, size ints replaced."""
        out = list(args)
        for d, b in zip(self.dims, key):
            for i in d.ints:
                out[i] = b
            for i, a in d.uses:
                x = out[i]
                if x.shape[a] != b:
                    shape = list(x.shape)
                    shape[a] = b
                    out[i] = pad_to(x, shape)
        return out

    def _check(self, d: TorchDim, args: Sequence[Any], key: tuple[int, ...]) -> None:
        """Padding `d` alone up to its bucket: does the module's real output part stay the same?"""
        i = self.dims.index(d)
        real = self.sizes(args)
        one = real[:i] + (key[i],) + real[i + 1:]
        reason = ""
        axes: dict[int, list[int]] = {}
        tol = TOLERANCE["fp32"]
        try:
            try:
                fn, wide = _in_fp32(self.fn, args)
                with torch.no_grad(), _no_tf32():
                    want = _flat(fn(*wide))
                    got = _flat(fn(*_in_fp32(None, self.padded(args, one))[1]))
            except Exception:  # noqa: BLE001 - a module that casts inside fails in float32: its own dtypes
                tol = TOLERANCE["fp16"] / 10  # above fp16's noise between two shapes' kernels
                with torch.no_grad():
                    want = _flat(self.fn(*args))
                    got = _flat(self.fn(*self.padded(args, one)))
        except Exception as e:  # noqa: BLE001 - the module's own code raises whatever it raises
            want, got = [], []
            reason = f"the module fails on inputs padded along {d.symbol} ({type(e).__name__}: {str(e)[:200]})"
        for k, (y, z) in enumerate(zip(want, got)):
            if not isinstance(y, torch.Tensor):
                if y != z:
                    reason = f"output {k} ({y!r}) depends on {d.symbol}"
                continue
            diff = [a for a, (s, t) in enumerate(zip(y.shape, z.shape)) if s != t]
            if y.dim() != z.dim() or any((y.shape[a], z.shape[a]) != (real[i], key[i]) for a in diff):
                reason = f"output {k} has shape {list(y.shape)} at {d.symbol}={real[i]}, {list(z.shape)} padded"
                break
            err = rel_l2(z[tuple(slice(0, s) for s in y.shape)].float().cpu().numpy(), y.float().cpu().numpy())
            if err > tol:
                reason = f"zero padding {d.symbol} from {real[i]} to {key[i]} changes output {k} (rel L2 {err:.2e})"
                break
            axes[k] = diff
        if reason:
            d.pad = False
            logger.warning("%s: %s; %s runs a plan per size from now on", self.name, reason, d.symbol)
            return
        d.pad = True
        for k, diff in axes.items():
            pairs = self.output_axes.setdefault(k, [])
            pairs.extend((a, d.symbol) for a in diff if (a, d.symbol) not in pairs)
        self.checked.add((d.symbol, key[i]))

    def key_for(self, args: Sequence[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the call's sizes, its bucket), checking padding first where a dim pads into a bucket for
        the first time (a dim that fails runs exact sizes)."""
        sizes = self.sizes(args)
        key = tuple(d.bucket_for(s) for d, s in zip(self.dims, sizes))
        for d, s, b in zip(self.dims, sizes, key):
            if b != s and (d.symbol, b) not in self.checked:
                with self._compiling:
                    if (d.symbol, b) not in self.checked:
                        self._check(d, args, key)
        return sizes, tuple(d.bucket_for(s) for d, s in zip(self.dims, sizes))

    def plan(self, key: tuple[int, ...], padded: Sequence[Any]) -> Callable[..., Any]:
        """The plan of bucket `key`, compiled now for `padded` (args of its shapes) if it is new."""
        full = key + tuple(padded[i].item() for i in self.scalars)
        if full not in self.plans:
            with self._compiling:
                if full not in self.plans:
                    logger.info("%s: compiling the bucket %s", self.name,
                                ", ".join(f"{d.symbol}={b}" for d, b in zip(self.dims, key)) or "of its static shapes")
                    self.plans[full] = self.compile_plan(padded)
        return self.plans[full]

    def __call__(self, *args: Any) -> Any:
        sizes, key = self.key_for(args)
        padded = self.padded(args, key)
        out = self.plan(key, padded)(*padded)
        if sizes == key:
            return out
        real = {d.symbol: s for d, s in zip(self.dims, sizes)}
        flat = _flat(out)
        for k, pairs in self.output_axes.items():
            y = flat[k]
            for axis, sym in pairs:
                y = y.narrow(axis, 0, real[sym])
            flat[k] = y.contiguous()
        return tuple(flat) if isinstance(out, (tuple, list)) else flat[0]

    def compile_all(self, example_inputs: Sequence[Any]) -> None:
        """Compile every bucket now (dims with listed buckets), each after its padding check on the
        example data resized to a size between that bucket and the one below."""
        keys = bucket_keys(self.dims)  # type: ignore[arg-type] - TorchDim has .buckets too
        for key in keys:
            probe = list(example_inputs)
            for d, b in zip(self.dims, key):
                assert d.buckets is not None
                size = size_inside(d.buckets, d.low, b)
                for i, a in d.uses:
                    probe[i] = _resize(probe[i], a, size)
                for i in d.ints:
                    probe[i] = size
            _, got = self.key_for(probe)
            if got == key:
                self.plan(key, self.padded(probe, key))
            else:
                logger.info("%s: the bucket %s is compiled at its first call of that size", self.name, key)


def _resize(x: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """Real data of `size` along `axis`: the leading part of x, or x repeated."""
    idx = torch.arange(size, device=x.device) % x.shape[axis]
    return x.index_select(axis, idx)


def dims_from_spec(example_inputs: Sequence[Any], dynamic: Mapping[int, Mapping[int, Any]]) -> list[TorchDim]:
    """`tessera.compile(..., dynamic={arg: {axis: spec}})` -> TorchDims. A spec is (low, high): power-of-two
    buckets up to `high`; (low, high, name): the same, shared by every axis given that name (a
    sequence that input ids and their attention mask both carry); or a list of bucket sizes."""
    dims = []
    for i, axes in dynamic.items():
        if not isinstance(i, int) or not 0 <= i < len(example_inputs) or \
                not isinstance(example_inputs[i], torch.Tensor):
            raise TesseraError(f"dynamic names argument {i!r}; give the index of a tensor argument "
                               f"(0..{len(example_inputs) - 1})")
        for axis, spec in axes.items():
            rank = example_inputs[i].dim()
            if not isinstance(axis, int) or not -rank <= axis < rank:
                raise TesseraError(f"dynamic: argument {i} has rank {rank}, no axis {axis!r}")
            axis %= rank
            name = f"arg{i}.{axis}"
            if isinstance(spec, tuple) and len(spec) in (2, 3) and all(isinstance(v, int) for v in spec[:2]):
                low, high = int(spec[0]), int(spec[1])
                buckets = power_of_two_buckets(low, high)
                name = str(spec[2]) if len(spec) == 3 else name
            else:
                buckets = tuple(sorted({int(s) for s in spec}))
                low, high = buckets[0], buckets[-1]
            same = next((d for d in dims if d.symbol == name), None)
            if same is not None and (same.buckets, same.low) != (buckets, low):
                raise TesseraError(f"dynamic: '{name}' has two ranges")
            if same is not None:
                same.uses.append((i, axis))
            else:
                dims.append(TorchDim(name, [(i, axis)], buckets=buckets, low=low, high=high))
    return dims


def dynamo_dims(gm: torch.fx.GraphModule) -> list[TorchDim] | None:
    """The dynamic dims of a graph dynamo captured with symbolic sizes, one per size symbol, with
    the placeholder axes and int placeholders that carry it and its value range. None where a
    size is an expression of symbols (s0 * 2), which padding cannot follow."""
    dims: dict[str, TorchDim] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    def symbol(v: Any) -> str | None:
        expr = v.node.expr
        if not expr.is_Symbol:
            raise ValueError(str(expr))
        name = str(expr)
        if name not in dims:
            vr = v.node.shape_env.var_to_range.get(expr)
            upper = getattr(vr, "upper", None)
            high = int(upper) if upper is not None and getattr(upper, "is_finite", True) and \
                str(upper) not in ("oo", "int_oo") else None
            dims[name] = TorchDim(name, [], high=high)
        return name

    def sym(v: Any) -> bool:  # dynamic=True makes every size a SymInt, the static ones numbers
        return isinstance(v, torch.SymInt) and not v.node.expr.is_number

    try:
        for i, n in enumerate(placeholders):
            v = n.meta.get("example_value")
            if sym(v):
                dims[symbol(v)].ints.append(i)
            elif isinstance(v, torch.Tensor):
                for axis, size in enumerate(v.shape):
                    if sym(size):
                        dims[symbol(size)].uses.append((i, axis))
    except ValueError:
        return None
    if any(not d.uses for d in dims.values()):
        return None  # a size that no tensor carries: nothing to pad
    return list(dims.values())
