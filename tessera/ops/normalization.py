"""Normalization and reduction operators: Softmax, LogSoftmax, Layer/Instance/
Batch/GroupNormalization and the Reduce* family.

Every rule here emits reductions (REDUCE_SUM/MAX/MIN, axes kept so the result
broadcasts back), explicit BROADCASTs, and elementwise primitives. A mean is
REDUCE_SUM times FILL(1/n), so the only reductions are the three the primitive
contract has; a later rewrite may turn the sum into a MatMul with ones.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, float_dtype_check, register

_HALF = (DType.FLOAT16, DType.BFLOAT16)


# ---- shared pieces ------------------------------------------------------------
def _extent(b: PrimBuilder, x: str, axes: Iterable[int]) -> int:
    """How many elements one reduction over `axes` of x combines."""
    shape = b.shape(x)
    return math.prod(shape[a] for a in axes)


def _mean(b: PrimBuilder, x: str, axes: Sequence[int]) -> str:
    """Mean over `axes`, kept: REDUCE_SUM then MUL by FILL(1/n)."""
    n = _extent(b, x, axes)
    if n == 0:
        raise Unsupported("mean over an empty extent")
    s = b.reduce(Prim.REDUCE_SUM, x, axes)
    return s if n == 1 else b.mul_scalar(s, 1.0 / n)


def _standardize(b: PrimBuilder, x: str, axes: Sequence[int], eps: float) -> tuple[str, str, str]:
    """(x - mean) * 1/sqrt(var + eps) over `axes`; returns it, the mean and 1/std (kept dims).

    The variance is the mean of squared deviations (two passes), not
    E[x^2] - E[x]^2, which cancels badly when |mean| >> std.
    """
    mean = _mean(b, x, axes)
    d = b.sub(x, mean)
    var = _mean(b, b.emit(Prim.MUL, [d, d]), axes)
    inv_std = b.unary(Prim.RECIPROCAL, b.unary(Prim.SQRT, b.add_scalar(var, eps)))
    return b.mul(d, inv_std), mean, inv_std


def _widened(dt: DType) -> DType:
    # Half types are widened to float32 for statistics, as ONNX's functions do
    # with stash_type=1: a float16 sum over a large extent loses the variance.
    return DType.FLOAT32 if dt in _HALF else dt


def _stash_dtype(ctx: OpCtx, default: DType) -> DType:
    """The precision statistics are computed in: attribute stash_type, else `default`."""
    code = ctx.attr("stash_type")
    if code is None:
        return default
    try:
        dt = DType.from_onnx(int(code))
    except ValueError as e:
        raise Unsupported(f"stash_type: {e}") from None
    if not dt.is_float:
        raise ctx.fail(f"stash_type {dt.value} is not a float type")
    return dt


def _channel_vector(ctx: OpCtx, i: int, c: int, dtype: DType) -> str:
    """Input i, which must be a per-channel vector [C], as `dtype`."""
    b, p = ctx.b, ctx.input(i)
    if b.shape(p) != (c,):
        raise ctx.fail(f"input {i} has shape {list(b.shape(p))}, expected [{c}] (one value per channel)")
    return b.cast(p, dtype)


def _channel_view(b: PrimBuilder, p: str, rank: int) -> str:
    """A [C] vector as [1, C, 1, ...], ready to broadcast against [N, C, ...]."""
    return b.reshape(p, [1, b.shape(p)[0]] + [1] * (rank - 2))


def _unidirectional(ctx: OpCtx, y: str, prim: Prim, p: str) -> str:
    """prim(y, p) where p must broadcast to y's shape (ONNX unidirectional broadcasting)."""
    b = ctx.b
    if b.broadcast_shape(b.shape(y), b.shape(p)) != b.shape(y):
        raise ctx.fail(f"input '{p}' of shape {list(b.shape(p))} does not broadcast to {list(b.shape(y))}")
    return b.binary(prim, y, p)


