"""Compiling an ONNX model for dynamic sizes: `tessera compile --dynamic NAME=DIM:MIN..MAX`.

Each request names an input axis and the sizes it takes. The axis' symbol is its ONNX dim_param
where the model declares one (so every input that carries "seq" follows), else NAME.DIM. The
buckets are powers of two from MIN up to MAX, with MAX the last (`NAME=DIM:S1,S2,...` lists them
instead). One static plan is compiled per combination of buckets, all into one artifact
(`runtime/buckets.py` runs it).

Before compiling, `check_padding` decides per symbol whether a call may run padded: onnxruntime
runs the model at a size between two buckets, and again zero-padded up to the larger bucket, and
the outputs' real part must agree to the fp32 tolerance. The same comparison finds the output axes
that follow each symbol (they are cut back after a padded call). A symbol that fails runs only at
its bucket sizes, and the compile says so.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from tessera.compiler import CompileOptions, CompileResult, compile_model, measured_or_analytical, new_profiler, write_artifacts
from tessera.errors import ShapeError, TesseraError
from tessera.frontend import load as frontend_load
from tessera.frontend.reader import read_model, value_type
from tessera.log import logger
from tessera.runtime.buckets import DynamicDim, bucket_dir, bucket_keys, power_of_two_buckets, write_manifest
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime

_SPEC = re.compile(r"^(?P<name>.+)=(?P<axis>-?\d+):(?:(?P<low>\d+)\.\.(?P<high>\d+)|(?P<list>\d+(?:,\d+)*))$")


@dataclass(frozen=True)
class DynamicRequest:
    """One `--dynamic` spec: input `name`, `axis`, and its sizes (a range, or explicit buckets)."""
    name: str
    axis: int
    low: int
    high: int
    sizes: tuple[int, ...] | None = None  # explicit buckets

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.sizes if self.sizes is not None else power_of_two_buckets(self.low, self.high)


def parse_dynamic(specs: Sequence[str] | None) -> list[DynamicRequest]:
    """`x=0:1..8` (sizes 1 to 8, buckets 1, 2, 4, 8) or `x=0:1,3,8` (these buckets)."""
    out = []
    for spec in specs or []:
        m = _SPEC.match(spec.strip())
        if m is None:
            raise TesseraError(f"--dynamic '{spec}' is not NAME=DIM:MIN..MAX or NAME=DIM:S1,S2,..., "
                               "e.g. input_ids=1:32..128")
        if m["list"]:
            sizes = tuple(sorted({int(s) for s in m["list"].split(",")}))
            low, high = sizes[0], sizes[-1]
        else:
            sizes, low, high = None, int(m["low"]), int(m["high"])
        if low < 1 or high < low:
            raise TesseraError(f"--dynamic '{spec}': sizes must satisfy 1 <= MIN <= MAX")
        out.append(DynamicRequest(m["name"], int(m["axis"]), low, high, sizes))
    return out


def _inputs(model: onnx.ModelProto, label: str) -> dict[str, list[Any]]:
    inits = {i.name for i in model.graph.initializer}
    return {vi.name: value_type(vi, label, "graph input")[0] for vi in model.graph.input if vi.name not in inits}


def resolve(model: onnx.ModelProto, requests: Sequence[DynamicRequest], label: str = "<model>") -> list[DynamicDim]:
    """The dynamic dims the requests name: symbols, every (input, axis) that carries each, buckets."""
    inputs = _inputs(model, label)
    dims: dict[str, DynamicDim] = {}
    for r in requests:
        if r.name not in inputs:
            raise TesseraError(f"{label}: --dynamic names input '{r.name}'; the model's inputs are {sorted(inputs)}")
        shape = inputs[r.name]
        axis = r.axis + len(shape) if r.axis < 0 else r.axis
        if shape == [None] or not 0 <= axis < len(shape):
            raise TesseraError(f"{label}: --dynamic {r.name}={r.axis}: the input has rank "
                               f"{'unknown' if shape == [None] else len(shape)}")
        param = shape[axis] if isinstance(shape[axis], str) and shape[axis] else None
        symbol = param or f"{r.name}.{axis}"
        uses = [(r.name, axis)]
        if param:
            uses = [(n, a) for n, s in inputs.items() for a, d in enumerate(s) if d == param]
        dim = DynamicDim(symbol, tuple(uses), r.buckets, r.low)
        old = dims.get(symbol)
        if old is not None and (old.buckets, old.low) != (dim.buckets, dim.low):
            raise TesseraError(f"{label}: --dynamic gives '{symbol}' two ranges ({old.low}..{old.high} and "
                               f"{dim.low}..{dim.high})")
        if old is not None:
            dim = replace(dim, uses=tuple(dict.fromkeys(old.uses + dim.uses)))
        dims[symbol] = dim
    return list(dims.values())


def dynamic_model(model: onnx.ModelProto, dims: Sequence[DynamicDim]) -> onnx.ModelProto:
    """The model with every dynamic axis declared by its symbol (so onnxruntime runs any size)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        for d in dims:
            for name, axis in d.uses:
                if name == vi.name:
                    dim = vi.type.tensor_type.shape.dim[axis]
                    dim.Clear()
                    dim.dim_param = d.symbol
    return out


