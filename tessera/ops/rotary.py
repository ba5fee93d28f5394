"""Rotary positional embedding (ONNX RotaryEmbedding, opset 23).

The rotation is pure layout plus four products: the cos/sin rows are a GATHER
of the caches by position_ids (runtime int64 indices are fine), the rotated
part of each head splits into two halves by SLICE (contiguous halves, or every
other element for the interleaved form), and the halves re-join by CONCAT.
"""
from __future__ import annotations

from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, float_dtype_check, register


def _halves(b: PrimBuilder, x: str, half: int, interleaved: bool) -> tuple[str, str]:
    """x[..., :2*half] split into (x1, x2): the two halves, or the even and odd elements.
    Both slice x itself, so the pass-through tail is never copied."""
    shape = list(b.shape(x))
    shape[-1] = half
    zeros = [0] * (len(shape) - 1)
    if interleaved:
        steps = [1] * (len(shape) - 1) + [2]
        return b.slice(x, zeros + [0], steps, shape), b.slice(x, zeros + [1], steps, shape)
    return b.slice_axis(x, len(shape) - 1, 0, half), b.slice_axis(x, len(shape) - 1, half, half)


def _join(b: PrimBuilder, real: str, imag: str, interleaved: bool) -> str:
    """Inverse of `_halves`: concatenated halves, or real/imag pairs interleaved."""
    if not interleaved:
        return b.concat([real, imag], b.rank(real) - 1)
    # Stack on a new last axis, then fold it in: [..., half, 2] -> [..., rotary].
    shape = b.shape(real)
    pairs = b.concat([b.reshape(t, shape + (1,)) for t in (real, imag)], len(shape))
    return b.reshape(pairs, shape[:-1] + (2 * shape[-1],))


@register("RotaryEmbedding", since=23)
def rotary_embedding(ctx: OpCtx) -> list[str]:
    """RotaryEmbedding as GATHER (when position_ids is given), RESHAPE/BROADCAST of the
    cos/sin rows, SLICE of the two halves, MUL/SUB/ADD, and CONCAT back together.

    4-D X [B, H, S, D] is rotated in place; 3-D X [B, S, H*D] is viewed as [B, S, H, D]
    (no transpose: the cos/sin rows get their size-1 head axis where the heads are).
    Unsupported (left opaque): non-float X, empty tensors, and an odd rotary dim, which
    the spec's algorithm cannot split in two.
    """
    b = ctx.b
    x, cos, sin, pos = ctx.input(0), ctx.input(1), ctx.input(2), ctx.optional(3)
    dt = float_dtype_check(ctx, x)
    if b.dtype(cos) != dt or b.dtype(sin) != dt:
        raise ctx.fail(f"cos_cache and sin_cache must be {dt.value} like X")
    if b.shape(cos) != b.shape(sin):
        raise ctx.fail(f"cos_cache {list(b.shape(cos))} and sin_cache {list(b.shape(sin))} differ in shape")
    shape = b.shape(x)
    if any(d == 0 for d in shape + b.shape(cos)):
        raise Unsupported("RotaryEmbedding on an empty tensor")
    if len(shape) == 4:
        batch, heads, seq, head = shape
        xv, head_axis = x, 1
    elif len(shape) == 3:
        heads = int(ctx.attr("num_heads", 0))
        batch, seq, hidden = shape
        if heads <= 0 or hidden % heads:
            raise ctx.fail(f"3-D input needs num_heads dividing the hidden size {hidden}, got {heads}")
        head = hidden // heads
        xv, head_axis = b.reshape(x, (batch, seq, heads, head)), 2
    else:
        raise ctx.fail(f"X must be 3-D or 4-D, got shape {list(shape)}")

    rotary = int(ctx.attr("rotary_embedding_dim", 0)) or head
    if not 0 < rotary <= head:
        raise ctx.fail(f"rotary_embedding_dim {rotary} is outside [1, head_size {head}]")
    if rotary % 2:
        raise Unsupported(f"odd rotary dim {rotary}")
    half = rotary // 2

    # cos/sin rows for each (batch, position): [B, S, half].
    if pos is not None:
        if b.dtype(pos) not in (DType.INT64, DType.INT32) or b.shape(pos) != (batch, seq):
            raise ctx.fail(f"position_ids must be integer [{batch}, {seq}], got "
                           f"{b.dtype(pos).value} {list(b.shape(pos))}")
        if b.rank(cos) != 2 or b.shape(cos)[1] != half:
            raise ctx.fail(f"with position_ids the caches must be [max_pos, {half}], got {list(b.shape(cos))}")
        cos, sin = b.gather(cos, pos, 0), b.gather(sin, pos, 0)
    elif b.shape(cos) != (batch, seq, half):
        raise ctx.fail(f"without position_ids the caches must be [{batch}, {seq}, {half}], got {list(b.shape(cos))}")

    # One BROADCAST each over the heads, shared by both products that use it.
    part = list(b.shape(xv))
    part[-1] = half
    view = [batch, seq, half]
    view.insert(head_axis, 1)
    cos, sin = (b.broadcast_to(b.reshape(t, view), part) for t in (cos, sin))

    interleaved = bool(ctx.attr("interleaved", 0))
    x1, x2 = _halves(b, xv, half, interleaved)
    real = b.emit(Prim.SUB, [b.mul(x1, cos), b.mul(x2, sin)])
    imag = b.emit(Prim.ADD, [b.mul(x1, sin), b.mul(x2, cos)])
    out = _join(b, real, imag, interleaved)
    if rotary < head:
        out = b.concat([out, b.slice_axis(xv, 3, rotary, head - rotary)], 3)
    return [b.reshape(out, shape)]
