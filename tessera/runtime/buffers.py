"""Buffers allocated once and reused by lifetime.

Each tensor a generated kernel writes gets a view into a slab. A slab is free
again after the last kernel that reads its tensor; a later tensor that fits
takes the smallest free slab (best fit), else a new slab is made. Graph
outputs get slabs of their own. Views are made once, so the same addresses
serve every call, which CUDA-graph replay requires.
"""
from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from tessera.errors import ResourceError
from tessera.ir.graph import TensorType, layout_strides
from tessera.runtime.torch_prims import TORCH_DTYPES

ALIGN = 256  # bytes; what cudaMalloc guarantees and vectorized loads like

# Device copies of large constants, by content: the executables of one model's shape buckets hold
# the same weights, and share one copy of each while any of them lives.
_SHARED: "weakref.WeakValueDictionary[tuple[Any, ...], torch.Tensor]" = weakref.WeakValueDictionary()
SHARE_BYTES = 1 << 16


def device_constant(value: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`value` (an array) on `device` as `dtype`; one copy per content, device and dtype when large."""
    a = np.array(value, order="C")
    if a.nbytes < SHARE_BYTES:
        return torch.from_numpy(a).to(device, dtype)
    key = (hashlib.sha1(a.data).hexdigest(), a.dtype.str, a.shape, str(device), dtype)
    t = _SHARED.get(key)
    if t is None:
        t = torch.from_numpy(a).to(device, dtype)
        _SHARED[key] = t
    return t


@dataclass(frozen=True)
class Lifetime:
    tensor: str
    nbytes: int
    first: int  # step that writes it
    last: int  # last step that reads it (a graph output: past the end)


def merged(lifetimes: Sequence[Lifetime]) -> list[Lifetime]:
    """One lifetime per tensor, from its first write to its last read. A plan may compute a value in
    two kernels that both write it (redundant computation); two lifetimes of one tensor gave it two
    slabs and released the second twice, so two later tensors shared it (fuzz seed 5211: an fp16
    GatherND's output read the LayerNorm's)."""
    by_tensor: dict[str, Lifetime] = {}
    for lt in lifetimes:
        seen = by_tensor.get(lt.tensor)
        by_tensor[lt.tensor] = lt if seen is None else Lifetime(
            lt.tensor, max(seen.nbytes, lt.nbytes), min(seen.first, lt.first), max(seen.last, lt.last))
    return list(by_tensor.values())


def assign(lifetimes: Sequence[Lifetime]) -> tuple[list[int], dict[str, int]]:
    """Slab sizes and the slab of each tensor."""
    sizes: list[int] = []
    free: list[int] = []
    where: dict[str, int] = {}
    by_first: dict[int, list[Lifetime]] = {}
    by_last: dict[int, list[Lifetime]] = {}
    for lt in merged(lifetimes):
        by_first.setdefault(lt.first, []).append(lt)
        by_last.setdefault(lt.last, []).append(lt)
    steps = sorted(set(by_first) | set(by_last))
    for s in steps:
        for lt in sorted(by_first.get(s, []), key=lambda lt: -lt.nbytes):
            need = -(-max(lt.nbytes, 1) // ALIGN) * ALIGN
            fits = [i for i in free if sizes[i] >= need]
            if fits:
                slab = min(fits, key=lambda i: sizes[i])
                free.remove(slab)
            else:
                slab = len(sizes)
                sizes.append(need)
            where[lt.tensor] = slab
        # Released after the step: its own outputs never share a slab with its inputs.
        for lt in by_last.get(s, []):
            free.append(where[lt.tensor])
    return sizes, where


class BufferPool:
    """The slabs on one device and a typed view per tensor."""

    def __init__(self, lifetimes: Sequence[Lifetime], types: Mapping[str, TensorType], device: torch.device) -> None:
        sizes, where = assign(lifetimes)  # a tensor listed twice gets one slab, and one view below
        try:
            self.slabs = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            raise ResourceError(f"the plan's buffers need {sum(sizes) / 2**30:.1f} GiB on {device}, "
                                f"which cannot be allocated ({str(e).splitlines()[0][:120]})") from None
        self.views: dict[str, torch.Tensor] = {}
        for lt in lifetimes:
            t = types[lt.tensor]
            flat = self.slabs[where[lt.tensor]][:lt.nbytes].view(TORCH_DTYPES[t.dtype])
            # Memory holds the tensor in its storage order; the view shows the logical dims.
            self.views[lt.tensor] = flat.view(t.storage_shape).permute(*inverse_perm(t.layout)) if t.layout \
                else flat.view(t.shape)

    @property
    def nbytes(self) -> int:
        return sum(s.numel() for s in self.slabs)


def inverse_perm(perm: Sequence[int]) -> list[int]:
    """The permutation that undoes `perm`: storage dims back to logical dims."""
    inv = [0] * len(perm)
    for pos, d in enumerate(perm):
        inv[d] = pos
    return inv


def as_layout(x: torch.Tensor, layout: Sequence[int]) -> torch.Tensor:
    """`x` with the strides of `layout` (row-major when empty): itself when it has them already,
    else a copy. Size-1 dims are ignored, as their stride never moves an address."""
    if not layout:
        return x if x.is_contiguous() else x.contiguous()
    want = layout_strides(tuple(x.shape), tuple(layout))
    if all(a == b or n == 1 for a, b, n in zip(x.stride(), want, x.shape)):
        return x
    y = torch.empty([x.shape[d] for d in layout], dtype=x.dtype, device=x.device).permute(*inverse_perm(layout))
    return y.copy_(x)


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to tf32 (to nearest, ties away), bit for bit as a template's in-loop
    rounding (`codegen.triton_ops.TF32_ROUND`) would round them; infinities and NaN unchanged."""
    r = ((x.view(torch.int32) + 4096) & -8192).view(torch.float32)
    return torch.where(x.abs() < float("inf"), r, x)


def stored_constant(x: torch.Tensor, layout: Sequence[int] | None, tf32: bool) -> torch.Tensor:
    """A constant as a kernel reads it (`KernelSource.input_layouts` and `rounded_inputs`): in
    `layout`'s storage order (None: as it is), rounded to tf32 where `tf32`."""
    y = round_tf32(x) if tf32 else x
    return as_layout(y, layout) if layout is not None else y
