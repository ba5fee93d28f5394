"""Index inputs checked inside the CUDA graph, so a call pays no host time for the check.

A gather reads whatever memory lies past its table's end, so every call checks the integer inputs
that feed gathers against the sizes they index (`ir/indices.py`). Checked per call with torch ops
(compare, compare, and, all, assert: five launches), the check cost about 75 µs of host time on
the H100 machine's CPU (session 32), a quarter of GPT-2's GPU time. One Triton kernel per index
input, captured at the head of the executable's CUDA graph, checks the graph's own input buffers
on every replay, whoever wrote them; a value out of range stops the stream with a device-side
assert before any gather runs.
"""
from __future__ import annotations

import os

import torch

from tessera.ir.indices import assert_in_range_async

BLOCK = 1024


def check_in_graph(v: torch.Tensor, n: int, name: str) -> None:
    """Launch the check of `v` against [-n, n) on `v`'s stream (captured when a graph is). Triton's
    interpreter drops device asserts, so there (and for a CPU tensor) it is the torch ops' check."""
    if not v.is_cuda or os.environ.get("TRITON_INTERPRET") == "1" or not v.numel():
        assert_in_range_async(v, n, name)
        return
    from tessera.runtime.index_check_kernel import index_in_range  # Triton on first use

    x = v if v.is_contiguous() else v.contiguous()
    index_in_range[((x.numel() + BLOCK - 1) // BLOCK,)](x, x.numel(), n, BLOCK=BLOCK)
