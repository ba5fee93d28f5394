"""Lifetime-based buffer reuse."""
from __future__ import annotations

import torch

from tessera.runtime.buffers import ALIGN, BufferPool, Lifetime, assign


def test_slabs_are_reused_after_the_last_read():
    lts = [Lifetime("a", 1000, 0, 1), Lifetime("b", 1000, 1, 2), Lifetime("c", 900, 2, 3), Lifetime("d", 500, 3, 9)]
    sizes, where = assign(lts)
    assert where["c"] == where["a"]  # a is dead after step 1, c is written at step 2
    assert where["b"] != where["a"]  # b is written while a is read
    assert where["d"] == where["b"] and len(sizes) == 2
    assert all(s % ALIGN == 0 for s in sizes)


def test_a_step_never_writes_into_what_it_reads():
    lts = [Lifetime("x", 64, 0, 1), Lifetime("y", 64, 1, 2)]
    _, where = assign(lts)
    assert where["x"] != where["y"]


def test_pool_views_have_their_types():
    lts = [Lifetime("a", 4 * 6, 0, 1), Lifetime("b", 2 * 5, 2, 3)]
    pool = BufferPool(lts, {"a": ((2, 3), torch.float32), "b": ((5,), torch.float16)}, torch.device("cpu"))
    assert pool.views["a"].shape == (2, 3) and pool.views["b"].dtype == torch.float16
    assert pool.views["a"].data_ptr() == pool.views["b"].data_ptr()  # b reuses a's slab
    assert len(pool.slabs) == 1
