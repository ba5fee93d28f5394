"""Pooling operators: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

Windowed pooling becomes one WINDOW_REDUCE ("max" or "sum"). Average pooling
then divides by the number of elements each window counted, which depends on
the pads, ceil_mode and count_include_pad but never on the data: fission
computes it here, as a FILL when it is the same everywhere and as a constant
tensor otherwise.

Output extents and divisors follow onnxruntime (compared over every small 1-D
combination of kernel, stride, dilation, pads, ceil_mode, count_include_pad and
auto_pad when this was written; tests/test_ops_pooling.py keeps a grid):
- ceil_mode rounds the window count up, but a window must start inside the
  input or its begin pad; one that would start in the end pad is dropped.
- count_include_pad=1 counts the window's positions inside the padded input
  [-pad_begin, size + pad_end), so windows that ceil_mode lets run past the end
  pad count fewer; count_include_pad=0 counts positions inside the input.
- auto_pad SAME_* gives ceil(size / stride) outputs whatever ceil_mode says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, float_dtype_check, register



@dataclass(frozen=True)
class _Axis:
    """The geometry of one spatial axis of a pooling window."""

    size: int
    kernel: int
    stride: int
    dilation: int
    pad_begin: int
    pad_end: int
    out: int

    @property
    def span(self) -> int:
        return self.dilation * (self.kernel - 1) + 1

    def counts(self, include_pad: bool) -> np.ndarray:
        """Per output position: how many window taps land inside the input
        (or inside the padded input when include_pad)."""
        lo, hi = (-self.pad_begin, self.size + self.pad_end) if include_pad else (0, self.size)
        taps = (np.arange(self.out)[:, None] * self.stride + np.arange(self.kernel)[None, :] * self.dilation
                - self.pad_begin)
        return ((taps >= lo) & (taps < hi)).sum(axis=1)

    def reduce_pad_end(self) -> int:
        """The end pad that gives WINDOW_REDUCE exactly `out` windows: ceil_mode
        may need more than the ONNX pad, and unused ONNX pad is dropped."""
        return max(0, (self.out - 1) * self.stride + self.span - self.size - self.pad_begin)


# ---- attribute helpers --------------------------------------------------------
def _window_axes(ctx: OpCtx, x: str, ceil_attr: bool, dilation_attr: bool) -> list[_Axis]:
    """Read the pooling attributes of this opset and resolve the output extents."""
    shape = ctx.b.shape(x)
    if len(shape) < 3:
        raise ctx.fail(f"{ctx.node.op} needs X [N, C, *spatial], got {list(shape)}")
    ks = ctx.attr("kernel_shape")
    if ks is None:
        raise ctx.fail("attribute kernel_shape is required")
    ks = [int(k) for k in ks]
    n = len(ks)
    if n != len(shape) - 2 or any(k < 1 for k in ks):
        raise ctx.fail(f"kernel_shape {ks} does not fit input {list(shape)}")
    strides = ctx.attr_ints("strides", n, 1)
    dils = ctx.attr_ints("dilations", n, 1) if dilation_attr else [1] * n
    ceil = bool(int(ctx.attr("ceil_mode", 0))) if ceil_attr else False
    if any(s < 1 for s in strides) or any(d < 1 for d in dils):
        raise ctx.fail(f"strides {strides} and dilations {dils} must be positive")
    mode = ctx.auto_pad()
    if mode.startswith("SAME") and any(d != 1 for d in dils):
        # onnxruntime sizes these pads with the undilated kernel and disagrees
        # with ONNX shape inference on the output shape.
        raise Unsupported("auto_pad SAME with dilations")
    pads = ctx.attr_ints("pads", 2 * n, 0) if mode == "NOTSET" else [0] * (2 * n)
    if any(p < 0 for p in pads):
        raise ctx.fail(f"negative pads {pads}")
    axes = []
    for i in range(n):
        size, k, s, d = shape[2 + i], ks[i], strides[i], dils[i]
        span = d * (k - 1) + 1
        pb, pe = pads[i], pads[i + n]
        if mode.startswith("SAME"):
            out = -(-size // s)
            total = max(0, (out - 1) * s + span - size)
            pb, pe = (total // 2, total - total // 2) if mode == "SAME_UPPER" else (total - total // 2, total // 2)
        else:
            room = size + pb + pe - span
            if room < 0:
                # onnxruntime still emits a window here (C division truncates); ONNX says none.
                raise Unsupported(f"window span {span} exceeds padded extent {size + pb + pe}")
            out = (-(-room // s) if ceil else room // s) + 1
            if ceil and (out - 1) * s >= size + pb:
                out -= 1
        axes.append(_Axis(size, k, s, d, pb, pe, out))
    if any(int(a.counts(False).min()) == 0 for a in axes):
        raise Unsupported("a pooling window lies entirely in the padding")
    return axes


def _window_reduce(ctx: OpCtx, x: str, kind: str, axes: Sequence[_Axis]) -> str:
    return ctx.b.emit(Prim.WINDOW_REDUCE, [x], {
        "kind": kind,
        "kernel": tuple(a.kernel for a in axes),
        "strides": tuple(a.stride for a in axes),
        "dilations": tuple(a.dilation for a in axes),
        "pads": tuple(a.pad_begin for a in axes) + tuple(a.reduce_pad_end() for a in axes),
    })


# ---- MaxPool ----------------------------------------------------------------------
def _max_pool(ctx: OpCtx, since10: bool) -> list[str]:
    if ctx.output_used(1):
        raise Unsupported("MaxPool output Indices")
    x = ctx.input(0)
    return [_window_reduce(ctx, x, "max", _window_axes(ctx, x, ceil_attr=since10, dilation_attr=since10))]


@register("MaxPool", since=1)
def max_pool1(ctx: OpCtx) -> list[str]:
    # Opset 8 added the Indices output (refused above); 12 added int8/uint8.
    return _max_pool(ctx, since10=False)


@register("MaxPool", since=10)
def max_pool10(ctx: OpCtx) -> list[str]:
    # Opset 10 added ceil_mode and dilations.
    return _max_pool(ctx, since10=True)


# ---- AveragePool ------------------------------------------------------------------
def _average_pool(ctx: OpCtx, count_pad_attr: bool, ceil_attr: bool, dilation_attr: bool) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    dt = float_dtype_check(ctx, x)
    axes = _window_axes(ctx, x, ceil_attr, dilation_attr)
    include_pad = bool(int(ctx.attr("count_include_pad", 0))) if count_pad_attr else False
    total = _window_reduce(ctx, x, "sum", axes)
    counts = [a.counts(include_pad) for a in axes]
    if all(int(c.min()) == int(c.max()) for c in counts):
        return [b.emit(Prim.DIV, [total, b.scalar(math.prod(int(c[0]) for c in counts), total)])]
    # Outer product of the per-axis counts, shaped [1, 1, *out] for the broadcast.
    grid = counts[0]
    for c in counts[1:]:
        grid = np.multiply.outer(grid, c)
    # (float32 in a narrow plan too: bfloat16 holds whole numbers exactly only up to 256, and a 3-D
    # window's count can pass it)
    divisor = b.const(grid.reshape((1, 1) + grid.shape).astype(dt.to_numpy()), hint="pool_count", dtype=dt,
                      wide=True)
    return [b.div(total, divisor)]


@register("AveragePool", since=1)
def average_pool1(ctx: OpCtx) -> list[str]:
    return _average_pool(ctx, count_pad_attr=False, ceil_attr=False, dilation_attr=False)


@register("AveragePool", since=7)
def average_pool7(ctx: OpCtx) -> list[str]:
    # Opset 7 added count_include_pad.
    return _average_pool(ctx, count_pad_attr=True, ceil_attr=False, dilation_attr=False)


@register("AveragePool", since=10)
def average_pool10(ctx: OpCtx) -> list[str]:
    # Opset 10 added ceil_mode.
    return _average_pool(ctx, count_pad_attr=True, ceil_attr=True, dilation_attr=False)


@register("AveragePool", since=19)
def average_pool19(ctx: OpCtx) -> list[str]:
    # Opset 19 added dilations.
    return _average_pool(ctx, count_pad_attr=True, ceil_attr=True, dilation_attr=True)


# ---- global pooling -----------------------------------------------------------------
def _spatial_axes(ctx: OpCtx, x: str) -> list[int]:
    rank = ctx.b.rank(x)
    if rank < 3:
        raise Unsupported(f"{ctx.node.op} on rank {rank}: no spatial dims")
    return list(range(2, rank))


@register("GlobalAveragePool", since=1)
def global_average_pool(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    axes = _spatial_axes(ctx, x)
    n = math.prod(b.shape(x)[a] for a in axes)
    total = b.reduce(Prim.REDUCE_SUM, x, axes)
    return [total if n == 1 else b.mul_scalar(total, 1.0 / n)]


@register("GlobalMaxPool", since=1)
def global_max_pool(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    return [b.reduce(Prim.REDUCE_MAX, x, _spatial_axes(ctx, x))]