def bucket_shapes(model: onnx.ModelProto, dims: Sequence[DynamicDim], key: Sequence[int],
                  fixed: Mapping[str, Sequence[int]], label: str) -> dict[str, tuple[int, ...]]:
    """Full input shapes for one bucket: --input-shape where given, the bucket on dynamic axes."""
    shapes = {}
    for name, declared in _inputs(model, label).items():
        dyn = {a: b for d, b in zip(dims, key) for n, a in d.uses if n == name}
        if not dyn and name not in fixed:
            continue
        base = list(fixed.get(name, declared))
        for a, b in dyn.items():
            base[a] = b
        loose = [i for i, v in enumerate(base) if not isinstance(v, int)]
        if loose:
            raise ShapeError(f"{label}: input '{name}' axis {loose[0]} ({base[loose[0]]}) has no size; "
                             f"give it one with --dynamic {name}={loose[0]}:MIN..MAX or --input-shape")
        shapes[name] = tuple(int(v) for v in base)
    return shapes


@dataclass
class PadCheck:
    """One padding check: `symbol` at `real` run padded to `bucket` (other dims at `key`)."""
    symbol: str
    real: int
    bucket: int
    errors: dict[str, float] = field(default_factory=dict)  # output -> rel L2 of its real part
    axes: dict[str, list[int]] = field(default_factory=dict)  # output -> axes that follow the symbol
    reason: str = ""  # why padding is refused ("" when it passed)

    def as_dict(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "real": self.real, "bucket": self.bucket,
                "rel_l2": {k: float(v) for k, v in self.errors.items()}, "axes": self.axes, "reason": self.reason}


def _pad(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    out = np.zeros(shape, x.dtype)
    out[tuple(slice(0, s) for s in x.shape)] = x
    return out


def check_padding(model: onnx.ModelProto, dims: Sequence[DynamicDim], fixed: Mapping[str, Sequence[int]],
                  label: str, seed: int = 0,
                  reference: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]] | None = None,
                  ) -> tuple[list[DynamicDim], dict[str, list[tuple[int, str]]], list[PadCheck]]:
    """Decide which dims may run padded (module doc). Returns the dims with `pad` set, each
    output's (axis, symbol) pairs to cut back, and the checks made. `reference` runs the model
    (default onnxruntime on `model`)."""
    ref = reference or (lambda feeds: run_onnxruntime(model, feeds))
    smallest = tuple(d.buckets[0] for d in dims)
    checks: list[PadCheck] = []
    out_axes: dict[str, list[tuple[int, str]]] = {}
    result = []
    for i, d in enumerate(dims):
        ok = True
        for b in d.buckets:
            real = d.inside(b)
            if real == b:
                continue  # no size runs padded into this bucket
            key = smallest[:i] + (b,) + smallest[i + 1:]
            check = PadCheck(d.symbol, real, b)
            checks.append(check)
            shapes = bucket_shapes(model, dims, key, fixed, label)
            real_shapes = {n: tuple(real if (n, a) in d.uses else s for a, s in enumerate(shape))
                           for n, shape in shapes.items()}
            feeds = random_inputs(frontend_load(model, real_shapes).graph, seed)
            want = ref(feeds)
            got = ref({k: _pad(v, shapes.get(k, v.shape)) for k, v in feeds.items()})
            for name, y in want.items():
                big = np.asarray(got[name])
                axes = [a for a, (s, t) in enumerate(zip(y.shape, big.shape)) if s != t]
                if big.ndim != np.ndim(y) or any((y.shape[a], big.shape[a]) != (real, b) for a in axes):
                    check.reason = (f"output '{name}' has shape {list(y.shape)} at {d.symbol}={real} and "
                                    f"{list(big.shape)} at {b}: it cannot be cut back to the real size")
                    break
                check.axes[name] = axes
                cut = big[tuple(slice(0, s) for s in y.shape)]
                check.errors[name] = rel_l2(cut, y)
                if check.errors[name] > TOLERANCE["fp32"]:
                    check.reason = (f"zero padding {d.symbol} from {real} to {b} changes output '{name}' "
                                    f"(rel L2 {check.errors[name]:.2e})")
                    break
            if check.reason:
                ok = False
                logger.warning("%s: %s; only the sizes %s of %s will run", label, check.reason, list(d.buckets),
                               d.symbol)
                break
            for name, axes in check.axes.items():
                pairs = out_axes.setdefault(name, [])
                pairs.extend((a, d.symbol) for a in axes if (a, d.symbol) not in pairs)
        result.append(replace(d, pad=ok))
    return result, out_axes, checks


