"""Lifetime-based buffer reuse."""
from __future__ import annotations

import torch

from tessera.ir.dtype import DType
from tessera.ir.graph import TensorType
from tessera.runtime.buffers import ALIGN, BufferPool, Lifetime, as_layout, assign


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


def test_a_tensor_two_kernels_write_keeps_one_slab_while_it_lives():
    # Redundant computation: steps 0 and 1 both write "t" (read until step 3). Then "u" and "v" live
    # together from steps 4 and 5 to the end; no two tensors alive at once may share a slab.
    lts = [Lifetime("t", 2, 0, 3), Lifetime("a", 12, 0, 5), Lifetime("t", 2, 1, 3),
           Lifetime("u", 4, 4, 6), Lifetime("v", 24, 5, 6)]
    _, where = assign(lts)
    spans: dict[str, tuple[int, int]] = {}
    for lt in lts:
        lo, hi = spans.get(lt.tensor, (lt.first, lt.last))
        spans[lt.tensor] = (min(lo, lt.first), max(hi, lt.last))
    for x, (x0, x1) in spans.items():
        for y, (y0, y1) in spans.items():
            if x < y and x0 <= y1 and y0 <= x1:
                assert where[x] != where[y], (x, y)
    sizes = {lt.tensor: lt.nbytes // 2 for lt in lts}
    pool = BufferPool(lts, {n: TensorType((k,), DType.FLOAT16) for n, k in sizes.items()}, torch.device("cpu"))
    assert pool.views["u"].data_ptr() != pool.views["v"].data_ptr()


def test_pool_views_have_their_types():
    lts = [Lifetime("a", 4 * 6, 0, 1), Lifetime("b", 2 * 5, 2, 3)]
    pool = BufferPool(lts, {"a": TensorType((2, 3), DType.FLOAT32), "b": TensorType((5,), DType.FLOAT16)},
                      torch.device("cpu"))
    assert pool.views["a"].shape == (2, 3) and pool.views["b"].dtype == torch.float16
    assert pool.views["a"].data_ptr() == pool.views["b"].data_ptr()  # b reuses a's slab
    assert len(pool.slabs) == 1


def test_pool_views_are_stored_in_their_layout():
    # NHWC storage of a [1, 3, 2, 2] tensor: the view is logical NCHW with channels-last strides.
    pool = BufferPool([Lifetime("a", 4 * 12, 0, 1)], {"a": TensorType((1, 3, 2, 2), DType.FLOAT32, (0, 2, 3, 1))},
                      torch.device("cpu"))
    v = pool.views["a"]
    assert v.shape == (1, 3, 2, 2) and v.stride() == (12, 1, 6, 3)
    assert v.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 2, 2)
    assert torch.equal(as_layout(x, (0, 2, 3, 1)), x) and as_layout(v, (0, 2, 3, 1)) is v
    assert as_layout(x, ()) is x and as_layout(v, ()).is_contiguous()
