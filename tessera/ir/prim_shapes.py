"""Type rules of the primitives: the output type of a node from its input types.

Each rule also checks the normal forms of `ir/prims.py` and raises
`ShapeError` with a message that names what is wrong; the caller adds which
node it was.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tessera.errors import ShapeError
from tessera.ir.dtype import DType
from tessera.ir.graph import TensorType
from tessera.ir.prims import BINARY, COMPARISONS, REDUCTIONS, UNARY, Prim

Rule = Callable[[Sequence[TensorType], Mapping[str, Any]], TensorType]


def window_out(size: int, k: int, stride: int, dil: int, pb: int, pe: int) -> int:
    """Output extent of a sliding window (conv, pooling) with explicit pads."""
    span = dil * (k - 1) + 1
    out = (size + pb + pe - span) // stride + 1
    if out <= 0:
        raise ShapeError(f"window {k} (dilation {dil}) does not fit in extent {size} with pads {pb},{pe}")
    return out


def infer(prim: Prim, ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    """Output type of `prim` applied to `ins`."""
    if prim is Prim.OPAQUE:
        raise ShapeError("opaque nodes carry their output types; they have no rule")
    return _RULES[prim](ins, attrs)


def _same_shapes(ins: Sequence[TensorType], what: str) -> None:
    shapes = {t.shape for t in ins}
    if len(shapes) > 1:
        raise ShapeError(f"{what} operands must have equal shapes (broadcast explicitly), got "
                         + ", ".join(str(list(t.shape)) for t in ins))


def _unary(ins, attrs):
    (x,) = ins
    return x


def _binary(ins, attrs):
    x, y = ins
    _same_shapes(ins, "elementwise")
    if x.dtype != y.dtype:
        raise ShapeError(f"elementwise operands must have one dtype, got {x.dtype.value} and {y.dtype.value}")
    return x


def _reduce(ins, attrs):
    (x,) = ins
    axes = attrs["axes"]
    if any(a < 0 or a >= x.rank for a in axes) or list(axes) != sorted(set(axes)):
        raise ShapeError(f"reduction axes {list(axes)} invalid for rank {x.rank}")
    return TensorType(tuple(1 if i in axes else d for i, d in enumerate(x.shape)), x.dtype)


def _broadcast(ins, attrs):
    (x,) = ins
    shape = tuple(attrs["shape"])
    if len(shape) != x.rank or any(s != d and s != 1 for s, d in zip(x.shape, shape)):
        raise ShapeError(f"cannot broadcast {list(x.shape)} to {list(shape)}")
    return TensorType(shape, x.dtype)


def _window(ins, attrs):
    (x,) = ins
    k, s, d, p = attrs["kernel"], attrs["strides"], attrs["dilations"], attrs["pads"]
    n = len(k)
    lead = x.shape[: x.rank - n]
    spatial = x.shape[x.rank - n:]
    out = tuple(window_out(spatial[i], k[i], s[i], d[i], p[i], p[i + n]) for i in range(n))
    return TensorType(lead + out, x.dtype)


def _transpose(ins, attrs):
    (x,) = ins
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {list(perm)} is not a permutation of rank {x.rank}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _reshape(ins, attrs):
    (x,) = ins
    shape = tuple(attrs["shape"])
    t = TensorType(shape, x.dtype)
    if any(d < 0 for d in shape) or t.numel != x.numel:
        raise ShapeError(f"cannot reshape {list(x.shape)} to {list(shape)}")
    return t


def _slice(ins, attrs):
    (x,) = ins
    starts, steps, shape = attrs["starts"], attrs["steps"], attrs["shape"]
    if not (len(starts) == len(steps) == len(shape) == x.rank):
        raise ShapeError("slice needs starts, steps and shape for every dim")
    for d, (st, sp, n) in enumerate(zip(starts, steps, shape)):
        last = st + (n - 1) * sp
        if sp == 0 or n < 0 or (n > 0 and not (0 <= st < x.shape[d] and 0 <= last < x.shape[d])):
            raise ShapeError(f"slice start {st} step {sp} count {n} leaves dim {d} of extent {x.shape[d]}")
    return TensorType(tuple(shape), x.dtype)


def _pad(ins, attrs):
    (x,) = ins
    p = attrs["pads"]
    if len(p) != 2 * x.rank or any(v < 0 for v in p):
        raise ShapeError(f"pads {list(p)} invalid for rank {x.rank}")
    if attrs["mode"] == "reflect" and any(p[i] >= x.shape[i] or p[i + x.rank] >= x.shape[i] for i in range(x.rank)):
        raise ShapeError(f"reflect pads {list(p)} must be smaller than the dims {list(x.shape)}")
    return TensorType(tuple(x.shape[i] + p[i] + p[i + x.rank] for i in range(x.rank)), x.dtype)


def _concat(ins, attrs):
    a = attrs["axis"]
    x = ins[0]
    for t in ins[1:]:
        if t.rank != x.rank or t.dtype != x.dtype or any(
                t.shape[i] != x.shape[i] for i in range(x.rank) if i != a):
            raise ShapeError("concat operands differ off the axis: " + ", ".join(str(t) for t in ins))
    shape = list(x.shape)
    shape[a] = sum(t.shape[a] for t in ins)
    return TensorType(tuple(shape), x.dtype)


def _gather(ins, attrs):
    data, idx = ins
    a = attrs["axis"]
    if idx.dtype not in (DType.INT64, DType.INT32):
        raise ShapeError(f"gather indices must be int32/int64, got {idx.dtype.value}")
    return TensorType(data.shape[:a] + idx.shape + data.shape[a + 1:], data.dtype)


def _gather_elements(ins, attrs):
    data, idx = ins
    if idx.rank != data.rank:
        raise ShapeError("gather_elements indices must have the data's rank")
    return TensorType(idx.shape, data.dtype)


def _matmul(ins, attrs):
    a, b = ins
    if a.rank < 2 or a.rank != b.rank or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul needs [..., m, k] @ [..., k, n] with equal batch dims, got {list(a.shape)} @ {list(b.shape)}")
    if a.dtype != b.dtype:
        raise ShapeError("matmul operands must have one dtype")
    return TensorType(a.shape[:-1] + (b.shape[-1],), a.dtype)


def _conv(ins, attrs):
    x, w = ins
    g = attrs["group"]
    n = x.rank - 2
    if w.rank != x.rank or x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise ShapeError(f"conv weight {list(w.shape)} does not fit input {list(x.shape)} with group {g}")
    k, s, d, p = w.shape[2:], attrs["strides"], attrs["dilations"], attrs["pads"]
    out = tuple(window_out(x.shape[2 + i], k[i], s[i], d[i], p[i], p[i + n]) for i in range(n))
    return TensorType((x.shape[0], w.shape[0]) + out, x.dtype)


def _conv_transpose(ins, attrs):
    x, w = ins
    g = attrs["group"]
    n = x.rank - 2
    if w.rank != x.rank or x.shape[1] != w.shape[0]:
        raise ShapeError(f"conv_transpose weight {list(w.shape)} does not fit input {list(x.shape)}")
    k, s, d, p, op = w.shape[2:], attrs["strides"], attrs["dilations"], attrs["pads"], attrs["output_padding"]
    out = tuple(s[i] * (x.shape[2 + i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - p[i] - p[i + n] for i in range(n))
    if any(o <= 0 for o in out):
        raise ShapeError(f"conv_transpose output extent {list(out)} is empty")
    return TensorType((x.shape[0], w.shape[1] * g) + out, x.dtype)


def _fill(ins, attrs):
    return TensorType(tuple(attrs["shape"]), DType(attrs["dtype"]))


def _cast(ins, attrs):
    (x,) = ins
    return TensorType(x.shape, DType(attrs["dtype"]))


def _where(ins, attrs):
    c, x, y = ins
    _same_shapes(ins, "where")
    if c.dtype is not DType.BOOL or x.dtype != y.dtype:
        raise ShapeError("where needs a bool condition and two operands of one dtype")
    return x


def _bool_of(rule: Rule) -> Rule:
    return lambda ins, attrs: TensorType(rule(ins, attrs).shape, DType.BOOL)


_RULES: dict[Prim, Rule] = {
    Prim.FILL: _fill, Prim.CAST: _cast, Prim.WHERE: _where,
    Prim.BROADCAST: _broadcast, Prim.WINDOW_REDUCE: _window,
    Prim.TRANSPOSE: _transpose, Prim.RESHAPE: _reshape, Prim.SLICE: _slice, Prim.PAD: _pad,
    Prim.CONCAT: _concat, Prim.GATHER: _gather, Prim.GATHER_ELEMENTS: _gather_elements,
    Prim.MATMUL: _matmul, Prim.CONV: _conv, Prim.CONV_TRANSPOSE: _conv_transpose,
}
for _p in UNARY - {Prim.CAST}:
    _RULES[_p] = _bool_of(_unary) if _p in COMPARISONS else _unary
for _p in BINARY:
    _RULES[_p] = _bool_of(_binary) if _p in COMPARISONS else _binary
for _p in REDUCTIONS:
    _RULES[_p] = _reduce
