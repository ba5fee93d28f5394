"""NumPy kernels of the reference interpreter for the sliding-window and linear
primitives: WINDOW_REDUCE, MATMUL, CONV and CONV_TRANSPOSE.

The interpreter must run whole models (SegFormer-B0 at 512x512, EfficientViT-B0
at 2048x2048) in float64, so the convolutions avoid Python loops over pixels:
- 1x1 convolutions are one batched GEMM;
- depthwise convolutions are a sum of shifted, strided slices times a weight,
  one multiply-add per kernel offset over the whole tensor;
- any other convolution is im2col (a `sliding_window_view`, copied in chunks of
  output rows so the column buffer stays near `_CHUNK_BYTES`) times the weight.
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_CHUNK_BYTES = 64 << 20  # im2col buffer budget per GEMM: keeps peak memory bounded


def acc_dtype(dt: np.dtype) -> np.dtype:
    """The accumulator of a sum or product: float16 accumulates in float32 (as
    onnxruntime and GPU libraries do); every other type in itself."""
    return np.dtype(np.float32) if dt == np.float16 else np.dtype(dt)


def _out_extent(size: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    return (size + pb + pe - (d * (k - 1) + 1)) // s + 1


def _pad_spatial(x: np.ndarray, n: int, pads: Sequence[int], value: float | int | bool = 0) -> np.ndarray:
    """Pad the trailing `n` dims of x by pads (begins then ends)."""
    if not any(pads):
        return x
    width = [(0, 0)] * (x.ndim - n) + [(int(pads[i]), int(pads[i + n])) for i in range(n)]
    return np.pad(x, width, mode="constant", constant_values=value)


def _tap(offset: Sequence[int], out: Sequence[int], strides: Sequence[int],
         dilations: Sequence[int]) -> tuple[slice, ...]:
    """The slice of a padded input that kernel offset `offset` reads for every output position."""
    return tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                 for k, o, s, d in zip(offset, out, strides, dilations))


# ---- WINDOW_REDUCE ---------------------------------------------------------------
def window_reduce(x: np.ndarray, kind: str, kernel: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int], pads: Sequence[int]) -> np.ndarray:
    """Sum or max over windows of the trailing len(kernel) dims.

    Padded positions are filled with the identity of the reduction (0, or the
    lowest value of the type for max), which is the same as skipping them.
    One vectorized update per kernel offset: kernels are small, tensors large.
    """
    n = len(kernel)
    spatial = x.shape[x.ndim - n:]
    out = [_out_extent(spatial[i], kernel[i], strides[i], dilations[i], pads[i], pads[i + n]) for i in range(n)]
    if kind == "sum":
        acc = acc_dtype(x.dtype)
        xp = _pad_spatial(x, n, pads, 0)
        res = np.zeros(x.shape[: x.ndim - n] + tuple(out), dtype=acc)
        for off in itertools.product(*[range(k) for k in kernel]):
            np.add(res, xp[(Ellipsis,) + _tap(off, out, strides, dilations)], out=res, dtype=acc)
        return res.astype(x.dtype, copy=False)
    if kind == "max":
        xp = _pad_spatial(x, n, pads, _lowest(x.dtype))
        res = None
        for off in itertools.product(*[range(k) for k in kernel]):
            tap = xp[(Ellipsis,) + _tap(off, out, strides, dilations)]
            if res is None:
                res = np.array(tap, copy=True)
            else:
                np.maximum(res, tap, out=res)  # propagates NaN, like REDUCE_MAX
        assert res is not None
        return res
    raise ValueError(f"window_reduce kind must be 'sum' or 'max', got {kind!r}")


def _lowest(dt: np.dtype) -> float | int | bool:
    if dt.kind == "f":
        return -np.inf
    if dt.kind in "iu":
        return int(np.iinfo(dt).min)
    return False


# ---- MATMUL ----------------------------------------------------------------------
def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = acc_dtype(a.dtype)
    return np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False)).astype(a.dtype, copy=False)


# ---- CONV ------------------------------------------------------------------------
def conv(x: np.ndarray, w: np.ndarray, strides: Sequence[int], pads: Sequence[int],
         dilations: Sequence[int], group: int) -> np.ndarray:
    """ONNX Conv without bias: x [N, C, *S], w [O, C/group, *K] -> [N, O, *out]."""
    out_dtype = x.dtype
    acc = acc_dtype(x.dtype)
    x, w = x.astype(acc, copy=False), w.astype(acc, copy=False)
    kernel = w.shape[2:]
    n = len(kernel)
    out = tuple(_out_extent(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[i + n])
                for i in range(n))
    xp = _pad_spatial(x, n, pads)
    if all(k == 1 for k in kernel):
        res = _conv_1x1(xp, w, out, strides, group)
    elif w.shape[1] == 1 and group == x.shape[1]:
        res = _conv_depthwise(xp, w, out, strides, dilations)
    else:
        res = _conv_im2col(xp, w, out, strides, dilations, group)
    return res.astype(out_dtype, copy=False)


def _conv_1x1(xp: np.ndarray, w: np.ndarray, out: tuple[int, ...], strides: Sequence[int],
              group: int) -> np.ndarray:
    # A 1x1 conv is a GEMM per image and group: [O/g, C/g] @ [C/g, pixels].
    N, C = xp.shape[:2]
    O = w.shape[0]
    xs = xp[(Ellipsis,) + _tap([0] * len(out), out, strides, [1] * len(out))]
    xs = xs.reshape(N, group, C // group, -1)
    wg = w.reshape(group, O // group, C // group)
    return np.matmul(wg, xs).reshape((N, O) + out)


def _conv_depthwise(xp: np.ndarray, w: np.ndarray, out: tuple[int, ...], strides: Sequence[int],
                    dilations: Sequence[int]) -> np.ndarray:
    # Each output channel o reads input channel o // multiplier: a multiply-add
    # of a shifted slice per kernel offset, vectorized over batch and channels.
    N, C = xp.shape[:2]
    O = w.shape[0]
    if O != C:
        xp = np.repeat(xp, O // C, axis=1)
    n = len(out)
    res = np.zeros((N, O) + out, dtype=xp.dtype)
    tmp = np.empty_like(res)
    for off in itertools.product(*[range(k) for k in w.shape[2:]]):
        wk = w[(slice(None), 0) + off].reshape((O,) + (1,) * n)
        np.multiply(xp[(Ellipsis,) + _tap(off, out, strides, dilations)], wk, out=tmp)
        res += tmp
    return res


def _conv_im2col(xp: np.ndarray, w: np.ndarray, out: tuple[int, ...], strides: Sequence[int],
                 dilations: Sequence[int], group: int) -> np.ndarray:
    N, C = xp.shape[:2]
    O = w.shape[0]
    kernel = w.shape[2:]
    n = len(kernel)
    cg, og = C // group, O // group
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilations))
    # win[n, c, *out, *kernel]: a view, nothing is copied yet.
    win = sliding_window_view(xp, span, axis=tuple(range(2, 2 + n)))
    win = win[(slice(None), slice(None))
              + tuple(slice(None, (o - 1) * s + 1, s) for o, s in zip(out, strides))
              + tuple(slice(None, None, d) for d in dilations)]
    ksize = int(np.prod(kernel))
    rest = int(np.prod(out[1:]))
    row_bytes = N * rest * cg * ksize * xp.dtype.itemsize
    rows = max(1, min(out[0], _CHUNK_BYTES // max(row_bytes, 1)))
    res = np.empty((N, O) + out, dtype=xp.dtype)
    # Columns ordered [n, *out | c, *kernel] so one GEMM with the weight [O/g, C/g*K] does a chunk.
    perm = (0,) + tuple(range(2, 2 + n)) + (1,) + tuple(range(2 + n, 2 + 2 * n))
    for g in range(group):
        wg = w[g * og:(g + 1) * og].reshape(og, cg * ksize).T
        for r0 in range(0, out[0], rows):
            r1 = min(out[0], r0 + rows)
            cols = win[:, g * cg:(g + 1) * cg, r0:r1].transpose(perm).reshape(-1, cg * ksize)
            y = (cols @ wg).reshape((N, r1 - r0) + out[1:] + (og,))
            res[:, g * og:(g + 1) * og, r0:r1] = np.moveaxis(y, -1, 1)
    return res


# ---- CONV_TRANSPOSE --------------------------------------------------------------
def conv_transpose(x: np.ndarray, w: np.ndarray, strides: Sequence[int], pads: Sequence[int],
                   dilations: Sequence[int], group: int, output_padding: Sequence[int]) -> np.ndarray:
    """ONNX ConvTranspose without bias: x [N, C, *I], w [C, O/group, *K] -> [N, O, *out].

    Scatter form: every input pixel adds w * x to the full (unpadded) output at
    stride * i + dilation * k; the pads then crop the full output. One GEMM per
    group and kernel offset, added into a strided slice of the full output.
    """
    out_dtype = x.dtype
    acc = acc_dtype(x.dtype)
    x, w = x.astype(acc, copy=False), w.astype(acc, copy=False)
    N, C = x.shape[:2]
    ins = x.shape[2:]
    kernel = w.shape[2:]
    n = len(kernel)
    cg, og = C // group, w.shape[1]
    full = tuple(s * (i - 1) + d * (k - 1) + 1 + op
                 for i, k, s, d, op in zip(ins, kernel, strides, dilations, output_padding))
    res = np.zeros((N, og * group) + full, dtype=acc)
    xg = x.reshape(N, group, cg, -1)
    for off in itertools.product(*[range(k) for k in kernel]):
        dst = tuple(slice(k * d, k * d + s * (i - 1) + 1, s)
                    for k, d, s, i in zip(off, dilations, strides, ins))
        wk = w[(slice(None), slice(None)) + off].reshape(group, cg, og).transpose(0, 2, 1)
        contrib = np.matmul(wk, xg).reshape((N, og * group) + ins)  # [N, g, O/g, pixels]
        res[(slice(None), slice(None)) + dst] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[i + n]) for i in range(n))
    return res[(slice(None), slice(None)) + crop].astype(out_dtype, copy=False)
