"""Layout operators: reshapes, permutations, slicing, padding, joining and indexing.

Every rule here emits layout primitives (TRANSPOSE, RESHAPE, SLICE, PAD,
CONCAT, GATHER, GATHER_ELEMENTS) plus the BROADCASTs that replicate data
(Expand, Tile). Shape-defining inputs (Reshape's shape, Slice's starts, Pad's
pads, ...) must be constants: a rule raises `Unsupported` otherwise. Scatters,
Col2Im, Trilu and OneHot, which place values by position, are in
`ops/placement.py`.

Tensors with a zero-sized dim are not lowered (`Unsupported`): primitives
assume every tensor has at least one element.

`select` is shared with `ops/resize.py`: indexing by constant indices becomes
the cheapest primitive that does it (nothing, a strided SLICE, a repeat by
BROADCAST, or a GATHER), because a SLICE or BROADCAST fuses without reading an
index tensor.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, register


# ---- helpers --------------------------------------------------------------------
def nonempty(ctx: OpCtx, shape: Sequence[int]) -> None:
    if any(d == 0 for d in shape):
        raise Unsupported(f"{ctx.node.op} gives an empty tensor {list(shape)}")


def _axes(ctx: OpCtx, axes: Sequence[int], rank: int) -> list[int]:
    """Normalized axes, each once."""
    out = [ctx.axis(int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ctx.fail(f"axes {list(axes)} repeat an axis")
    return out


def _runs(idx: np.ndarray) -> tuple[np.ndarray, int]:
    """(q, r) with idx == numpy.repeat(q, r) and r as large as the runs allow."""
    starts = np.flatnonzero(np.concatenate([[True], idx[1:] != idx[:-1]]))
    lengths = np.diff(np.append(starts, len(idx)))
    r = int(lengths[0])
    if np.all(lengths == r):
        return idx[starts], r
    return idx, 1


def _progression(q: np.ndarray) -> tuple[int, int] | None:
    """(start, step) if q is an arithmetic progression with a nonzero step."""
    if len(q) == 1:
        return int(q[0]), 1
    d = np.diff(q)
    if d[0] != 0 and np.all(d == d[0]):
        return int(q[0]), int(d[0])
    return None


def _repeat(b: PrimBuilder, x: str, reps: Mapping[int, int]) -> str:
    """numpy.repeat(x, reps[a], axis=a) for every a: one RESHAPE, BROADCAST, RESHAPE."""
    mid: list[int] = []
    big: list[int] = []
    final: list[int] = []
    for a, d in enumerate(b.shape(x)):
        r = reps.get(a, 1)
        if r == 1:
            mid.append(d)
            big.append(d)
        elif d == 1:
            mid.append(1)
            big.append(r)
        else:  # [d, 1] -> [d, r] -> d*r keeps each element's copies adjacent
            mid += [d, 1]
            big += [d, r]
        final.append(d * r)
    return b.reshape(b.broadcast_to(b.reshape(x, mid), big), final)


def select(b: PrimBuilder, x: str, picks: Mapping[int, np.ndarray]) -> str:
    """x indexed along each axis a by the constant 1-D in-range indices picks[a].

    Each index vector is split into numpy.repeat(q, r); an arithmetic q is one
    strided SLICE (all axes together), any other q a GATHER, and r > 1 a
    BROADCAST of an inserted size-1 dim. Slices run first (they shrink the
    data), repeats last (they grow it). The identity emits nothing.
    """
    shape = b.shape(x)
    starts, steps, sliced = [0] * len(shape), [1] * len(shape), list(shape)
    gathers: dict[int, np.ndarray] = {}
    reps: dict[int, int] = {}
    for a, idx in sorted(picks.items()):
        q, r = _runs(np.asarray(idx, dtype=np.int64).reshape(-1))
        ap = _progression(q)
        if ap is None:
            gathers[a] = q
        else:
            starts[a], steps[a] = ap
            sliced[a] = len(q)
        if r > 1:
            reps[a] = r
    y = b.slice(x, starts, steps, sliced)
    for a, q in gathers.items():
        y = b.gather(y, b.const(q, "indices"), a)
    return _repeat(b, y, reps) if reps else y


# ---- reshapes and permutations -----------------------------------------------
@register("Transpose", since=1)
def transpose(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    r = ctx.b.rank(x)
    perm = ctx.attr_ints("perm")
    perm = list(range(r))[::-1] if perm is None else perm
    if sorted(perm) != list(range(r)):
        raise ctx.fail(f"perm {perm} is not a permutation of rank {r}")
    return [ctx.b.transpose(x, perm)]


def _reshape_to(ctx: OpCtx, x: str, target: Sequence[int], allowzero: bool) -> str:
    shape = ctx.b.shape(x)
    out = list(target)
    for i, d in enumerate(out):
        if d == 0 and not allowzero:
            if i >= len(shape):
                raise ctx.fail(f"shape {list(target)} copies dim {i} of a rank-{len(shape)} input")
            out[i] = shape[i]
        elif d < -1:
            raise ctx.fail(f"shape {list(target)} has a negative dim")
    if out.count(-1) > 1:
        raise ctx.fail(f"shape {list(target)} infers more than one dim")
    nonempty(ctx, shape)
    numel = math.prod(shape)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or numel % known:
            raise ctx.fail(f"cannot reshape {list(shape)} to {list(target)}")
        out[out.index(-1)] = numel // known
    if math.prod(out) != numel:
        raise ctx.fail(f"cannot reshape {list(shape)} to {list(target)}")
    return ctx.b.reshape(x, out)


@register("Reshape", since=1)
def reshape1(ctx: OpCtx) -> list[str]:
    target = ctx.attr_ints("shape")
    if target is None:
        raise ctx.fail("Reshape-1 needs the shape attribute")
    return [_reshape_to(ctx, ctx.input(0), target, False)]


@register("Reshape", since=5)
def reshape5(ctx: OpCtx) -> list[str]:
    allowzero = ctx.opset >= 14 and bool(ctx.attr("allowzero", 0))
    return [_reshape_to(ctx, ctx.input(0), ctx.ints(1), allowzero)]


@register("Flatten", since=1)
def flatten(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    shape = ctx.b.shape(x)
    a = int(ctx.attr("axis", 1))
    if not -len(shape) <= a <= len(shape):
        raise ctx.fail(f"axis {a} is out of range for rank {len(shape)}")
    a = a + len(shape) if a < 0 else a
    nonempty(ctx, shape)
    return [ctx.b.reshape(x, (math.prod(shape[:a]), math.prod(shape[a:])))]


def _squeeze(ctx: OpCtx, axes: list[int] | None) -> str:
    x = ctx.input(0)
    shape = ctx.b.shape(x)
    if axes is None:
        drop = [i for i, d in enumerate(shape) if d == 1]
    else:
        drop = _axes(ctx, axes, len(shape))
        if any(shape[a] != 1 for a in drop):
            raise ctx.fail(f"cannot squeeze axes {axes} of shape {list(shape)}")
    return ctx.b.reshape(x, [d for i, d in enumerate(shape) if i not in drop])


def _unsqueeze(ctx: OpCtx, axes: list[int]) -> str:
    x = ctx.input(0)
    shape = ctx.b.shape(x)
    rank = len(shape) + len(axes)
    new = set(_axes(ctx, axes, rank))
    rest = iter(shape)
    return ctx.b.reshape(x, [1 if i in new else next(rest) for i in range(rank)])


@register("Squeeze", since=1)
def squeeze1(ctx: OpCtx) -> list[str]:
    return [_squeeze(ctx, ctx.attr_ints("axes"))]


@register("Squeeze", since=13)
def squeeze13(ctx: OpCtx) -> list[str]:
    return [_squeeze(ctx, ctx.ints(1))]


@register("Unsqueeze", since=1)
def unsqueeze1(ctx: OpCtx) -> list[str]:
    axes = ctx.attr_ints("axes")
    if axes is None:
        raise ctx.fail("Unsqueeze needs axes")
    return [_unsqueeze(ctx, axes)]


@register("Unsqueeze", since=13)
def unsqueeze13(ctx: OpCtx) -> list[str]:
    return [_unsqueeze(ctx, ctx.ints(1))]


# ---- joining and splitting ----------------------------------------------------
@register("Concat", since=1)
def concat(ctx: OpCtx) -> list[str]:
    xs = [ctx.input(i) for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
    if not xs:
        raise ctx.fail("Concat needs at least one input")
    rank = ctx.b.rank(xs[0])
    a = ctx.axis(int(ctx.attr("axis", 1)), rank)  # opset 1 defaults to 1; later ones require it
    for x in xs[1:]:
        if ctx.b.rank(x) != rank or ctx.b.dtype(x) != ctx.b.dtype(xs[0]):
            raise ctx.fail("Concat inputs differ in rank or dtype")
    # ONNX allows zero-length operands; they contribute nothing.
    xs = [x for x in xs if ctx.b.shape(x)[a] != 0]
    if not xs:
        raise Unsupported("Concat of empty tensors")
    return [ctx.b.concat(xs, a)]


def _split(ctx: OpCtx, sizes: list[int] | None, num_outputs: int | None = None) -> list[str]:
    x = ctx.input(0)
    shape = ctx.b.shape(x)
    a = ctx.axis(int(ctx.attr("axis", 0)), len(shape))
    d, n = shape[a], ctx.num_outputs
    if sizes is None:
        if num_outputs is not None:
            # Opset 18: chunks of ceil(d / n); the last one is smaller.
            if num_outputs != n:
                raise ctx.fail(f"num_outputs {num_outputs} but {n} outputs")
            chunk = -(-d // n)
            sizes = [chunk] * (n - 1) + [d - chunk * (n - 1)]
        elif d % n:
            raise ctx.fail(f"dim {d} does not split evenly into {n} outputs")
        else:
            sizes = [d // n] * n
    if len(sizes) != n or sum(sizes) != d or any(s < 0 for s in sizes):
        raise ctx.fail(f"split {sizes} does not cover dim {d} with {n} outputs")
    outs, start = [], 0
    for i, s in enumerate(sizes):
        if ctx.output_used(i):
            if s == 0:
                raise Unsupported("Split gives an empty tensor")
            outs.append(ctx.b.slice_axis(x, a, start, s))
        start += s
    return outs


@register("Split", since=1)
def split1(ctx: OpCtx) -> list[str]:
    # Opset 1 takes split from the second input or the attribute; 2-12 from the attribute.
    sizes = ctx.ints(1) if ctx.has_input(1) else ctx.attr_ints("split")
    return _split(ctx, sizes or None)


@register("Split", since=2)
def split2(ctx: OpCtx) -> list[str]:
    return _split(ctx, ctx.attr_ints("split") or None)


@register("Split", since=13)
def split13(ctx: OpCtx) -> list[str]:
    return _split(ctx, ctx.ints(1) or None)


@register("Split", since=18)
def split18(ctx: OpCtx) -> list[str]:
    sizes = ctx.ints(1) or None
    num = ctx.attr("num_outputs")
    if sizes is not None and num is not None:
        raise ctx.fail("Split takes either split or num_outputs, not both")
    return _split(ctx, sizes, None if num is None else int(num))


# ---- slicing and padding ------------------------------------------------------
def _slice(ctx: OpCtx, starts: list[int], ends: list[int], axes: list[int] | None,
           steps: list[int] | None) -> str:
    x = ctx.input(0)
    shape = ctx.b.shape(x)
    r = len(shape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.fail("starts, ends, axes and steps differ in length")
    first, stride, out = [0] * r, [1] * r, list(shape)
    for a, s, e, k in zip(_axes(ctx, axes, r), starts, ends, steps):
        d = shape[a]
        if k == 0:
            raise ctx.fail("slice step 0")
        s, e = s + d if s < 0 else s, e + d if e < 0 else e
        # ONNX clamps starts to [0, d] and ends to [0, d] going forward,
        # and to [0, d-1] and [-1, d-1] going backward.
        if k > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            n = max(0, -(-(e - s) // k))
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            n = max(0, -(-(s - e) // -k))
        if n == 0:
            raise Unsupported("Slice gives an empty tensor")
        first[a], stride[a], out[a] = s, (k if n > 1 else 1), n
    return ctx.b.slice(x, first, stride, out)


@register("Slice", since=1)
def slice1(ctx: OpCtx) -> list[str]:
    starts, ends = ctx.attr_ints("starts"), ctx.attr_ints("ends")
    if starts is None or ends is None:
        raise ctx.fail("Slice-1 needs starts and ends")
    return [_slice(ctx, starts, ends, ctx.attr_ints("axes"), None)]


@register("Slice", since=10)
def slice10(ctx: OpCtx) -> list[str]:
    return [_slice(ctx, ctx.ints(1), ctx.ints(2), ctx.ints(3), ctx.ints(4))]


def _pad(ctx: OpCtx, pads: list[int], mode: str, value: float, axes: list[int] | None) -> str:
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    r = len(shape)
    if mode == "wrap":
        raise Unsupported("Pad mode 'wrap'")
    if mode not in ("constant", "reflect", "edge"):
        raise ctx.fail(f"unknown Pad mode '{mode}'")
    axes = list(range(r)) if axes is None else _axes(ctx, axes, r)
    n = len(axes)
    if len(pads) != 2 * n:
        raise ctx.fail(f"{len(pads)} pads for {n} axes")
    full = [0] * (2 * r)
    for i, a in enumerate(axes):
        full[a], full[a + r] = pads[i], pads[i + n]
    # Negative pads crop: SLICE them off first, then PAD the rest.
    starts = [max(0, -full[i]) for i in range(r)]
    kept = [shape[i] - starts[i] - max(0, -full[i + r]) for i in range(r)]
    nonempty(ctx, shape)
    if any(k <= 0 for k in kept):
        raise Unsupported(f"Pad crops away all of {list(shape)}")
    pos = [max(0, p) for p in full]
    if mode == "reflect" and any(pos[i] >= kept[i] or pos[i + r] >= kept[i] for i in range(r)):
        raise Unsupported(f"Pad reflect wider than the tensor {kept}")
    y = b.slice(x, starts, [1] * r, kept)
    return b.pad(y, pos, mode, value if mode == "constant" else 0.0)


@register("Pad", since=2)
def pad2(ctx: OpCtx) -> list[str]:
    pads = ctx.attr_ints("pads")
    if pads is None:
        raise ctx.fail("Pad-2 needs pads")
    return [_pad(ctx, pads, ctx.attr("mode", "constant"), float(ctx.attr("value", 0.0)), None)]


@register("Pad", since=11)
def pad11(ctx: OpCtx) -> list[str]:
    v = ctx.const(2)
    value = v.reshape(-1)[0].item() if v is not None and v.size else 0.0
    axes = ctx.ints(3) if ctx.opset >= 18 else None
    return [_pad(ctx, ctx.ints(1), ctx.attr("mode", "constant"), value, axes)]


# ---- replication ------------------------------------------------------------------
@register("Expand", since=8)
def expand(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    target = ctx.ints(1)
    if any(d < 0 for d in target):
        raise ctx.fail(f"shape {target} has a negative dim")
    # NumPy broadcasting both ways: a 1 in `target` keeps the input's dim.
    out = b.broadcast_shape(b.shape(x), target)
    nonempty(ctx, out)
    return [b.broadcast_to(x, out)]


@register("Tile", since=6)
def tile(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    reps = ctx.ints(1)
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise ctx.fail(f"repeats {reps} do not fit rank {len(shape)}")
    nonempty(ctx, [d * r for d, r in zip(shape, reps)])
    # Whole copies: [d] -> [1, d] -> [r, d] -> r*d (the copy index is the outer one).
    mid: list[int] = []
    big: list[int] = []
    for d, r in zip(shape, reps):
        if r == 1 or d == 1:
            mid.append(d)
            big.append(d * r)
        else:
            mid += [1, d]
            big += [r, d]
    y = b.broadcast_to(b.reshape(x, mid), big)
    return [b.reshape(y, [d * r for d, r in zip(shape, reps)])]


# ---- indexing ------------------------------------------------------------------------
def const_indices(ctx: OpCtx, v: np.ndarray, d: int) -> np.ndarray:
    """Constant indices made non-negative, checked against extent d."""
    v = np.asarray(v, dtype=np.int64)
    if v.size and (v.min() < -d or v.max() >= d):
        raise ctx.fail(f"indices out of range for extent {d}")
    return np.where(v < 0, v + d, v)


@register("Gather", since=1)
def gather(ctx: OpCtx) -> list[str]:
    b, x, idx = ctx.b, ctx.input(0), ctx.input(1)
    shape = b.shape(x)
    a = ctx.axis(int(ctx.attr("axis", 0)), len(shape))
    out = shape[:a] + b.shape(idx) + shape[a + 1:]
    nonempty(ctx, out)
    v = b.value(idx)
    if v is None:
        return [b.gather(x, idx, a)]
    # Constant indices: index by the flattened vector (a SLICE where it is a
    # progression), then RESHAPE in the indices' shape (a scalar drops the dim).
    v = const_indices(ctx, v, shape[a])
    return [b.reshape(select(b, x, {a: v.reshape(-1)}), out)]


@register("GatherElements", since=11)
def gather_elements(ctx: OpCtx) -> list[str]:
    b, x, idx = ctx.b, ctx.input(0), ctx.input(1)
    shape = b.shape(x)
    a = ctx.axis(int(ctx.attr("axis", 0)), len(shape))
    if b.rank(idx) != len(shape):
        raise ctx.fail("GatherElements indices must have the data's rank")
    ishape = b.shape(idx)
    nonempty(ctx, ishape)
    if any(i > d for k, (i, d) in enumerate(zip(ishape, shape)) if k != a):
        raise ctx.fail(f"indices {list(ishape)} exceed data {list(shape)} off the axis")
    v = b.value(idx)
    if v is not None:
        const_indices(ctx, v, shape[a])
    # Indices may be shorter than the data off the axis: slice the data to match,
    # so the primitive's operands agree on every dim but the axis.
    x = b.slice(x, [0] * len(shape), [1] * len(shape), [d if k == a else ishape[k] for k, d in enumerate(shape)])
    return [b.emit(Prim.GATHER_ELEMENTS, [x, idx], {"axis": a})]


@register("GatherND", since=11)
def gather_nd(ctx: OpCtx) -> list[str]:
    """Each index tuple (the indices' last axis, k long) picks a slice of the data past its batch dims:
    the k data axes are flattened into one and the tuple becomes one position in it, so that a GATHER
    on axis 0 (batch dims folded in as an offset) reads the slices. Constant indices are flattened
    here (a SLICE where the positions are a progression); computed ones by elementwise primitives."""
    b, x, idx = ctx.b, ctx.input(0), ctx.input(1)
    shape, ishape = b.shape(x), b.shape(idx)
    bd = int(ctx.attr("batch_dims", 0)) if ctx.opset >= 12 else 0
    if not ishape or bd < 0 or bd >= min(len(shape), len(ishape)) or tuple(ishape[:bd]) != tuple(shape[:bd]):
        raise ctx.fail(f"indices {list(ishape)} with batch_dims {bd} do not fit data {list(shape)}")
    k = ishape[-1]
    if k < 1 or bd + k > len(shape):
        raise ctx.fail(f"index tuples of {k} do not fit data {list(shape)} past {bd} batch dims")
    batch, dims, rest, lead = shape[:bd], shape[bd:bd + k], shape[bd + k:], ishape[bd:-1]
    out = [*batch, *lead, *rest]
    nonempty(ctx, out)
    nb, nd = math.prod(batch), math.prod(dims)
    strides = [math.prod(dims[j + 1:]) for j in range(k)]  # row-major positions in the k axes
    flat = b.reshape(x, [nb * nd, *rest])
    # batch entry n's slices start at n * nd: an offset over the batch dims, broadcast over `lead`
    offset = (np.arange(nb, dtype=np.int64) * nd).reshape([*batch, *([1] * len(lead))])
    v = b.value(idx)
    if v is not None:
        v = np.asarray(v, dtype=np.int64)
        cols = [const_indices(ctx, v[..., j], d) for j, d in enumerate(dims)]
        pos = sum(c * st for c, st in zip(cols, strides)) + offset
        return [b.reshape(select(b, flat, {0: pos.reshape(-1)}), out)]
    idx = b.cast(idx, DType.INT64)  # int32 indices: the arithmetic below is int64
    pos = None
    for j, (d, st) in enumerate(zip(dims, strides)):
        c = b.reshape(b.slice_axis(idx, len(ishape) - 1, j, 1), ishape[:-1])
        # a negative index counts from the end of its axis, before the axes are combined
        c = b.emit(Prim.WHERE, [b.emit(Prim.LESS, [c, b.scalar(0, c)]), b.add_scalar(c, d), c])
        term = b.mul_scalar(c, st) if st != 1 else c
        pos = term if pos is None else b.add(pos, term)
    if nb > 1:
        pos = b.add(pos, b.const(offset, "batch_offset"))
    pos = b.reshape(pos, [math.prod(b.shape(pos))])
    return [b.reshape(b.gather(flat, pos, 0), out)]


# ---- space <-> depth ------------------------------------------------------------------
def _nchw_blocks(ctx: OpCtx, x: str) -> tuple[int, int, int, int, int]:
    shape = ctx.b.shape(x)
    bs = int(ctx.attr("blocksize", 0))
    if len(shape) != 4 or bs < 1:
        raise ctx.fail(f"needs a rank-4 input and blocksize >= 1, got {list(shape)} and {bs}")
    nonempty(ctx, shape)
    return (*shape, bs)  # type: ignore[return-value]


@register("SpaceToDepth", since=1)
def space_to_depth(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    n, c, h, w, s = _nchw_blocks(ctx, x)
    if h % s or w % s:
        raise ctx.fail(f"spatial dims {h}x{w} are not multiples of blocksize {s}")
    y = b.reshape(x, (n, c, h // s, s, w // s, s))
    y = b.transpose(y, (0, 3, 5, 1, 2, 4))
    return [b.reshape(y, (n, c * s * s, h // s, w // s))]


@register("DepthToSpace", since=1)
def depth_to_space(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    n, c, h, w, s = _nchw_blocks(ctx, x)
    if c % (s * s):
        raise ctx.fail(f"channels {c} are not a multiple of blocksize {s} squared")
    mode = ctx.attr("mode", "DCR") if ctx.opset >= 11 else "DCR"
    if mode == "DCR":  # depth is (block row, block col, channel)
        y = b.reshape(x, (n, s, s, c // (s * s), h, w))
        y = b.transpose(y, (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":  # depth is (channel, block row, block col)
        y = b.reshape(x, (n, c // (s * s), s, s, h, w))
        y = b.transpose(y, (0, 1, 4, 2, 5, 3))
    else:
        raise ctx.fail(f"unknown DepthToSpace mode '{mode}'")
    return [b.reshape(y, (n, c // (s * s), h * s, w * s))]
