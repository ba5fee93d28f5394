"""Operators that place values by position: ScatterND and ScatterElements with constant indices,
Col2Im (sliding blocks summed back into an image), Trilu and OneHot.

Where each value lands is known at compile time (constant indices, shapes and attributes), so every
rule emits layout primitives (SLICE, PAD, CONCAT, GATHER, RESHAPE, TRANSPOSE) plus a WHERE over a
constant mask and the elementwise primitive a reduction needs. Computed scatter indices stay opaque.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.prims import Prim
from tessera.ops.layout import const_indices, nonempty, select
from tessera.ops.registry import OpCtx, Unsupported, register


# ---- scattering ------------------------------------------------------------------------------
# Scatters lower only with constant indices: which element each update lands on is then known here,
# and the scatter becomes a gather of the updates placed over the data. Computed indices stay opaque.
SCATTER_TABLE_LIMIT = 1 << 22  # elements of the constant position tables one scatter may add
_COMBINE = {"add": Prim.ADD, "mul": Prim.MUL}


def _reduction(ctx: OpCtx, x: str) -> str:
    """The reduction attribute (opset 16; max and min from 18), checked against x's dtype."""
    red = str(ctx.attr("reduction", "none")) if ctx.opset >= 16 else "none"
    if red not in ("none", "add", "mul") + (("max", "min") if ctx.opset >= 18 else ()):
        raise ctx.fail(f"unknown reduction '{red}' at opset {ctx.opset}")
    if red != "none" and ctx.b.dtype(x) is DType.BOOL:
        raise Unsupported(f"{ctx.node.op} reduction '{red}' on bool")
    return red


def _scatter_indices(ctx: OpCtx, idx: str) -> np.ndarray:
    v = ctx.b.value(idx)
    if v is None:
        raise Unsupported(f"{ctx.node.op} indices '{idx}' are computed, not a constant: only constant "
                          "indices are lowered")
    return np.asarray(v, dtype=np.int64)


def _paste(b: PrimBuilder, x: str, starts: Sequence[int], block: str) -> str:
    """x with the block of its elements at `starts` replaced by `block`: a CONCAT of x's slices around
    it per axis the block does not span, innermost axis first."""
    shape, box = b.shape(x), b.shape(block)
    r = len(shape)
    y = block
    for a in reversed(range(r)):
        s, n, d = starts[a], box[a], shape[a]
        if n == d:
            continue
        # y spans x fully on the axes after a, and the block on those before it
        lo = [*starts[:a], *([0] * (r - a))]
        ext = [*box[:a], s, *shape[a + 1:]]
        parts = [b.slice(x, lo, [1] * r, ext)] if s else []
        parts.append(y)
        if s + n < d:
            lo[a], ext[a] = s + n, d - s - n
            parts.append(b.slice(x, lo, [1] * r, ext))
        y = b.concat(parts, a)
    return y


