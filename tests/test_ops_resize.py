"""Fission rules of ops/resize.py (Resize, Upsample) against onnxruntime."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from opcheck import Const, build_model, check_op, rand

from tessera.fission import fission
from tessera.frontend import load

F32 = np.float32
COORD_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
INDEX_PRIMS = {"gather", "slice", "reshape", "broadcast"}  # what nearest may emit


def _ops(pg) -> list[str]:
    return [n.op for n in pg.nodes]


def _scales(*s: float) -> Const:
    return Const(np.array(s, dtype=F32))


def _sizes(*s: int) -> Const:
    return Const(np.array(s, dtype=np.int64))


def _inputs(x: np.ndarray, scales: Const | None = None, sizes: Const | None = None) -> dict:
    """Resize-11+ inputs: X, an empty roi, scales (empty when sizes are given), sizes.

    Opset 11 requires roi and scales to be present, so they are empty tensors, not omitted.
    """
    inputs: dict = {"x": x, "roi": Const(np.zeros(0, F32))}
    if scales is not None:
        inputs["scales"] = scales
    else:
        inputs["scales"] = Const(np.zeros(0, F32))
        inputs["sizes"] = sizes
    return inputs


def _resize(x: np.ndarray, attrs: dict, opset: int, scales: Const | None = None, sizes: Const | None = None,
            **kw):
    return check_op("Resize", _inputs(x, scales, sizes), attrs, opset=opset, **kw)


def _opaque_reasons(inputs: dict, attrs: dict, opset: int) -> list[str]:
    return [o.reason for o in fission(load(build_model("Resize", inputs, attrs, opset=opset)).graph).opaque]


# ---- nearest ---------------------------------------------------------------------------------
NEAREST_SCALES = [
    (1, 1, 1.7, 0.6),  # non-integer up and down
    (1, 1, 2.5, 0.43),
    (1, 1, 0.5, 3.0),  # integer factors
    (1, 2, 1.0, 1.3),  # channels too
]


@pytest.mark.parametrize("scales", NEAREST_SCALES)
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("coord", COORD_MODES)
def test_nearest_scales(coord, nearest, scales):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    pg = _resize(rand(2, 3, 7, 5, seed=1), attrs, 19, scales=_scales(*scales))
    assert set(_ops(pg)) <= INDEX_PRIMS, _ops(pg)


@pytest.mark.parametrize("sizes", [(2, 3, 11, 3), (2, 3, 4, 13), (1, 3, 7, 2)])
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("coord", COORD_MODES)
def test_nearest_sizes(coord, nearest, sizes):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    pg = _resize(rand(2, 3, 7, 5, seed=2), attrs, 19, sizes=_sizes(*sizes))
    assert set(_ops(pg)) <= INDEX_PRIMS, _ops(pg)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
def test_nearest_opsets(coord, opset):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": "round_prefer_ceil"}
    x = rand(1, 2, 5, 11, seed=3)
    _resize(x, attrs, opset, scales=_scales(1, 1, 1.5, 0.7), expect_prims=["gather"])
    _resize(x, attrs, opset, sizes=_sizes(1, 2, 9, 4), expect_prims=["gather"])


def test_nearest_non_integer_is_gather_only():
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel"}
    pg = _resize(rand(1, 1, 7, 5, seed=4), attrs, 19, scales=_scales(1, 1, 1.7, 1.3))
    assert set(_ops(pg)) == {"gather"} and _ops(pg).count("gather") == 2


def test_nearest_integer_upscale_is_broadcast():
    # Each source row and column repeated: one RESHAPE, BROADCAST, RESHAPE for both axes.
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    pg = _resize(rand(2, 3, 5, 7, seed=5), attrs, 19, scales=_scales(1, 1, 2, 3))
    assert _ops(pg) == ["reshape", "broadcast", "reshape"]
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel"}
    pg = _resize(rand(2, 3, 5, 7, seed=5), attrs, 19, scales=_scales(1, 1, 2, 2))
    assert _ops(pg) == ["reshape", "broadcast", "reshape"]


def test_nearest_integer_downscale_is_slice():
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    pg = _resize(rand(2, 3, 8, 9, seed=6), attrs, 19, scales=_scales(1, 1, 0.5, 1 / 3))
    assert _ops(pg) == ["slice"]


def test_linear_whole_coordinates_need_no_blend():
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    pg = _resize(rand(2, 3, 7, 9, seed=14), attrs, 19, sizes=_sizes(2, 3, 4, 5))
    assert _ops(pg) == ["slice"]  # rows 0, 2, 4, 6 and columns 0, 2, 4, 6, 8 in one strided slice


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_same_size_axes(mode):
    # onnxruntime copies the input when no extent changes, whatever the scales (3 * 1.3 -> 3) ...
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    pg = _resize(rand(2, 3, 3, 5, seed=21), attrs, 19, scales=_scales(1, 1, 1.3, 1.0))
    assert _ops(pg) == ["reshape"]
    # ... but resamples an axis of scale 1.3 that keeps its size once another axis changes.
    _resize(rand(2, 3, 3, 5, seed=21), attrs, 19, scales=_scales(1, 1, 1.3, 1.2))


def test_identity_emits_nothing():
    pg = _resize(rand(2, 3, 5, 7, seed=7), {"mode": "linear"}, 19, scales=_scales(1, 1, 1, 1))
    assert _ops(pg) == ["reshape"]  # only the copy to the graph output


def test_nearest_tf_half_pixel_for_nn():
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    _resize(rand(1, 2, 5, 7, seed=8), attrs, 11, scales=_scales(1, 1, 1.6, 0.6))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8])  # onnxruntime has no int64 Resize
def test_nearest_integer_data(dtype):
    x = np.random.default_rng(9).integers(1, 100, size=(1, 2, 5, 7)).astype(dtype)
    _resize(x, {"mode": "nearest"}, 19, scales=_scales(1, 1, 1.5, 0.8))


@pytest.mark.parametrize("shape,scales", [((7,), (2.3,)), ((3, 4, 5), (0.7, 1.5, 2.0)),
                                          ((1, 2, 3, 4, 5), (1, 1, 1.5, 0.6, 2.2))])
def test_nearest_other_ranks(shape, scales):
    _resize(rand(*shape, seed=10), {"mode": "nearest"}, 19, scales=_scales(*scales))


# ---- linear ------------------------------------------------------------------------------------
LINEAR_CASES = [  # shape, scales (onnxruntime's linear kernels take 2-D, 3-D, and 4-D/5-D NC...)
    ((2, 3, 7, 5), (1, 1, 1.7, 0.6)),
    ((2, 3, 7, 5), (1, 1, 2.0, 3.0)),
    ((2, 3, 7, 5), (1, 1, 0.5, 0.43)),
    ((1, 2, 4, 6), (1, 1, 2.5, 1.0)),
    ((7, 11), (1.3, 0.8)),
    ((3, 5, 6), (2.0, 0.5, 1.5)),
    ((1, 2, 3, 5, 7), (1, 1, 1.5, 0.6, 2.2)),
]


@pytest.mark.parametrize("shape,scales", LINEAR_CASES)
@pytest.mark.parametrize("coord", COORD_MODES)
def test_linear_scales(coord, shape, scales):
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    pg = _resize(rand(*shape, seed=11), attrs, 19, scales=_scales(*scales))
    # Where every source coordinate is whole (align_corners shrinking 7 -> 3) no blend is needed.
    assert set(_ops(pg)) <= INDEX_PRIMS | {"mul", "add"}, _ops(pg)


@pytest.mark.parametrize("sizes", [(2, 3, 12, 3), (2, 3, 3, 13), (2, 3, 1, 1), (2, 3, 7, 9)])
@pytest.mark.parametrize("coord", COORD_MODES)
def test_linear_sizes(coord, sizes):
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    _resize(rand(2, 3, 7, 5, seed=12), attrs, 19, sizes=_sizes(*sizes))


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
def test_linear_opsets(coord, opset):
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    x = rand(1, 2, 5, 11, seed=13)
    _resize(x, attrs, opset, scales=_scales(1, 1, 1.5, 0.7), expect_prims=["mul", "add"])
    _resize(x, attrs, opset, sizes=_sizes(1, 2, 9, 4), expect_prims=["mul", "add"])


# ---- opset 18+: axes, keep_aspect_ratio_policy --------------------------------------------
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("axes,scales", [([2, 3], (1.7, 0.6)), ([3, 2], (2.0, 0.5)), ([3], (1.5,)),
                                         ([-1, -2], (0.6, 1.7))])
def test_axes_scales(axes, scales, mode):
    _resize(rand(2, 3, 7, 5, seed=15), {"mode": mode, "axes": axes}, 18, scales=_scales(*scales))


# Without axes, not_smaller would resize N and C too, which onnxruntime's linear kernels
# refuse: that combination is not generated.
KEEP_ASPECT_RATIO_CASES = [
    pytest.param(axes, sizes, policy, mode, opset,
                 id=f"{'None' if axes is None else f'axes{i}'}-sizes{i}-{policy}-{mode}-{opset}")
    for opset, mode, policy, (i, (axes, sizes)) in itertools.product(
        [18, 19], ["nearest", "linear"], ["stretch", "not_larger", "not_smaller"],
        enumerate([(None, (2, 3, 11, 9)), ([2, 3], (4, 6)), ([3, 2], (12, 10))]))
    if not (axes is None and policy == "not_smaller" and mode == "linear")
]


@pytest.mark.parametrize("axes,sizes,policy,mode,opset", KEEP_ASPECT_RATIO_CASES)
def test_keep_aspect_ratio(axes, sizes, policy, mode, opset):
    attrs = {"mode": mode, "keep_aspect_ratio_policy": policy} | ({"axes": axes} if axes else {})
    _resize(rand(2, 3, 7, 5, seed=16), attrs, opset, sizes=_sizes(*sizes))


# ---- opset 10 Resize, Upsample ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2.0, 3.0), (1, 1, 1.7, 0.6), (1, 1, 0.5, 0.43), (1, 1, 2.5, 1.0)])
def test_resize10(scales, mode):
    check_op("Resize", {"x": rand(2, 3, 7, 5, seed=17), "scales": _scales(*scales)}, {"mode": mode}, opset=10)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2.0, 2.0), (1, 1, 1.5, 2.7), (1, 1, 3.0, 1.0)])
def test_upsample9(scales, mode):
    pg = check_op("Upsample", {"x": rand(1, 3, 5, 7, seed=18), "scales": _scales(*scales)}, {"mode": mode}, opset=9)
    if mode == "nearest" and scales[2:] == (2.0, 2.0):
        assert _ops(pg) == ["reshape", "broadcast", "reshape"]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample7(mode):
    check_op("Upsample", {"x": rand(1, 3, 5, 7, seed=19)}, {"mode": mode, "scales": [1.0, 1.0, 2.0, 1.5]}, opset=7)


# ---- cubic ----------------------------------------------------------------------------------------
CUBIC_SCALES = [(1, 1, 2.0, 2.0), (1, 1, 1.7, 0.6), (1, 1, 0.5, 0.43), (1, 1, 2.5, 1.0), (1, 1, 0.5, 0.5)]


@pytest.mark.parametrize("scales", CUBIC_SCALES)
@pytest.mark.parametrize("coord", COORD_MODES)
def test_cubic_scales(coord, scales):
    """Four taps a position, the edge repeated where they leave the axis (Keys, a = -0.75)."""
    check_op("Resize", _inputs(rand(1, 2, 5, 7, seed=21), scales=_scales(*scales)), {"mode": "cubic",
             "coordinate_transformation_mode": coord}, opset=19)


@pytest.mark.parametrize("a,exclude", [(-0.5, 0), (-0.75, 1), (-0.5, 1)])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric"])
def test_cubic_coefficient_and_exclude_outside(coord, a, exclude):
    """exclude_outside: taps off the axis weigh 0 and the rest are renormalised (PyTorch's bicubic
    exports a = -0.75 with exclude_outside 0; TensorFlow's a = -0.5 with 1)."""
    check_op("Resize", _inputs(rand(1, 2, 6, 5, seed=22), sizes=_sizes(1, 2, 11, 3)), {"mode": "cubic",
             "coordinate_transformation_mode": coord, "cubic_coeff_a": a, "exclude_outside": exclude}, opset=13)


def test_cubic_at_whole_coordinates_is_a_pick_and_fp16_blends():
    """Halving with asymmetric coordinates reads every other element at weight 1: no blend."""
    pg = check_op("Resize", _inputs(rand(1, 2, 8, 6, seed=23), scales=_scales(1, 1, 0.5, 0.5)),
                  {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, opset=13)
    assert "mul" not in _ops(pg), _ops(pg)
    check_op("Resize", _inputs(rand(1, 3, 5, 4, seed=24).astype(np.float16), scales=_scales(1, 1, 1.6, 2.5)),
             {"mode": "cubic"}, opset=13, tol=2e-3)


# ---- unsupported ------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs,why", [
    ({"mode": "linear", "antialias": 1}, "antialias"),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}, "tf_crop_and_resize"),
])
def test_unsupported_is_opaque(attrs, why):
    inputs = {"x": rand(1, 2, 5, 7, seed=20), "roi": Const(np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], F32)),
              "scales": _scales(1, 1, 0.6, 1.5)}
    reasons = _opaque_reasons(inputs, attrs, 19)
    assert reasons and why in reasons[0]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_blend_weights_stay_float32_in_a_narrow_plan(precision):
    """A Resize's blend weights are the operator's own arithmetic, which onnxruntime and PyTorch keep
    in float32 under half precision: the precision pass leaves them float32 (Graph.wide_constants),
    while the model's data and weights narrow (fuzz seed 5302, tests/fuzzregressions.py)."""
    from tessera.ir import DType
    from tessera.rewrite import convert_precision

    model = build_model("Resize", _inputs(rand(1, 2, 9, 7, seed=31), scales=_scales(1, 1, 2.0, 1.5)),
                        {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, opset=13)
    pg = fission(load(model).graph).graph
    taps = {t for n in pg.nodes for t in n.inputs if "w_tap" in t}
    assert taps and taps == set(pg.wide_constants)
    narrow = convert_precision(pg, precision)
    assert {narrow.types[t].dtype for t in taps} == {DType.FLOAT32}
    assert all(np.array_equal(narrow.constants[t], pg.constants[t]) for t in taps)  # not rounded
    assert narrow.types["x"].dtype is DType.FLOAT32  # a model input: the boundary keeps its declared type
    assert {narrow.types[n.outputs[0]].dtype for n in narrow.nodes if n.op == "mul"} == \
        {DType.FLOAT16 if precision == "fp16" else DType.BFLOAT16}
