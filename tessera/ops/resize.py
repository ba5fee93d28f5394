"""Resize and Upsample, split axis by axis into constant-index layout primitives.

Every output coordinate maps to source coordinates that depend only on the
shapes and attributes, so fission computes them with NumPy:
- nearest: one index vector per resized axis, applied by `layout.select`
  (a GATHER with a constant int64 index tensor, or a strided SLICE / a repeat by
  BROADCAST where the indices have that form);
- linear: per resized axis, the two neighbours lo and hi are selected and
  blended with constant weights, lo*w_lo + hi*w_hi (N-linear interpolation is
  separable, so axis by axis gives the same value);
- cubic: likewise with four taps, floor(x) - 1 .. floor(x) + 2 (clamped into the
  axis), weighted by Keys' cubic convolution of parameter `cubic_coeff_a`; with
  `exclude_outside` the taps off the axis weigh 0 and the rest are renormalised.

Coordinates are computed in float32 in onnxruntime's order of operations, so
ties of the nearest modes round the way the reference does.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tessera.ops.layout import select
from tessera.ops.registry import OpCtx, Unsupported, register

_F = np.float32
_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_ONE_TAP = {"linear": 0, "cubic": 1}  # the tap that takes all the weight at a whole coordinate


def _coords(mode: str, n_out: int, n_in: int, scale: np.float32) -> np.ndarray:
    """x_original of every output position along one axis (float32)."""
    x = np.arange(n_out, dtype=_F)
    half = _F(0.5)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if n_out > 1 else np.zeros(n_out, _F)
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if mode == "align_corners":
        return x * _F(n_in - 1) / _F(n_out - 1) if n_out > 1 else np.zeros(n_out, _F)
    # half_pixel_symmetric: onnxruntime forms the offset in float and the rest
    # in double, rounding to float once at the end.
    adjustment = _F(n_out) / (scale * _F(n_in))
    offset = _F(n_in) / _F(2) * (_F(1) - adjustment)
    x64 = np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(scale) - 0.5
    return x64.astype(_F)


# onnxruntime treats a coordinate within this distance of k + 0.5 as the tie
# (measured: 2**-20 away is a tie, 1.01e-6 away is not), so a half that float
# arithmetic misses by an ulp still rounds the preferred way.
_TIE = 1e-6


def _nearest(xo: np.ndarray, mode: str, n_in: int, shrinking: bool) -> np.ndarray:
    """Source index of every output position; negative x only ever clamps to 0."""
    x = xo.astype(np.float64)  # exact: the decisions are about the float32 values
    fl = np.floor(x)
    tie = np.abs(x - fl - 0.5) < _TIE
    if mode == "round_prefer_floor":
        i = np.where(tie, np.floor(x + 0.5 - _TIE), np.floor(x + 0.5))
    elif mode == "round_prefer_ceil":
        i = np.where(tie, np.ceil(x - 0.5 + _TIE), np.floor(x + 0.5))
    elif mode == "floor":
        i = fl
    elif mode == "ceil":
        i = np.ceil(x)
    else:  # "simple", opsets < 11: ceil when shrinking, truncation when growing
        i = np.ceil(x) if shrinking else np.trunc(x)
    return np.clip(i, 0, n_in - 1).astype(np.int64)


def _linear(xo: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lo, hi, w_lo, w_hi): neighbours of the clamped coordinate and their weights."""
    x = np.clip(xo, _F(0), _F(n_in - 1))
    lo = np.minimum(x.astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    w_hi = np.abs(x - lo.astype(_F))
    w_lo = np.abs(x - hi.astype(_F))
    edge = lo == hi  # at the last element the one neighbour takes all the weight
    w_lo[edge], w_hi[edge] = 1, 0
    return lo, hi, w_lo, w_hi


def _cubic(xo: np.ndarray, n_in: int, a: float, exclude_outside: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(indices, weights) of the four taps of every output position, in onnxruntime's float32
    arithmetic: the coordinate is not clamped, the taps' indices are (the edge repeats)."""
    a = _F(a)
    fl = np.floor(xo)
    s = (xo - fl).astype(_F)
    one, two = _F(1), _F(2)
    t0, t3 = s + one, two - s
    w = [((a * t0 - _F(5) * a) * t0 + _F(8) * a) * t0 - _F(4) * a,
         ((a + two) * s - (a + _F(3))) * s * s + one,
         ((a + two) * (one - s) - (a + _F(3))) * (one - s) * (one - s) + one,
         ((a * t3 - _F(5) * a) * t3 + _F(8) * a) * t3 - _F(4) * a]
    taps = [fl.astype(np.int64) - 1 + k for k in range(4)]
    if exclude_outside:
        w = [np.where((t >= 0) & (t < n_in), wk, _F(0)).astype(_F) for t, wk in zip(taps, w)]
        total = w[0] + w[1] + w[2] + w[3]
        w = [wk / total for wk in w]
    return [np.clip(t, 0, n_in - 1) for t in taps], [wk.astype(_F) for wk in w]


def _blend(ctx: OpCtx, x: str, axis: int, taps: Sequence[np.ndarray], weights: Sequence[np.ndarray]) -> str:
    """The sum of tap k times weight k along one axis, the weights broadcast over the other axes (a
    tap whose weight is 0 everywhere is left out)."""
    b = ctx.b
    shape = [1] * b.rank(x)
    shape[axis] = len(taps[0])
    dt = b.dtype(x)
    terms = [b.mul(select(b, x, {axis: t}), b.const(w.reshape(shape), "w_tap", dtype=dt, wide=True))
             for t, w in zip(taps, weights) if w.any()]
    y = terms[0]
    for t in terms[1:]:
        y = b.add(y, t)
    return y


def _resize(ctx: OpCtx, scales: Sequence[float] | None, sizes: Sequence[int] | None,
            axes: Sequence[int] | None, mode: str, coord: str, nearest: str, policy: str,
            cubic_a: float = -0.75, exclude_outside: bool = False) -> str:
    """Resize input 0 by `scales` or to `sizes`, both listed for `axes` (default: all)."""
    b, x = ctx.b, ctx.input(0)
    shape = b.shape(x)
    r = len(shape)
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.fail(f"unknown mode '{mode}'")
    if coord == "tf_crop_and_resize":
        raise Unsupported("coordinate_transformation_mode 'tf_crop_and_resize'")
    if coord not in _COORD_MODES:
        raise ctx.fail(f"unknown coordinate_transformation_mode '{coord}'")
    if mode == "nearest" and nearest not in _NEAREST_MODES + ("simple",):
        raise ctx.fail(f"unknown nearest_mode '{nearest}'")
    if mode != "nearest" and not b.dtype(x).is_float:
        raise Unsupported(f"{mode} Resize of {b.dtype(x).value}")
    if any(d == 0 for d in shape):
        raise Unsupported("Resize of an empty tensor")
    axes = list(range(r)) if axes is None else [ctx.axis(int(a), r) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {list(axes)} repeat an axis")
    scale, out = [_F(1)] * r, list(shape)
    if scales is not None and sizes is None:
        if len(scales) != len(axes):
            raise ctx.fail(f"{len(scales)} scales for {len(axes)} axes")
        for a, s in zip(axes, scales):
            if not s > 0:
                raise ctx.fail(f"scale {s} is not positive")
            scale[a] = _F(s)
            out[a] = int(_F(s) * _F(shape[a]))  # onnxruntime: a float product, truncated
    elif sizes is not None and scales is None:
        if len(sizes) != len(axes) or any(n < 0 for n in sizes):
            raise ctx.fail(f"sizes {list(sizes)} do not fit axes {axes}")
        for a, n in zip(axes, sizes):
            scale[a], out[a] = _F(n) / _F(shape[a]), int(n)
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise ctx.fail(f"unknown keep_aspect_ratio_policy '{policy}'")
            pick = min if policy == "not_larger" else max
            s = pick(scale[a] for a in axes)
            for a in axes:  # one scale for all axes; sizes rounded half up
                scale[a], out[a] = s, math.floor(float(s * _F(shape[a])) + 0.5)
    else:
        raise ctx.fail("needs exactly one of scales and sizes")
    if any(n == 0 for n in out):
        raise Unsupported(f"Resize gives an empty tensor {out}")

    # onnxruntime returns a copy when no extent changes, whatever the scales;
    # otherwise every axis of scale != 1 is resampled, even one that keeps its size.
    if out == list(shape):
        return x
    resized = [a for a in range(r) if scale[a] != 1]
    if mode == "nearest":
        return select(b, x, {a: _nearest(_coords(coord, out[a], shape[a], scale[a]), nearest, shape[a],
                                         scale[a] < 1) for a in resized})
    # Axes whose source coordinates are all whole need no blend: one select
    # for all of them first (they never grow), then the blends, shrinking first.
    picks, blends = {}, []
    for a in sorted(resized, key=lambda a: out[a] / shape[a]):
        xo = _coords(coord, out[a], shape[a], scale[a])
        if mode == "linear":
            lo, hi, w_lo, w_hi = _linear(xo, shape[a])
            taps, weights = [lo, hi], [w_lo, w_hi]
        else:
            taps, weights = _cubic(xo, shape[a], cubic_a, exclude_outside)
        if any((w != (1 if k == _ONE_TAP[mode] else 0)).any() for k, w in enumerate(weights)):
            blends.append((a, taps, weights))
        else:  # every position reads one tap at weight 1
            picks[a] = taps[_ONE_TAP[mode]]
    y = select(b, x, picks)
    for blend in blends:
        y = _blend(ctx, y, *blend)
    return y


def _legacy(ctx: OpCtx, scales: Sequence[float] | None, upsample: bool) -> list[str]:
    """Upsample and Resize-10: scales only, asymmetric coordinates."""
    if scales is None:
        raise ctx.fail("needs scales")
    if upsample and any(s < 1 for s in scales):
        raise ctx.fail(f"Upsample scales {list(scales)} must be >= 1")
    return [_resize(ctx, scales, None, None, ctx.attr("mode", "nearest"), "asymmetric", "simple", "stretch")]


def _floats(v: np.ndarray | None) -> list[float] | None:
    return None if v is None or v.size == 0 else [float(s) for s in np.asarray(v, dtype=_F).reshape(-1)]


@register("Upsample", since=7)
def upsample7(ctx: OpCtx) -> list[str]:
    s = ctx.attr("scales")
    return _legacy(ctx, None if s is None else [float(v) for v in s], upsample=True)


@register("Upsample", since=9)
def upsample9(ctx: OpCtx) -> list[str]:
    return _legacy(ctx, _floats(ctx.const(1)), upsample=True)


@register("Resize", since=10)
def resize10(ctx: OpCtx) -> list[str]:
    return _legacy(ctx, _floats(ctx.const(1)), upsample=False)


def _resize_inputs(ctx: OpCtx, with_axes: bool) -> list[str]:
    """Opsets 11+: inputs (X, roi, scales, sizes); roi only matters for tf_crop_and_resize."""
    if with_axes and int(ctx.attr("antialias", 0)):
        raise Unsupported("Resize with antialias")
    sizes_v = ctx.const(3)
    sizes = None if sizes_v is None or sizes_v.size == 0 else [int(n) for n in sizes_v.reshape(-1)]
    axes = ctx.attr("axes") if with_axes else None
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch") if with_axes and sizes else "stretch"
    return [_resize(ctx, _floats(ctx.const(2)), sizes, None if axes is None else [int(a) for a in axes],
                    ctx.attr("mode", "nearest"), ctx.attr("coordinate_transformation_mode", "half_pixel"),
                    ctx.attr("nearest_mode", "round_prefer_floor"), policy, float(ctx.attr("cubic_coeff_a", -0.75)),
                    bool(int(ctx.attr("exclude_outside", 0))))]


@register("Resize", since=11)
def resize11(ctx: OpCtx) -> list[str]:
    return _resize_inputs(ctx, with_axes=False)


@register("Resize", since=13)
def resize13(ctx: OpCtx) -> list[str]:
    # roi and scales became optional; tf_half_pixel_for_nn was dropped from the
    # spec, but onnxruntime still runs it, so it is accepted here too.
    return _resize_inputs(ctx, with_axes=False)


@register("Resize", since=18)
def resize18(ctx: OpCtx) -> list[str]:
    # axes, keep_aspect_ratio_policy and antialias are new.
    return _resize_inputs(ctx, with_axes=True)


@register("Resize", since=19)
def resize19(ctx: OpCtx) -> list[str]:
    # half_pixel_symmetric is new; `_coords` handles it at every opset, as onnxruntime does.
    return _resize_inputs(ctx, with_axes=True)