def _scatter(ctx: OpCtx, x: str, upd: str, grid: Sequence[int], targets: np.ndarray, red: str) -> str:
    """x, whose leading axes `grid` hold cells (each a slice of its trailing axes), with row j of the
    updates (upd as [len(targets), *cell]) written to, or combined by `red` into, flat cell targets[j].

    Cells written exactly once that fill a box become the updates' rows (reordered by `select` if need
    be) CONCATenated with x's slices around the box. Otherwise every cell reads its update through a
    constant position table and a constant mask picks it over x: one GATHER and WHERE per layer of
    duplicates, the j-th update of each cell in layer j, in index order as onnxruntime applies them."""
    b = ctx.b
    shape = b.shape(x)
    cell = list(shape[len(grid):])
    m = len(targets)
    if m == 0:
        return x
    rows = b.reshape(upd, [m, *cell])

    def combine(old: str, new: str) -> str:
        if red in ("max", "min"):  # onnxruntime's std::max(new, old): NaN data takes the update, a NaN update stays
            first, second = (new, old) if red == "max" else (old, new)
            return b.emit(Prim.WHERE, [b.emit(Prim.LESS, [first, second]), old, new])
        return new if red == "none" else b.emit(_COMBINE[red], [old, new])

    counts = np.unique(targets, return_counts=True)[1]
    layers = int(counts.max())
    if layers > 1 and red == "none":
        raise Unsupported(f"{ctx.node.op} writes one element twice (duplicate indices): ONNX leaves the "
                          "result undefined")
    if layers == 1:
        coords = np.stack(np.unravel_index(targets, grid))
        lo, hi = coords.min(axis=1), coords.max(axis=1) + 1
        box = [int(d) for d in hi - lo]
        if math.prod(box) == m:  # m distinct cells in a box of m: they fill it
            at = np.ravel_multi_index(tuple(coords - lo[:, None]), box)
            src = np.empty(m, np.int64)
            src[at] = np.arange(m)  # the update row for each cell of the box, row-major
            vals = b.reshape(select(b, rows, {0: src}), [*box, *cell])
            starts = [*(int(s) for s in lo), *([0] * len(cell))]
            if red != "none":
                vals = combine(b.slice(x, starts, [1] * len(shape), b.shape(vals)), vals)
            return _paste(b, x, starts, vals)
    n = math.prod(grid)
    if n * layers > SCATTER_TABLE_LIMIT:
        raise Unsupported(f"{ctx.node.op} would need position tables of {n} x {layers} elements "
                          f"(limit {SCATTER_TABLE_LIMIT})")
    order = np.argsort(targets, kind="stable")
    ordered = targets[order]
    rank = np.arange(m) - np.searchsorted(ordered, ordered)  # occurrence number of each update
    y = b.reshape(x, [n, *cell])
    dt = b.dtype(x)
    if dt is DType.BOOL:  # onnxruntime has no bool Where (verify.py runs primitive graphs there)
        rows, y = b.cast(rows, DType.UINT8), b.cast(y, DType.UINT8)
    for j in range(layers):
        src = order[rank == j]
        pos = np.zeros(n, np.int64)  # unwritten cells read row 0, which the mask drops
        pos[targets[src]] = src
        mask = np.zeros(n, bool)
        mask[targets[src]] = True
        mask_t = b.const(mask.reshape([n, *([1] * len(cell))]), "scatter_mask")  # broadcast over the cell
        y = b.where(mask_t, combine(y, select(b, rows, {0: pos})), y)
    return b.reshape(b.cast(y, dt), shape)


@register("ScatterND", since=11)
def scatter_nd(ctx: OpCtx) -> list[str]:
    """Each index tuple (the indices' last axis, k long) names a slice of the data, data.shape[k:],
    which its row of the updates replaces or is combined into (`reduction`). The first k data axes
    are the cells of `_scatter`: a box of cells written once (slice assignment) is a CONCAT of the
    updates and data slices; any other pattern a GATHER of the updates by a constant table of
    prod(data.shape[:k]) positions and a WHERE. Stays opaque: computed indices, duplicate tuples
    without a reduction, reductions on bool, k = 0, tables over SCATTER_TABLE_LIMIT."""
    b, x, idx, upd = ctx.b, ctx.input(0), ctx.input(1), ctx.input(2)
    shape, ishape = b.shape(x), b.shape(idx)
    if not ishape or ishape[-1] > len(shape):
        raise ctx.fail(f"indices {list(ishape)} do not fit data {list(shape)}")
    k = ishape[-1]
    if b.shape(upd) != (*ishape[:-1], *shape[k:]) or b.dtype(upd) != b.dtype(x):
        raise ctx.fail(f"updates {b.type(upd)} do not fit data {b.type(x)} and indices {list(ishape)}")
    if k == 0:
        raise Unsupported("ScatterND with empty index tuples")
    red = _reduction(ctx, x)
    nonempty(ctx, shape)
    v = _scatter_indices(ctx, idx).reshape(-1, k)
    grid = shape[:k]
    cols = [const_indices(ctx, v[:, j], d) for j, d in enumerate(grid)]
    return [_scatter(ctx, x, upd, grid, np.ravel_multi_index(tuple(cols), grid), red)]


