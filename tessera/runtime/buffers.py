"""Buffers allocated once and reused by lifetime.

Each tensor a generated kernel writes gets a view into a slab. A slab is free
again after the last kernel that reads its tensor; a later tensor that fits
takes the smallest free slab (best fit), else a new slab is made. Graph
outputs get slabs of their own. Views are made once, so the same addresses
serve every call, which CUDA-graph replay requires.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

ALIGN = 256  # bytes; what cudaMalloc guarantees and vectorized loads like


@dataclass(frozen=True)
class Lifetime:
    tensor: str
    nbytes: int
    first: int  # step that writes it
    last: int  # last step that reads it (a graph output: past the end)


def assign(lifetimes: Sequence[Lifetime]) -> tuple[list[int], dict[str, int]]:
    """Slab sizes and the slab of each tensor."""
    sizes: list[int] = []
    free: list[int] = []
    where: dict[str, int] = {}
    by_first: dict[int, list[Lifetime]] = {}
    by_last: dict[int, list[Lifetime]] = {}
    for lt in lifetimes:
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

    def __init__(self, lifetimes: Sequence[Lifetime], types: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                 device: torch.device) -> None:
        sizes, where = assign(lifetimes)
        self.slabs = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
        self.views: dict[str, torch.Tensor] = {}
        for lt in lifetimes:
            shape, dtype = types[lt.tensor]
            self.views[lt.tensor] = self.slabs[where[lt.tensor]][:lt.nbytes].view(dtype).view(shape)

    @property
    def nbytes(self) -> int:
        return sum(s.numel() for s in self.slabs)
