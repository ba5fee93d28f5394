"""Fission rules of ops/pooling.py against onnxruntime.

The ceil_mode / pads / count_include_pad grids below include windows that run
past the padded input, where the divisor and the output extent are easiest to
get wrong.

Most cases run at opset 22: onnxruntime drops a ceil_mode window that would
start in the end pad at every opset, but ONNX shape inference does so only from
opset 22 (whose spec states the rule), and check_op declares the inferred shapes.
"""
from __future__ import annotations

import numpy as np
import pytest
from opcheck import build_model, check_op, rand, run_ort

from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.tolerance import rel_l2


def _ops(pg) -> list[str]:
    return [n.op for n in pg.nodes]


def _opaque_reasons(model) -> list[str]:
    return [o.reason for o in fission(load(model).graph).opaque]


# ---- MaxPool ---------------------------------------------------------------------------
POOL_CASES = {
    "2d_k3s2p1": ((2, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "2d_default_stride": ((1, 2, 7, 6), {"kernel_shape": [2, 3]}),
    "2d_asym_pads": ((1, 2, 11, 7), {"kernel_shape": [3, 2], "strides": [3, 2], "pads": [0, 1, 2, 1]}),
    "2d_ceil": ((1, 3, 10, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "2d_ceil_pads": ((1, 2, 8, 9), {"kernel_shape": [3, 2], "strides": [3, 2], "pads": [1, 1, 2, 1],
                                     "ceil_mode": 1}),
    "2d_ceil_drop_last": ((1, 1, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                          "ceil_mode": 1}),
    "2d_dilated": ((1, 2, 13, 12), {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [1, 2]}),
    "2d_dilated_ceil_pads": ((1, 2, 12, 13), {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [2, 3],
                                              "pads": [2, 1, 1, 2], "ceil_mode": 1}),
    "1d": ((2, 3, 17), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    "1d_ceil_dilated": ((2, 3, 17), {"kernel_shape": [3], "strides": [4], "dilations": [2], "ceil_mode": 1}),
    "3d": ((1, 2, 6, 7, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "pads": [0, 1, 1, 1, 1, 0]}),
    "same_upper": ((1, 2, 9, 10), {"kernel_shape": [4, 3], "strides": [2, 3], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 2, 9, 10), {"kernel_shape": [4, 3], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "same_upper_ceil": ((1, 2, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER",
                                        "ceil_mode": 1}),
    "valid": ((1, 2, 9, 10), {"kernel_shape": [3, 4], "strides": [2, 3], "auto_pad": "VALID"}),
    "valid_ceil": ((1, 2, 9, 10), {"kernel_shape": [2, 4], "strides": [2, 3], "auto_pad": "VALID", "ceil_mode": 1}),
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_max_pool(case):
    xs, attrs = POOL_CASES[case]
    pg = check_op("MaxPool", {"x": rand(*xs, seed=1)}, attrs, opset=22)
    assert _ops(pg) == ["window_reduce"]
    assert pg.nodes[0].attrs["kind"] == "max"


@pytest.mark.parametrize("opset", [1, 8, 10, 11, 12, 22])
def test_max_pool_opsets(opset):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]}
    if opset >= 10:
        attrs["ceil_mode"] = 1
    check_op("MaxPool", {"x": rand(1, 3, 8, 9, seed=1)}, attrs, opset=opset)


def test_max_pool_int8():
    x = np.random.default_rng(0).integers(-128, 128, size=(1, 2, 7, 9)).astype(np.int8)
    check_op("MaxPool", {"x": x}, {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 1, 0, 1]}, opset=12)


def test_max_pool_indices_unsupported():
    model = build_model("MaxPool", {"x": rand(1, 2, 6, 6, seed=1)}, {"kernel_shape": [2, 2]}, n_outputs=2, opset=12)
    reasons = _opaque_reasons(model)
    assert len(reasons) == 1 and "Indices" in reasons[0]


def test_max_pool_same_dilated_unsupported():
    model = build_model("MaxPool", {"x": rand(1, 2, 8, 8, seed=1)},
                        {"kernel_shape": [3, 3], "dilations": [2, 2], "auto_pad": "SAME_UPPER"})
    assert len(_opaque_reasons(model)) == 1


# ---- AveragePool -------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(POOL_CASES))
@pytest.mark.parametrize("include_pad", [0, 1], ids=["excl", "incl"])
def test_average_pool(case, include_pad):
    xs, attrs = POOL_CASES[case]
    pg = check_op("AveragePool", {"x": rand(*xs, seed=1)}, {**attrs, "count_include_pad": include_pad}, opset=22)
    assert _ops(pg).count("window_reduce") == 1
    assert "div" in _ops(pg)


# Every combination of pads and ceil_mode over 1-D extents where windows hang past
# the end pad, in 1-D so that a wrong count cannot hide behind an average.
@pytest.mark.parametrize("size", [5, 6, 7])
@pytest.mark.parametrize("pads", [[0, 0], [1, 0], [0, 1], [1, 2], [2, 2]])
@pytest.mark.parametrize("ceil", [0, 1])
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_1d_grid(size, pads, ceil, include_pad):
    check_op("AveragePool", {"x": rand(1, 2, size, seed=size)},
             {"kernel_shape": [3], "strides": [2], "pads": pads, "ceil_mode": ceil,
              "count_include_pad": include_pad}, opset=22)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("opset", [10, 19, 20])
def test_ceil_mode_drops_window_in_end_pad(op, opset):
    # Before opset 22 ONNX shape inference keeps the last window (4 outputs here)
    # and onnxruntime drops it (3). tessera follows onnxruntime; input_shapes
    # turns off the frontend's check against the declared shape.
    x = rand(2, 3, 5, seed=1)
    attrs = {"kernel_shape": [2], "strides": [2], "pads": [1, 1], "ceil_mode": 1}
    model = build_model(op, {"x": x}, attrs, opset=opset)
    (ref,) = run_ort(model, {"x": x})
    pg = fission(load(model, input_shapes={"x": x.shape}).graph).graph
    out = interp.run(pg, {"x": x})[pg.outputs[0]]
    assert ref.shape == out.shape == (2, 3, 3)
    assert rel_l2(out, ref) < 1e-5


def test_average_pool_uniform_count_is_fill():
    pg = check_op("AveragePool", {"x": rand(2, 3, 8, 9, seed=1)}, {"kernel_shape": [2, 3], "strides": [2, 3]})
    assert sorted(_ops(pg)) == ["div", "fill", "window_reduce"]
    pg = check_op("AveragePool", {"x": rand(2, 3, 8, 9, seed=1)},
                  {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1})
    assert sorted(_ops(pg)) == ["div", "fill", "window_reduce"]


def test_average_pool_count_is_constant():
    pg = check_op("AveragePool", {"x": rand(1, 2, 7, 7, seed=1)}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    div = next(n for n in pg.nodes if n.op == "div")
    producers = pg.producers()
    # The divisor is a [1, 1, 7, 7] constant (broadcast over N and C), not a FILL.
    src = div.inputs[1]
    while src in producers:
        src = producers[src].inputs[0]
    assert src in pg.constants and pg.constants[src].shape == (1, 1, 7, 7)
    assert src in pg.wide_constants  # float32 in a narrow plan: bfloat16 holds whole numbers only to 256


def test_a_3d_window_count_past_256_divides_exactly_in_bf16():
    """A 7x7x7 window without padding counted: 343 elements in the interior, which bfloat16 would
    round to 344; the count stays float32 (Graph.wide_constants), so the plan divides by 343."""
    from tessera.ir import DType
    from tessera.rewrite import convert_precision

    pg = check_op("AveragePool", {"x": rand(1, 1, 9, 9, 9, seed=4)},
                  {"kernel_shape": [7, 7, 7], "pads": [3, 3, 3, 3, 3, 3]})
    (count,) = [t for t in pg.wide_constants if "pool_count" in t]
    assert pg.constants[count].max() == 343
    narrow = convert_precision(pg, "bf16")
    assert narrow.types[count].dtype is DType.FLOAT32 and narrow.constants[count].max() == 343


@pytest.mark.parametrize("opset", [7, 10, 11, 19, 22])
def test_average_pool_opsets(opset):
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [0, 1, 1, 0]}
    if opset >= 7:
        attrs["count_include_pad"] = 1
    if opset >= 10:
        attrs["ceil_mode"] = 1
    if opset >= 19:
        attrs["dilations"] = [1, 2]
    check_op("AveragePool", {"x": rand(1, 3, 9, 8, seed=1)}, attrs, opset=opset)


def test_average_pool_opset1():
    # onnxruntime has no AveragePool before opset 7, and opset 1 means opset 7 with
    # count_include_pad=0 (its spec: "divided by the number of elements exclude pad").
    x = rand(1, 3, 9, 8, seed=1)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}
    (ref,) = run_ort(build_model("AveragePool", {"x": x}, attrs, opset=7), {"x": x})
    pg = fission(load(build_model("AveragePool", {"x": x}, attrs, opset=1)).graph).graph
    out = interp.run(pg, {"x": x})[pg.outputs[0]]
    assert out.shape == ref.shape and rel_l2(out, ref) < 1e-5


# ---- global pooling ------------------------------------------------------------------------
@pytest.mark.parametrize("xs", [(2, 3, 7, 5), (2, 3, 11), (1, 2, 3, 5, 7), (1, 4, 1, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_global_average_pool(xs):
    check_op("GlobalAveragePool", {"x": rand(*xs, seed=1)}, expect_prims=["reduce_sum"])


def test_global_average_pool_structure():
    pg = check_op("GlobalAveragePool", {"x": rand(2, 3, 7, 5, seed=1)})
    assert sorted(_ops(pg)) == ["fill", "mul", "reduce_sum"]


@pytest.mark.parametrize("xs", [(2, 3, 7, 5), (2, 3, 11), (1, 2, 3, 5, 7)], ids=lambda s: "x".join(map(str, s)))
def test_global_max_pool(xs):
    pg = check_op("GlobalMaxPool", {"x": rand(*xs, seed=1)})
    assert _ops(pg) == ["reduce_max"]