@register("ScatterElements", since=11)
def scatter_elements(ctx: OpCtx) -> list[str]:
    """updates[p] goes to the data element p with p[axis] replaced by indices[p] (replacing it, or
    combined by `reduction`); every element is a cell of `_scatter`: a box written once is a CONCAT of
    the (reordered) updates and data slices, any other pattern a GATHER by a constant table of the
    data's size and a WHERE. Stays opaque: computed indices, an element written twice without a
    reduction, reductions on bool, tables over SCATTER_TABLE_LIMIT."""
    b, x, idx, upd = ctx.b, ctx.input(0), ctx.input(1), ctx.input(2)
    shape, ishape = b.shape(x), b.shape(idx)
    if not shape or len(ishape) != len(shape) or b.shape(upd) != ishape or b.dtype(upd) != b.dtype(x):
        raise ctx.fail(f"indices {list(ishape)} and updates {b.type(upd)} do not fit data {b.type(x)}")
    a = ctx.axis(int(ctx.attr("axis", 0)), len(shape))
    if any(i > d for j, (i, d) in enumerate(zip(ishape, shape)) if j != a):
        raise ctx.fail(f"indices {list(ishape)} exceed data {list(shape)} off the axis")
    red = _reduction(ctx, x)
    nonempty(ctx, shape)
    coords = list(np.indices(ishape, dtype=np.int64, sparse=True))
    coords[a] = const_indices(ctx, _scatter_indices(ctx, idx), shape[a])
    targets = np.ravel_multi_index(tuple(np.broadcast_arrays(*coords)), shape).reshape(-1)
    return [_scatter(ctx, x, upd, shape, targets, red)]


# ---- Col2Im (F.fold) -------------------------------------------------------------------------
def _place(b: PrimBuilder, x: str, axis: int, offset: int, size: int) -> str | None:
    """x's elements along `axis` moved to start at `offset` in an axis of `size` (zeros around them;
    what falls outside is cut off), or None where nothing of x lands inside."""
    n = b.shape(x)[axis]
    lo, hi = max(0, -offset), min(n, size - offset)
    if hi <= lo:
        return None
    part = b.slice_axis(x, axis, lo, hi - lo)
    pads = [0] * (2 * b.rank(x))
    pads[axis], pads[b.rank(x) + axis] = offset + lo, size - offset - hi
    return b.pad(part, pads)


