"""Rotary positional embedding (ONNX RotaryEmbedding, opset 23).

The rotation is pure layout plus two products and a sum, written as the Llama and GPT-J exports write
it: x * cos + rotate(x) * sin over the rotated part of each head, where rotate is rotate_half
(concat(-x2, x1) of the contiguous halves) or, interleaved, rotate_every_two (stack(-x_odd, x_even)
flattened), and the cos/sin rows (a GATHER of the caches by position_ids; runtime int64 indices are
fine) are repeated to the part's width the same way. Each element is then x1 * cos - x2 * sin or
x2 * cos + x1 * sin with the same roundings as the spec's algorithm, and a GEMM template before the
rotation can read rotate(x) from its accumulator's registers (`codegen/rotary.py`).
"""
from __future__ import annotations

from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, float_dtype_check, register


def _rotate(b: PrimBuilder, x: str, interleaved: bool) -> str:
    """rotate_half(x) = concat(-x[..., h:], x[..., :h]), or interleaved rotate_every_two(x) =
    stack(-x[..., 1::2], x[..., ::2], -1) flattened, over x's last axis of 2h values."""
    shape = b.shape(x)
    half = shape[-1] // 2
    last = len(shape) - 1
    if not interleaved:
        x1, x2 = b.slice_axis(x, last, 0, half), b.slice_axis(x, last, half, half)
        return b.concat([b.emit(Prim.NEG, [x2]), x1], last)
    part = shape[:-1] + (half,)
    even, odd = (b.slice(x, [0] * last + [start], [1] * last + [2], part) for start in (0, 1))
    cols = [b.reshape(t, part + (1,)) for t in (b.emit(Prim.NEG, [odd]), even)]
    return b.reshape(b.concat(cols, last + 1), shape)


def _widen(b: PrimBuilder, t: str, interleaved: bool) -> str:
    """cos or sin rows of h values repeated to the rotated part's 2h: [c, c] or, interleaved, each value
    twice. A broadcast over a new axis of 2 (before the last, or after it) and a reshape, not a concat:
    a GEMM template's epilogue reads them at its own indices."""
    shape = b.shape(t)
    two = shape + (1,) if interleaved else shape[:-1] + (1, shape[-1])
    wide = two[:-1] + (2,) if interleaved else shape[:-1] + (2, shape[-1])
    return b.reshape(b.broadcast_to(b.reshape(t, two), wide), shape[:-1] + (2 * shape[-1],))


@register("RotaryEmbedding", since=23)
def rotary_embedding(ctx: OpCtx) -> list[str]:
    """RotaryEmbedding as GATHER (when position_ids is given), RESHAPE/BROADCAST of the
    cos/sin rows to the rotated part's width, SLICE/NEG/CONCAT of the rotation, MUL/ADD.

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

    # Repeated to the rotated part's width (`_widen`), then one BROADCAST each over the heads: a kernel
    # that cuts here writes the rows once, not once per head.
    interleaved = bool(ctx.attr("interleaved", 0))
    part = list(b.shape(xv))
    part[-1] = rotary
    view = [batch, seq, rotary]
    view.insert(head_axis, 1)
    cos, sin = (b.broadcast_to(b.reshape(_widen(b, t, interleaved), view), part) for t in (cos, sin))

    xr = xv if rotary == head else b.slice_axis(xv, 3, 0, rotary)
    out = b.emit(Prim.ADD, [b.mul(xr, cos), b.mul(_rotate(b, xr, interleaved), sin)])
    if rotary < head:
        out = b.concat([out, b.slice_axis(xv, 3, rotary, head - rotary)], 3)
    return [b.reshape(out, shape)]
