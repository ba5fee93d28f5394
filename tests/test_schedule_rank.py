"""The schedule model's ranking of generated kernels' schedules (`cost/schedule_model.py`)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tessera.codegen.kernels import generate
from tessera.cost.schedule_model import gathers_inner, rank_kernel
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir.graph import Graph


def _resize(shape: tuple[int, ...], scales: tuple[int, ...]) -> Graph:
    """A bilinear half-pixel Resize of an fp16 tensor (segformer_b0's decoder upsampling) as primitives."""
    out = [d * f for d, f in zip(shape, scales)]
    node = helper.make_node("Resize", ["x", "", "sc"], ["out"], mode="linear",
                            coordinate_transformation_mode="half_pixel")
    m = helper.make_model(helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, out)],
        [numpy_helper.from_array(np.array(scales, np.float32), "sc")]), opset_imports=[helper.make_opsetid("", 20)])
    return fission(load(m).graph).graph


def _per_thread(s) -> float:
    return s.xblock / (32 * s.num_warps)


def _gather_last(shape: tuple[int, ...], n: int, seed: int = 5) -> Graph:
    """x[..., idx] with `n` constant indices in no pattern (a load of the index per element)."""
    idx = np.random.default_rng(seed).integers(0, shape[-1], n)
    node = helper.make_node("Gather", ["x", "i"], ["out"], axis=len(shape) - 1)
    m = helper.make_model(helper.make_graph(
        [node], "gather", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [*shape[:-1], n])],
        [numpy_helper.from_array(idx, "i")]), opset_imports=[helper.make_opsetid("", 20)])
    return fission(load(m).graph).graph


def test_a_kernel_gathering_along_its_contiguous_axis_ranks_four_elements_a_thread_first():
    # Each element loads its 64-bit index, then its value with a scalar load. segformer_b0's bilinear
    # W pass, tables loaded, ran 8.7 us at 4 elements a thread and 13.1 at 8 on the H200 (session 44).
    g = _gather_last((1, 256, 128, 64), 128)
    ks = generate(g, g.nodes, list(g.outputs), "gather")
    assert gathers_inner(g, ks)
    _, ranked = rank_kernel(g, ks)
    assert [_per_thread(s) for s in ranked[:2]] == [4, 4]


def test_a_resize_that_computes_its_indices_keeps_the_streaming_ranking():
    # A 2x W pass computes its indices from the position (`ir.tables`): so it ran 4.75 us at 8
    # elements a thread and 6.1-6.2 at 4 on the H200 (session 44, `gather_probe.py --generated`).
    g = _resize((1, 256, 128, 64), (1, 1, 1, 2))
    ks = generate(g, g.nodes, list(g.outputs), "w_pass")
    assert "tl.load(in1" not in ks.source and not gathers_inner(g, ks)
    _, ranked = rank_kernel(g, ks)
    assert _per_thread(ranked[0]) >= 8


def test_a_kernel_gathering_rows_keeps_the_streaming_ranking():
    # The H pass picks whole rows, which stay contiguous: a strided copy, best at large blocks
    # (4.3 us at 16 elements a thread on the H200, 6.2 at 4).
    g = _resize((1, 256, 64, 128), (1, 1, 2, 1))
    ks = generate(g, g.nodes, list(g.outputs), "h_pass")
    assert not gathers_inner(g, ks)
    _, ranked = rank_kernel(g, ks)
    assert _per_thread(ranked[0]) >= 8