@dataclass
class BucketedCompile:
    dims: list[DynamicDim]
    outputs: dict[str, list[tuple[int, str]]]
    checks: list[PadCheck]
    model: onnx.ModelProto  # the source with its dynamic axes declared symbolic
    results: dict[tuple[int, ...], CompileResult]


def compile_buckets(source: Any, options: CompileOptions, requests: Sequence[DynamicRequest],
                    on_bucket: Callable[[dict[str, int], CompileResult], None] | None = None,
                    **kw: Any) -> BucketedCompile:
    """One plan per bucket of `requests`' dims (`kw` goes to each `compile_model`). Measured
    compiles share one profiler and one tuning database, so a kernel two buckets share is timed once."""
    model, label = read_model(source)
    dims = resolve(model, requests, label)
    if not dims:
        raise TesseraError(f"{label}: no --dynamic dims to compile buckets for")
    model = dynamic_model(model, dims)
    fixed = dict(options.input_shapes or {})
    dims, outputs, checks = check_padding(model, dims, fixed, label)
    given = kw.pop("profiler", None)
    profiler = given or (new_profiler(options) if measured_or_analytical(options) == "measured" else None)
    results = {}
    try:
        for key in bucket_keys(dims):
            opts = replace(options, input_shapes=bucket_shapes(model, dims, key, fixed, label))
            results[key] = compile_model(model, opts, profiler=profiler, **kw)
            if on_bucket is not None:
                on_bucket(dict(zip((d.symbol for d in dims), key)), results[key])
    finally:
        close = getattr(profiler, "close", None)
        if given is None and close is not None:
            close()
    return BucketedCompile(dims, outputs, checks, model, results)


def write_buckets(compiled: BucketedCompile, out: Path) -> None:
    """Every bucket's artifact under OUT, then OUT/buckets.json. The buckets share one source
    model, stored once (hard links where the file system has them)."""
    out.mkdir(parents=True, exist_ok=True)
    keep = {bucket_dir(compiled.dims, key) for key in compiled.results}
    for old in out.glob("bucket_*"):  # an earlier compile's other buckets
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old)
    (out / "artifact.json").unlink(missing_ok=True)  # an earlier single-plan compile into this folder
    first, first_hash = None, None
    for key, result in compiled.results.items():
        sub = out / bucket_dir(compiled.dims, key)
        write_artifacts(result, sub)
        onnx_file = sub / "model.onnx"
        digest = json.loads((sub / "artifact.json").read_text())["files"]["model.onnx"]  # hashed as written
        if first is None:
            first, first_hash = onnx_file, digest
        elif digest == first_hash:
            onnx_file.unlink()
            try:
                onnx_file.hardlink_to(first)
            except OSError:  # no hard links here: keep a copy
                onnx_file.write_bytes(first.read_bytes())
    any_result = next(iter(compiled.results.values()))
    write_manifest(out, compiled.dims, compiled.outputs, any_result.loaded.graph.inputs,
                   any_result.loaded.graph.outputs,
                   [c.as_dict() for c in compiled.checks])