# ---- Softmax / LogSoftmax -----------------------------------------------------
def _softmax(ctx: OpCtx, axes: Sequence[int]) -> list[str]:
    """Numerically stable (log-)softmax over `axes`: shift by the max before exp."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    if _extent(b, x, axes) == 0:
        raise Unsupported("softmax over an empty extent")
    shifted = b.sub(x, b.reduce(Prim.REDUCE_MAX, x, axes))
    e = b.unary(Prim.EXP, shifted)
    total = b.reduce(Prim.REDUCE_SUM, e, axes)
    if ctx.node.op == "LogSoftmax":
        return [b.sub(shifted, b.unary(Prim.LOG, total))]
    return [b.div(e, total)]


@register(["Softmax", "LogSoftmax"], since=1)
def softmax_2d(ctx: OpCtx) -> list[str]:
    # Opsets 1-12 coerce the input to 2-D at `axis`: that is a normalization
    # over every axis from `axis` on, which needs no reshape.
    rank = ctx.b.rank(ctx.input(0))
    axis = ctx.axis(ctx.attr("axis", 1), rank)
    return _softmax(ctx, list(range(axis, rank)))


@register(["Softmax", "LogSoftmax"], since=13)
def softmax_axis(ctx: OpCtx) -> list[str]:
    rank = ctx.b.rank(ctx.input(0))
    return _softmax(ctx, [ctx.axis(ctx.attr("axis", -1), rank)])


# ---- LayerNormalization -------------------------------------------------------
@register("LayerNormalization", since=17)
def layer_norm(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    t = float_dtype_check(ctx, x)
    rank = b.rank(x)
    axis = ctx.axis(ctx.attr("axis", -1), rank)
    stash = _stash_dtype(ctx, DType.FLOAT32)  # stash_type defaults to 1 (float)
    eps = float(ctx.attr("epsilon", 1e-5))
    normed, mean, inv_std = _standardize(b, b.cast(x, stash), list(range(axis, rank)), eps)
    # Scale and shift happen in T, after the cast back (ONNX function body).
    y = _unidirectional(ctx, b.cast(normed, t), Prim.MUL, ctx.input(1))
    if ctx.has_input(2):
        y = _unidirectional(ctx, y, Prim.ADD, ctx.input(2))
    # Omitted outputs get no entry: fission pairs results with used outputs in order.
    outs = [y]
    if ctx.output_used(1):
        outs.append(mean)
    if ctx.output_used(2):
        outs.append(inv_std)
    return outs


# ---- InstanceNormalization ----------------------------------------------------
@register("InstanceNormalization", since=6)
def instance_norm(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    t = float_dtype_check(ctx, x)
    rank = b.rank(x)
    if rank < 3:
        raise Unsupported(f"InstanceNormalization of rank {rank} (needs N, C and a spatial dim)")
    c = b.shape(x)[1]
    eps = float(ctx.attr("epsilon", 1e-5))
    normed, _, _ = _standardize(b, b.cast(x, _widened(t)), list(range(2, rank)), eps)
    y = b.mul(b.cast(normed, t), _channel_view(b, _channel_vector(ctx, 1, c, t), rank))
    return [b.add(y, _channel_view(b, _channel_vector(ctx, 2, c, t), rank))]


# ---- BatchNormalization (inference) -------------------------------------------
@register("BatchNormalization", since=7)
@register("BatchNormalization", since=9)
@register("BatchNormalization", since=14)
@register("BatchNormalization", since=15)
def batch_norm(ctx: OpCtx) -> list[str]:
    # 7: `spatial` attribute; 9: spatial only; 14: `training_mode`; 15: scale/B
    # and mean/var may have their own float types (T1, T2).
    if int(ctx.attr("training_mode", 0)):
        raise Unsupported("BatchNormalization with training_mode=1")
    if not int(ctx.attr("spatial", 1)):
        raise Unsupported("BatchNormalization with spatial=0")
    if any(ctx.output_used(i) for i in range(1, ctx.num_outputs)):
        raise Unsupported("BatchNormalization with training outputs (running or saved statistics)")
    b, x = ctx.b, ctx.input(0)
    t = float_dtype_check(ctx, x)
    rank = b.rank(x)
    if rank < 2:
        raise Unsupported(f"BatchNormalization of rank {rank}")
    c = b.shape(x)[1]
    # y = x * a + (B - mean * a), a = scale / sqrt(var + eps): the per-channel
    # terms are [C]-sized (constant-folded when the statistics are constants),
    # leaving one MUL and one ADD over the full tensor. Computed in the
    # statistics' type, widened from half.
    st = _widened(b.dtype(ctx.input(3)))
    scale, bias, mean, var = (_channel_vector(ctx, i, c, st) for i in (1, 2, 3, 4))
    inv_std = b.unary(Prim.RECIPROCAL, b.unary(Prim.SQRT, b.add_scalar(var, float(ctx.attr("epsilon", 1e-5)))))
    a = b.mul(scale, inv_std)
    shift = b.sub(bias, b.mul(mean, a))
    a, shift = (_channel_view(b, b.cast(p, t), rank) for p in (a, shift))
    return [b.add(b.mul(x, a), shift)]


# ---- GroupNormalization -------------------------------------------------------
def _group_norm(ctx: OpCtx, per_channel: bool, stash: DType | None) -> list[str]:
    """`stash`: the statistics' type when the op has no stash_type (None: widen T)."""
    b, x = ctx.b, ctx.input(0)
    t = float_dtype_check(ctx, x)
    shape = b.shape(x)
    if len(shape) < 2:
        raise ctx.fail(f"input of rank {len(shape)} has no channel dim")
    groups = ctx.attr("num_groups")
    if groups is None:
        raise ctx.fail("attribute num_groups is required")
    n, c, g = shape[0], shape[1], int(groups)
    if g <= 0 or c % g:
        raise ctx.fail(f"{c} channels do not split into {g} groups")
    # View as [N, G, C/G, spatial]: statistics over the last two axes.
    spatial = math.prod(shape[2:])
    xg = b.reshape(b.cast(x, _stash_dtype(ctx, stash or _widened(t))), [n, g, c // g, spatial])
    normed, _, _ = _standardize(b, xg, [2, 3], float(ctx.attr("epsilon", 1e-5)))
    y = b.cast(normed, t)
    # Opset 18: one scale/bias per group; 21: per channel. Either way they
    # broadcast against the grouped view.
    want, view = ((c,), [1, g, c // g, 1]) if per_channel else ((g,), [1, g, 1, 1])
    for i, prim in ((1, Prim.MUL), (2, Prim.ADD)):
        p = ctx.input(i)
        if b.shape(p) != want:
            raise ctx.fail(f"input {i} has shape {list(b.shape(p))}, expected {list(want)}")
        y = b.binary(prim, y, b.reshape(p, view))
    return [b.reshape(y, shape)]


@register("GroupNormalization", since=18)
def group_norm18(ctx: OpCtx) -> list[str]:
    return _group_norm(ctx, per_channel=False, stash=None)


@register("GroupNormalization", since=21)
def group_norm21(ctx: OpCtx) -> list[str]:
    return _group_norm(ctx, per_channel=True, stash=DType.FLOAT32)  # stash_type defaults to 1


# ---- Reduce* ------------------------------------------------------------------
# Ops whose result is only defined for float inputs here (a float 1/n, sqrt,
# log); their integer forms raise Unsupported.
_FLOAT_ONLY = frozenset({"ReduceMean", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})
# Ops with no identity element: an empty extent has no max (ONNX says -inf,
# but only for some dtypes) and a mean of nothing is undefined.
_NEEDS_ELEMENTS = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceLogSumExp"})
_REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare",
               "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"]


def _reduce(ctx: OpCtx, axes: Sequence[int] | None, noop_with_empty_axes: bool) -> list[str]:
    """One Reduce* operator over `axes` (None or empty: all axes, unless noop)."""
    b, x, op = ctx.b, ctx.input(0), ctx.node.op
    dt, rank = b.dtype(x), b.rank(x)
    if dt is DType.BOOL:
        raise Unsupported(f"{op} on bool")
    if op in _FLOAT_ONLY:
        float_dtype_check(ctx, x)
    if axes:
        axes = sorted({ctx.axis(int(a), rank) for a in axes})
    else:
        # noop: reduce over no axes, i.e. only the elementwise part applies
        # (ReduceSumSquare gives x*x), as in the ONNX reference.
        axes = [] if noop_with_empty_axes else list(range(rank))
    if op in _NEEDS_ELEMENTS and _extent(b, x, axes) == 0:
        raise Unsupported(f"{op} over an empty extent")

    if op == "ReduceMean":
        y = _mean(b, x, axes)
    elif op in ("ReduceMax", "ReduceMin"):
        y = b.reduce(Prim.REDUCE_MAX if op == "ReduceMax" else Prim.REDUCE_MIN, x, axes)
    elif op == "ReduceLogSumExp":
        # max + log(sum(exp(x - max))): exp cannot overflow.
        m = b.reduce(Prim.REDUCE_MAX, x, axes)
        e = b.unary(Prim.EXP, b.sub(x, m))
        y = b.emit(Prim.ADD, [b.unary(Prim.LOG, b.reduce(Prim.REDUCE_SUM, e, axes)), m])
    else:
        if op in ("ReduceSumSquare", "ReduceL2"):
            x = b.emit(Prim.MUL, [x, x])
        elif op == "ReduceL1":
            x = b.unary(Prim.ABS, x)
        y = b.reduce(Prim.REDUCE_SUM, x, axes)
        if op == "ReduceL2":
            y = b.unary(Prim.SQRT, y)
        elif op == "ReduceLogSum":
            y = b.unary(Prim.LOG, y)

    if not int(ctx.attr("keepdims", 1)):
        y = b.reshape(y, [d for i, d in enumerate(b.shape(y)) if i not in axes])
    return [y]


@register(_REDUCE_OPS, since=1)
def reduce_axes_attr(ctx: OpCtx) -> list[str]:
    # Axes are an attribute (negative values allowed from opset 11).
    axes = ctx.attr("axes")
    return _reduce(ctx, None if axes is None else [int(a) for a in axes], False)


@register("ReduceSum", since=13)
@register([op for op in _REDUCE_OPS if op != "ReduceSum"], since=18)
def reduce_axes_input(ctx: OpCtx) -> list[str]:
    # Axes are an optional input, which must be a constant to be lowered.
    return _reduce(ctx, ctx.ints(1), bool(int(ctx.attr("noop_with_empty_axes", 0))))


CUMSUM_MAX = 4096  # longer axes stay opaque: the lowering below does L*L additions per row


@register("CumSum", since=11)
def cumsum(ctx: OpCtx) -> list[str]:
    """Running sums as a masked reduction: y[i] = sum over j of m[i, j] * x[j], with m the constant
    L x L triangle that `exclusive` and `reverse` pick. x is broadcast along a new axis i and the
    reduction over j fuses with it, so the L x L values are never stored. Integer data sums exactly
    (RoBERTa's position ids are a CumSum of the padding mask)."""
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    axis = ctx.ints(1)
    if not shape or axis is None or len(axis) != 1:
        raise ctx.fail(f"CumSum takes one axis of an input of rank 1 or more, got {axis} and shape {list(shape)}")
    a = ctx.axis(axis[0], len(shape))
    n = shape[a]
    if n > CUMSUM_MAX:
        raise Unsupported(f"a running sum over {n} values (more than {CUMSUM_MAX}) runs through the fallback")
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    forward, exclusive = not int(ctx.attr("reverse", 0)), bool(int(ctx.attr("exclusive", 0)))
    keep = (j < i if exclusive else j <= i) if forward else (j > i if exclusive else j >= i)
    rest = len(shape) - a - 1
    mask = b.const(keep.reshape([1] * a + [n, n] + [1] * rest), "cumsum_mask")
    wide = [*shape[:a], n, n, *shape[a + 1:]]
    xs = b.broadcast_to(b.reshape(x, [*shape[:a], 1, n, *shape[a + 1:]]), wide)
    picked = b.where(mask, xs, b.fill(0, [], b.dtype(x)))
    return [b.reduce(Prim.REDUCE_SUM, picked, [a + 1], keepdims=False)]


@register(["ArgMax", "ArgMin"], since=1)
def arg_extreme(ctx: OpCtx) -> list[str]:
    """The index of the largest (smallest) value along an axis, as onnxruntime scans for it: the first
    (with select_last_index, the last) of the values equal to the extreme of the non-NaN ones; NaN is
    skipped unless it comes first, when the scan never moves off index 0. The indices are an int64
    constant, reduced as integers (exact at any length and precision)."""
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    if not shape:
        raise ctx.fail("needs an input of rank 1 or more")
    a = ctx.axis(int(ctx.attr("axis", 0)), len(shape))
    n = shape[a]
    if not all(shape):
        raise Unsupported(f"{ctx.node.op} of an empty tensor {list(shape)}")
    biggest = ctx.node.op == "ArgMax"
    last = bool(int(ctx.attr("select_last_index", 0)))
    is_float = b.dtype(x).is_float
    nan = b.unary(Prim.ISNAN, x) if is_float else None
    xs = b.emit(Prim.WHERE, [nan, b.scalar(-math.inf if biggest else math.inf, x), x]) if is_float else x
    extreme = b.reduce(Prim.REDUCE_MAX if biggest else Prim.REDUCE_MIN, xs, [a], keepdims=True)
    hit = b.binary(Prim.EQUAL, x, extreme)  # NaN never equals
    iota = b.positions(n, a, len(shape))
    cand = b.where(hit, iota, b.fill(-1 if last else n, [], DType.INT64))
    y = b.reduce(Prim.REDUCE_MAX if last else Prim.REDUCE_MIN, cand, [a], keepdims=True)
    if is_float:  # a NaN first holds the scan at index 0
        first = b.slice_axis(nan, a, 0, 1)
        y = b.where(first, b.fill(0, [], DType.INT64), y)
    if not int(ctx.attr("keepdims", 1)):
        y = b.reshape(y, [d for i, d in enumerate(shape) if i != a])
    return [y]


TOPK_STEPS = 16  # a TopK picks its k elements one after another: up to this many (MoE routers pick 1-8)


@register("TopK", since=1)
def top_k(ctx: OpCtx) -> list[str]:
    """The k largest (smallest) values along an axis and their int64 indices, sorted, as onnxruntime
    orders them: NaN above every number (first when largest, last when smallest), ties by index.
    k steps, each one pick: the first untaken NaN where NaN comes first, else the extreme of the
    untaken numbers and the least untaken index that holds it; the values are then gathered by index
    (so -0.0 stays -0.0). Stays opaque: a k that is not a constant, k over TOPK_STEPS, sorted=0
    (onnxruntime's order is then its own)."""
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    if not shape:
        raise ctx.fail("needs an input of rank 1 or more")
    a = ctx.axis(int(ctx.attr("axis", -1)), len(shape))
    n = shape[a]
    k = int(ctx.attr("k")) if ctx.opset < 10 else ctx.ints(1)[0]
    if not 0 <= k <= n:
        raise ctx.fail(f"k = {k} is not within the axis' {n} elements")
    if not int(ctx.attr("sorted", 1)):
        raise Unsupported("TopK with sorted=0 (onnxruntime returns its own order)")
    if k > TOPK_STEPS:
        raise Unsupported(f"TopK of k = {k} > {TOPK_STEPS} (it picks one element a step)")
    if k == 0 or not all(shape):
        raise Unsupported(f"TopK of an empty result (k = {k}, input {list(shape)})")
    largest = bool(int(ctx.attr("largest", 1)))
    dt = b.dtype(x)
    nan = b.unary(Prim.ISNAN, x) if dt.is_float else None
    iota = b.positions(n, a, len(shape))
    none = b.fill(n, [], DType.INT64)  # "no index": past the axis
    # the value that can never win: -inf (+inf) for floats, the type's least (greatest) integer
    worst = (-math.inf if largest else math.inf) if dt.is_float else \
        int(np.iinfo(dt.to_numpy()).min if largest else np.iinfo(dt.to_numpy()).max)
    extreme = Prim.REDUCE_MAX if largest else Prim.REDUCE_MIN
    taken: str | None = None
    picks = []
    for _ in range(k):
        free = None if taken is None else b.unary(Prim.NOT, taken)
        # out of the running for the extreme: taken, or NaN
        out = taken if nan is None else nan if taken is None else b.binary(Prim.OR, nan, taken)
        keyed = x if out is None else b.where(out, b.scalar(worst, x), x)
        m = b.reduce(extreme, keyed, [a], keepdims=True)
        hit = b.binary(Prim.EQUAL, x, m)  # NaN never equals
        if free is not None:
            hit = b.binary(Prim.AND, hit, free)
        i = b.reduce(Prim.REDUCE_MIN, b.where(hit, iota, none), [a], keepdims=True)
        if nan is not None:  # NaN ranks above every number
            free_nan = nan if free is None else b.binary(Prim.AND, nan, free)
            i_nan = b.reduce(Prim.REDUCE_MIN, b.where(free_nan, iota, none), [a], keepdims=True)
            if largest:  # the first untaken NaN, if any, before any number
                i = b.where(b.binary(Prim.LESS, i_nan, none), i_nan, i)
            else:  # a NaN only once the numbers are spent
                i = b.where(b.binary(Prim.LESS, i, none), i, i_nan)
        picks.append(i)
        chosen = b.binary(Prim.EQUAL, iota, i)
        taken = chosen if taken is None else b.binary(Prim.OR, taken, chosen)
    idx = b.concat(picks, a) if k > 1 else picks[0]
    return [b.emit(Prim.GATHER_ELEMENTS, [x, idx], {"axis": a}), idx]


# ---- RMSNormalization, MeanVarianceNormalization, LpNormalization, LRN, Hardmax (session 51) ----------
@register("RMSNormalization", since=23)
def rms_norm(ctx: OpCtx) -> list[str]:
    """x / sqrt(mean(x^2) + epsilon) over the axes from `axis` on, in stash_type, then times the scale
    in x's type (as LayerNormalization's function orders it)."""
    b, x = ctx.b, ctx.input(0)
    t = float_dtype_check(ctx, x)
    rank = b.rank(x)
    axes = list(range(ctx.axis(ctx.attr("axis", -1), rank), rank))
    xs = b.cast(x, _stash_dtype(ctx, DType.FLOAT32))
    ms = _mean(b, b.emit(Prim.MUL, [xs, xs]), axes)
    inv = b.unary(Prim.RECIPROCAL, b.unary(Prim.SQRT, b.add_scalar(ms, float(ctx.attr("epsilon", 1e-5)))))
    return [_unidirectional(ctx, b.cast(b.mul(xs, inv), t), Prim.MUL, ctx.input(1))]


@register("MeanVarianceNormalization", since=9)
def mean_variance_norm(ctx: OpCtx) -> list[str]:
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` (default N, H, W), by ONNX's function,
    one-pass variance included, as onnxruntime computes it. Where the values along the axes (nearly)
    coincide that variance cancels, and summation order decides between 0 and a tiny negative one
    (NaN): onnxruntime and tessera may differ there."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    rank = b.rank(x)
    axes = sorted({ctx.axis(int(a), rank) for a in ctx.attr("axes", [0, 2, 3])})
    mean = _mean(b, x, axes)
    var = b.sub(_mean(b, b.emit(Prim.MUL, [x, x]), axes), b.emit(Prim.MUL, [mean, mean]))
    return [b.div(b.sub(x, mean), b.add_scalar(b.unary(Prim.SQRT, var), 1e-9))]


@register("LpNormalization", since=1)
def lp_norm(ctx: OpCtx) -> list[str]:
    """x / ||x||_p along `axis` (p 1 or 2); a zero vector stays zero, as in onnxruntime."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    a = ctx.axis(int(ctx.attr("axis", -1)), b.rank(x))
    p = int(ctx.attr("p", 2))
    if p == 1:
        norm = b.reduce(Prim.REDUCE_SUM, b.unary(Prim.ABS, x), [a])
    elif p == 2:
        norm = b.unary(Prim.SQRT, b.reduce(Prim.REDUCE_SUM, b.emit(Prim.MUL, [x, x]), [a]))
    else:
        raise ctx.fail(f"p = {p}: LpNormalization takes 1 or 2")
    zero = b.binary(Prim.EQUAL, norm, b.scalar(0, norm))
    return [b.where(zero, b.scalar(0, x), b.div(x, norm))]


LRN_SIZE_MAX = 32  # a channel window is a sum of this many shifted slices at most


@register("LRN", since=1)
def lrn(ctx: OpCtx) -> list[str]:
    """x / (bias + alpha / size * sum of x^2 over a window of `size` channels)^beta; the window runs
    floor((size - 1) / 2) channels back and ceil((size - 1) / 2) forward: the squares padded with zeros
    on the channel axis, summed over `size` shifted slices."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    shape = b.shape(x)
    if len(shape) < 3:
        raise ctx.fail(f"needs an input [N, C, D...], got {list(shape)}")
    size = int(ctx.attr("size"))
    if not 1 <= size <= LRN_SIZE_MAX:
        raise Unsupported(f"LRN of size {size} (1 to {LRN_SIZE_MAX})")
    alpha, beta, bias = (float(ctx.attr(k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    back, ahead = (size - 1) // 2, size - 1 - (size - 1) // 2
    c = shape[1]
    pads = [0] * (2 * len(shape))
    pads[1], pads[len(shape) + 1] = back, ahead
    sq = b.pad(b.emit(Prim.MUL, [x, x]), pads)
    total = None
    for i in range(size):
        part = b.slice_axis(sq, 1, i, c)
        total = part if total is None else b.add(total, part)
    base = b.add_scalar(b.mul_scalar(total, alpha / size), bias)
    return [b.mul(x, b.binary(Prim.POW, base, b.scalar(-beta, base)))]


@register("Hardmax", since=1)
def hardmax_2d(ctx: OpCtx) -> list[str]:
    """Opsets 1-12 view the input as 2-D at `axis` (default 1): one row per leading index."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    shape = b.shape(x)
    a = ctx.axis(int(ctx.attr("axis", 1)), len(shape))
    flat = b.reshape(x, [math.prod(shape[:a]), math.prod(shape[a:])])
    return [b.reshape(_hardmax(b, flat, 1), shape)]


@register("Hardmax", since=13)
def hardmax(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    return [_hardmax(b, x, ctx.axis(int(ctx.attr("axis", -1)), b.rank(x)))]


def _hardmax(b: PrimBuilder, x: str, a: int) -> str:
    """1 at the first greatest value along axis a, 0 elsewhere, as onnxruntime scans: NaN is skipped,
    but a row whose first value is NaN has no greatest value (all zeros)."""
    shape = b.shape(x)
    n = shape[a]
    if not all(shape):
        raise Unsupported(f"Hardmax of an empty tensor {list(shape)}")
    nan = b.unary(Prim.ISNAN, x)
    m = b.reduce(Prim.REDUCE_MAX, b.emit(Prim.WHERE, [nan, b.scalar(-math.inf, x), x]), [a])
    m = b.where(b.slice_axis(nan, a, 0, 1), b.scalar(math.nan, m), m)  # a NaN first holds the scan
    iota = b.positions(n, a, len(shape))
    first = b.reduce(Prim.REDUCE_MIN, b.where(b.binary(Prim.EQUAL, x, m), iota, b.fill(n, [], DType.INT64)), [a])
    return b.cast(b.binary(Prim.EQUAL, iota, first), b.dtype(x))
