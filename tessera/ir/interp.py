"""The NumPy reference interpreter for primitive graphs.

`run` implements each primitive exactly as its comment in `ir/prims.py` says.
It is the reference that every later stage is checked against, so it favours
plain NumPy over cleverness, but it must still run whole models in float64:
broadcasts and fills stay zero-stride views, layout primitives stay views where
NumPy allows, and every intermediate is dropped after its last reader.

Two precisions:
- `exact=False`: every tensor has its declared dtype (bfloat16 is held in float32;
  float16 sums and products accumulate in float32).
- `exact=True`: every float tensor is float64, the high-precision reference of
  `tessera verify`; integer and bool tensors are unchanged. A cast to float16 or bfloat16 keeps
  the float64 value, unless `narrow_casts`: then it rounds to the narrow type (held in float64),
  the graph's own rounding computed exactly around it (the fuzzer's oracle uses both).

OPAQUE nodes run through onnxruntime as a one-node model (`ir/interp_opaque.py`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import torch

from tessera.errors import MalformedModelError, ShapeError, node_ref
from tessera.ir import interp_linear as lin
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType
from tessera.ir.interp_opaque import run_opaque
from tessera.ir.prims import Prim



def _erf(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; torch (a dependency) has one for float16/32/64.
    return torch.special.erf(torch.from_numpy(np.asarray(x, order="C"))).numpy()


@dataclass(frozen=True)
class _Ctx:
    graph: Graph
    exact: bool
    narrow_casts: bool = False

    def np_dtype(self, dt: DType) -> np.dtype:
        """The NumPy dtype a tensor of declared type `dt` is computed in."""
        if self.exact and dt.is_float:
            return np.dtype(np.float64)
        return dt.to_numpy()

    def out_type(self, node: Node, i: int = 0) -> TensorType:
        return self.graph.types[node.outputs[i]]


Kernel = Callable[[_Ctx, Node, Sequence[np.ndarray]], np.ndarray]


def run(graph: Graph, feeds: Mapping[str, np.ndarray], exact: bool = False,
        keep_all: bool = False, narrow_casts: bool = False) -> dict[str, np.ndarray]:
    """Evaluate a primitive graph on `feeds`; return its outputs by name (every
    tensor if `keep_all`). Raises ShapeError if a feed is missing or mistyped."""
    ctx = _Ctx(graph, exact, narrow_casts)
    env: dict[str, np.ndarray] = _check_feeds(ctx, feeds)
    order = graph.topological_order()
    keep = set(graph.outputs)
    last_use: dict[str, int] = {}
    for i, node in enumerate(order):
        for t in node.inputs:
            if t:
                last_use[t] = i
    for name, value in graph.constants.items():
        if name in last_use or name in keep or keep_all:
            env[name] = np.asarray(value).astype(ctx.np_dtype(graph.types[name].dtype), copy=False)
    borrowed = set(graph.inputs) | set(graph.constants)
    with np.errstate(all="ignore"):  # NaN/inf/overflow are values here, not errors
        for i, node in enumerate(order):
            args = [env[t] for t in node.inputs if t] if node.op == Prim.OPAQUE.value \
                else [env[t] for t in node.inputs]
            dying = [] if keep_all else [t for t in dict.fromkeys(node.inputs)
                                         if t and last_use.get(t) == i and t not in keep]
            for t in dying:  # free what no later node reads (args holds it until the node ran)
                env.pop(t, None)
            donor = _donor(ctx, node, args, [t not in borrowed and t in dying for t in node.inputs])
            results = _eval(ctx, node, args, donor)
            del args  # no stray references: they would hide a donor (see _donor)
            env.update((t, v) for t, v in zip(node.outputs, results) if t)
            del results
    names = list(graph.types) if keep_all else graph.outputs
    return {t: _materialize(env[t], t in borrowed) for t in names if t in env}


def _materialize(v: np.ndarray, borrowed: bool) -> np.ndarray:
    """An array the caller owns: views (broadcasts, fills, transposes) become real arrays."""
    if borrowed or not (v.flags.c_contiguous and v.flags.writeable and v.base is None):
        return np.array(v, order="C", copy=True)
    return v


def _check_feeds(ctx: _Ctx, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    env: dict[str, np.ndarray] = {}
    for name in ctx.graph.inputs:
        t = ctx.graph.types[name]
        if name not in feeds:
            raise ShapeError(f"input '{name}' ({t}) is not fed")
        v = np.asarray(feeds[name])
        if tuple(v.shape) != t.shape:
            raise ShapeError(f"input '{name}' has shape {list(v.shape)}, the graph declares {list(t.shape)}")
        if not _compatible(v, t.dtype):
            raise ShapeError(f"input '{name}' has dtype {v.dtype}, the graph declares {t.dtype.value}")
        env[name] = v.astype(ctx.np_dtype(t.dtype), copy=False)
    return env


def _compatible(v: np.ndarray, dt: DType) -> bool:
    """Any float feeds a float input; an integer feed must hold values the declared type can."""
    want = dt.to_numpy()
    if v.dtype == want:
        return True
    if dt.is_float:
        return v.dtype.kind == "f"
    if dt is DType.BOOL or v.dtype.kind not in "iu":
        return False
    info = np.iinfo(want)
    return v.size == 0 or (int(v.min()) >= info.min and int(v.max()) <= info.max)


def _donor(ctx: _Ctx, node: Node, args: list[np.ndarray], dying: list[bool]) -> int | None:
    """The index of an argument the node may overwrite with its result, if any.

    Writing an elementwise result into a dying input saves an allocation: for
    the large tensors of whole models, the page faults of a fresh array cost
    several times the arithmetic. The input must be an array this run made and
    that nothing else sees: no other live tensor and no view of it, which the
    CPython reference count tells (a view holds a reference to its base).
    """
    if node.op not in _INPLACE:
        return None
    t = ctx.out_type(node)
    want = ctx.np_dtype(t.dtype)
    if want.kind != "f" and node.op in (Prim.DIV.value, Prim.POW.value):
        return None  # integer DIV/POW are not plain ufuncs
    for j, ok in enumerate(dying):
        a = args[j] if ok else None
        if (a is not None and node.inputs.count(node.inputs[j]) == 1 and a.dtype == want and a.shape == t.shape
                and a.base is None and a.flags.writeable and a.flags.c_contiguous):
            del a  # our own reference must not count
            if _refcount(args, j) <= _UNSHARED_REFS:
                return j
    return None


def _refcount(args: list[np.ndarray], j: int) -> int:
    return sys.getrefcount(args[j])


# What `_refcount` says of an array that only a list holds (differs between CPython versions).
_UNSHARED_REFS = _refcount([np.empty(1)], 0)


def _eval(ctx: _Ctx, node: Node, args: list[np.ndarray], donor: int | None = None) -> list[np.ndarray]:
    try:
        prim = Prim(node.op)
    except ValueError:
        raise MalformedModelError(f"{node_ref(node.name, node.op)} is not a primitive") from None
    if prim is Prim.OPAQUE:
        types = [ctx.graph.types[t] for t in node.inputs if t]
        outs = run_opaque(ctx.graph, node, args, types, ctx.exact)
        return [_conform(ctx, node, i, o) for i, o in enumerate(outs)]
    if donor is not None:
        return [_conform(ctx, node, 0, _INPLACE[node.op](*args, out=args[donor]))]
    return [_conform(ctx, node, 0, _KERNELS[prim](ctx, node, args))]


def _conform(ctx: _Ctx, node: Node, i: int, value: np.ndarray) -> np.ndarray:
    """Give a result its declared dtype (NumPy may promote) and check its shape."""
    t = ctx.out_type(node, i)
    value = np.asarray(value)
    want = ctx.np_dtype(t.dtype)
    if value.dtype != want:
        value = value.astype(want)
    if value.shape != t.shape:
        raise ShapeError(f"{node_ref(node.name, node.op)}: computed shape {list(value.shape)}, "
                         f"the graph declares {list(t.shape)}")
    return value


# ---- elementwise -------------------------------------------------------------------
def _fill(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    t = ctx.out_type(node)
    # A zero-stride view: fills are usually scalars broadcast to a big shape.
    return np.broadcast_to(np.array(node.attrs["value"], dtype=ctx.np_dtype(t.dtype)), t.shape)


def _cast(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    (x,) = args
    to = DType(node.attrs["dtype"])
    if to is DType.BOOL:
        return x != 0
    if x.dtype.kind == "f" and not to.is_float:
        return np.trunc(x).astype(to.to_numpy())  # ONNX: toward zero
    if to is DType.BFLOAT16 and not ctx.exact:
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)  # the value bfloat16 can hold
    if ctx.exact and ctx.narrow_casts and to in (DType.FLOAT16, DType.BFLOAT16):
        narrow = np.float16 if to is DType.FLOAT16 else ml_dtypes.bfloat16
        return x.astype(narrow).astype(np.float64)  # one rounding, from the float64 value
    return x.astype(ctx.np_dtype(to))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # e**-|x| never overflows; both branches are accurate to the last bit.
    e = np.exp(-np.abs(x))
    p = 1 / (1 + e)
    return np.where(x >= 0, p, e * p)


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "iu":
        return np.divide(x, y)
    # ONNX integer Div truncates toward zero; NumPy's // floors.
    q = np.floor_divide(x, y)
    fix = (np.remainder(x, y) != 0) & ((x < 0) != (y < 0))
    return q + fix.astype(q.dtype)


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "iu":
        return np.power(x, y)
    # NumPy refuses negative integer exponents; x**-k truncates to 0 unless |x| == 1.
    neg = y < 0
    out = np.power(x, np.where(neg, 0, y))
    if neg.any():
        one = np.ones_like(out)
        tiny = np.where(x == 1, one, np.where(x == -1, np.where(y % 2 == 0, one, -one), 0))
        out = np.where(neg, tiny, out)
    return out


_UNARY: dict[Prim, Callable[[np.ndarray], np.ndarray]] = {
    Prim.NEG: np.negative, Prim.ABS: np.abs, Prim.EXP: np.exp, Prim.LOG: np.log, Prim.SQRT: np.sqrt,
    Prim.RECIPROCAL: lambda x: np.divide(np.ones((), x.dtype), x), Prim.TANH: np.tanh,
    Prim.ERF: _erf, Prim.SIGMOID: _sigmoid, Prim.SIN: np.sin, Prim.COS: np.cos, Prim.FLOOR: np.floor,
    Prim.ISNAN: np.isnan, Prim.NOT: np.logical_not,
}
_BINARY: dict[Prim, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Prim.ADD: np.add, Prim.SUB: np.subtract, Prim.MUL: np.multiply, Prim.DIV: _div, Prim.POW: _pow,
    Prim.MOD: np.fmod, Prim.MAX: np.maximum, Prim.MIN: np.minimum,  # both propagate NaN
    Prim.EQUAL: np.equal, Prim.GREATER: np.greater, Prim.LESS: np.less,
    Prim.AND: np.logical_and, Prim.OR: np.logical_or,
}


def _unary(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x = args[0]
    if x.dtype == np.float16 and node.prim in (Prim.ERF,):
        return _UNARY[node.prim](x.astype(np.float32))
    return _UNARY[node.prim](x)


def _binary(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    return _BINARY[node.prim](args[0], args[1])


def _where(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    return np.where(args[0], args[1], args[2])


# ---- reduce / broadcast --------------------------------------------------------------
def _reduce(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x = args[0]
    axes = tuple(node.attrs["axes"])
    if node.prim is Prim.REDUCE_SUM:
        return np.sum(x, axis=axes, keepdims=True, dtype=lin.acc_dtype(x.dtype))
    fn = np.max if node.prim is Prim.REDUCE_MAX else np.min  # both propagate NaN
    return fn(x, axis=axes, keepdims=True)


def _broadcast(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    # A read-only view; consumers materialize it only if they must.
    return np.broadcast_to(args[0], tuple(node.attrs["shape"]))


def _window_reduce(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    a = node.attrs
    return lin.window_reduce(args[0], a["kind"], a["kernel"], a["strides"], a["dilations"], a["pads"])


# ---- layout ------------------------------------------------------------------------
def _transpose(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    return np.transpose(args[0], tuple(node.attrs["perm"]))


def _reshape(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    return np.reshape(args[0], tuple(node.attrs["shape"]))


def _slice(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    index = []
    for start, step, n in zip(node.attrs["starts"], node.attrs["steps"], node.attrs["shape"]):
        if n == 0:
            index.append(slice(0, 0))
            continue
        stop = start + (n - 1) * step + (1 if step > 0 else -1)
        # A stop of -1 would wrap to the end; None means "past index 0" for a negative step.
        index.append(slice(start, stop if stop >= 0 else None, step))
    return args[0][tuple(index)]


def _pad(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x = args[0]
    p = node.attrs["pads"]
    r = x.ndim
    width = [(int(p[i]), int(p[i + r])) for i in range(r)]
    mode = node.attrs["mode"]
    if mode == "constant":
        value = np.array(node.attrs.get("value", 0)).astype(x.dtype)
        return np.pad(x, width, mode="constant", constant_values=value)
    if mode not in ("reflect", "edge"):
        raise MalformedModelError(f"{node_ref(node.name, node.op)}: pad mode {mode!r}")
    return np.pad(x, width, mode=mode)


def _concat(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(list(args), axis=node.attrs["axis"])


def _wrap(indices: np.ndarray, extent: int) -> np.ndarray:
    """Negative indices count from the end (ONNX Gather/GatherElements)."""
    idx = indices.astype(np.int64, copy=False)
    return np.where(idx < 0, idx + extent, idx)


def _gather(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    data, idx = args
    axis = node.attrs["axis"]
    return np.take(data, _wrap(idx, data.shape[axis]), axis=axis)


def _gather_elements(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    data, idx = args
    axis = node.attrs["axis"]
    # ONNX lets the indices be smaller than the data off the axis: read only that corner.
    corner = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(idx.shape))
    return np.take_along_axis(data[corner], _wrap(idx, data.shape[axis]), axis=axis)


# ---- linear ------------------------------------------------------------------------
def _matmul(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    return lin.matmul(args[0], args[1])


def _conv(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    a = node.attrs
    return lin.conv(args[0], args[1], a["strides"], a["pads"], a["dilations"], a["group"])


def _conv_transpose(ctx: _Ctx, node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    a = node.attrs
    return lin.conv_transpose(args[0], args[1], a["strides"], a["pads"], a["dilations"], a["group"],
                              a["output_padding"])


# Elementwise primitives that are one NumPy ufunc on floats: they may write into a dying input.
_INPLACE: dict[str, np.ufunc] = {p.value: f for p, f in {
    Prim.NEG: np.negative, Prim.ABS: np.absolute, Prim.EXP: np.exp, Prim.LOG: np.log, Prim.SQRT: np.sqrt,
    Prim.TANH: np.tanh, Prim.ADD: np.add, Prim.SUB: np.subtract, Prim.MUL: np.multiply,
    Prim.DIV: np.divide, Prim.POW: np.power, Prim.MAX: np.maximum, Prim.MIN: np.minimum,
}.items()}

_KERNELS: dict[Prim, Kernel] = {
    Prim.FILL: _fill, Prim.CAST: _cast, Prim.WHERE: _where,
    **{p: _unary for p in _UNARY}, **{p: _binary for p in _BINARY},
    Prim.REDUCE_SUM: _reduce, Prim.REDUCE_MAX: _reduce, Prim.REDUCE_MIN: _reduce,
    Prim.BROADCAST: _broadcast, Prim.WINDOW_REDUCE: _window_reduce,
    Prim.TRANSPOSE: _transpose, Prim.RESHAPE: _reshape, Prim.SLICE: _slice, Prim.PAD: _pad,
    Prim.CONCAT: _concat, Prim.GATHER: _gather, Prim.GATHER_ELEMENTS: _gather_elements,
    Prim.MATMUL: _matmul, Prim.CONV: _conv, Prim.CONV_TRANSPOSE: _conv_transpose,
}
assert set(_KERNELS) == set(Prim) - {Prim.OPAQUE}, "every primitive needs a kernel"