@register("Col2Im", since=18)
def col2im(ctx: OpCtx) -> list[str]:
    """Sliding blocks summed back into an image (torch's fold): column (c, k...) of block l holds the
    pixel at l * stride + k * dilation - pad. Blocks that tile the image exactly (stride = block, no
    dilation or padding: MobileViTv2's patches) are a reshape and a transpose; otherwise each kernel
    offset's plane is spread by the stride (a zero-padded axis reshaped), moved to its offset, and the
    planes are added."""
    b, x = ctx.b, ctx.input(0)
    image, block = ctx.ints(1), ctx.ints(2)
    if image is None or block is None or len(block) != len(image):
        raise ctx.fail("image_shape and block_shape must be constants of one length")
    r = len(image)
    dil = [int(v) for v in ctx.attr("dilations", [1] * r)]
    stride = [int(v) for v in ctx.attr("strides", [1] * r)]
    pads = [int(v) for v in ctx.attr("pads", [0] * 2 * r)]
    n, ck, length = b.shape(x)
    kn = math.prod(block)
    if ck % kn:
        raise ctx.fail(f"input's {ck} columns are not a multiple of the block's {kn} elements")
    c = ck // kn
    blocks = [(image[i] + pads[i] + pads[r + i] - dil[i] * (block[i] - 1) - 1) // stride[i] + 1 for i in range(r)]
    if math.prod(blocks) != length or min(blocks) < 1:
        raise ctx.fail(f"{length} blocks do not fit image {image} (block {block}, strides {stride}, pads {pads}, "
                       f"dilations {dil}: {blocks})")
    planes = b.reshape(x, [n, c, *block, *blocks])  # [N, C, k..., L...]
    if stride == block and dil == [1] * r and not any(pads) and all(blocks[i] * block[i] == image[i] for i in range(r)):
        perm = [0, 1] + [a for i in range(r) for a in (2 + r + i, 2 + i)]  # [N, C, L0, k0, L1, k1, ...]
        return [b.reshape(b.transpose(planes, perm), [n, c, *image])]
    total = None
    for k in np.ndindex(*block):  # this offset's plane [N, C, L...]
        p = b.reshape(b.slice(planes, [0, 0, *k, *([0] * r)], [1] * (2 + 2 * r), [n, c, *([1] * r), *blocks]),
                      [n, c, *blocks])
        for i in range(r):
            a = 2 + i
            if stride[i] > 1:  # spread: every block's value, then stride - 1 zeros
                shape = b.shape(p)
                q = b.reshape(p, [*shape[:a + 1], 1, *shape[a + 1:]])
                q = b.pad(q, [0] * (a + 1) + [0] * (b.rank(q) - a - 1) + [0] * (a + 1) + [stride[i] - 1] +
                          [0] * (b.rank(q) - a - 2))
                p = b.reshape(q, [*shape[:a], shape[a] * stride[i], *shape[a + 1:]])
            placed = _place(b, p, a, k[i] * dil[i] - pads[i], image[i])
            if placed is None:
                break
            p = placed
        else:
            total = p if total is None else b.add(total, p)
    if total is None:
        return [b.fill(0, [n, c, *image], b.dtype(x))]
    return [total]


# ---- Trilu, OneHot ---------------------------------------------------------------------------
@register("Trilu", since=14)
def trilu(ctx: OpCtx) -> list[str]:
    """The upper (lower) triangle of the last two axes from diagonal k: a WHERE over a constant mask,
    col - row >= k (<= k), zeros elsewhere."""
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    if len(shape) < 2:
        raise ctx.fail(f"needs rank 2 or more, got {list(shape)}")
    k = ctx.ints(1, [0])
    if len(k) != 1:
        raise ctx.fail(f"k must be one integer, got {k}")
    rows, cols = shape[-2:]
    diff = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = b.const(diff >= k[0] if int(ctx.attr("upper", 1)) else diff <= k[0], "triangle")
    if b.dtype(x) is DType.BOOL:  # an AND: onnxruntime, which runs exported primitive graphs, has no bool Where
        return [b.binary(Prim.AND, x, keep)]
    return [b.where(keep, x, b.scalar(0, x))]


@register("OneHot", since=9)
def one_hot(ctx: OpCtx) -> list[str]:
    """values[1] where the index (negative ones counted from the end, floats truncated) equals the
    position along the new axis, values[0] elsewhere; an index out of range gives a row of values[0].
    The depth must be a constant (it is the output's extent)."""
    b, idx, vals = ctx.b, ctx.input(0), ctx.input(2)
    depth_v = ctx.const(1)
    if depth_v is None or depth_v.size != 1:
        raise ctx.fail("depth must be a one-element constant")
    depth = int(np.asarray(depth_v).reshape(-1)[0])
    if depth < 1:
        raise ctx.fail(f"depth {depth} is not positive")
    if b.shape(vals) != (2,):
        raise ctx.fail(f"values must be [off, on], got shape {list(b.shape(vals))}")
    shape = b.shape(idx)
    a = ctx.axis(int(ctx.attr("axis", -1)), len(shape) + 1)
    i = b.cast(idx, DType.INT64) if b.dtype(idx) is not DType.INT64 else idx
    neg = b.binary(Prim.LESS, i, b.scalar(0, i))
    i = b.where(neg, b.add_scalar(i, depth), i)
    i = b.reshape(i, [*shape[:a], 1, *shape[a:]])
    pos = b.positions(depth, a, len(shape) + 1, "position")
    hit = b.binary(Prim.EQUAL, i, pos)
    off, on = b.slice_axis(vals, 0, 0, 1), b.slice_axis(vals, 0, 1, 1)
    return [b.where(hit, b.reshape(on, []), b.reshape(off, []))]
