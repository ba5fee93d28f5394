"""Fission rules of ops/normalization.py against onnxruntime: softmax, the
normalizations and the Reduce* family."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from opcheck import Const, build_model, check_op, rand, run_ort
from tessera.errors import TesseraError
from tessera.fission import fission
from tessera.ops.registry import lower_node
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ops import Unsupported
from tessera.ops.normalization import CUMSUM_MAX
from tessera.tolerance import rel_l2

SOFTMAX_PRIMS = ["reduce_max", "broadcast", "sub", "exp", "reduce_sum", "div"]
LOG_SOFTMAX_PRIMS = ["reduce_max", "broadcast", "sub", "exp", "reduce_sum", "log"]
NORM_PRIMS = ["reduce_sum", "fill", "mul", "sub", "sqrt", "reciprocal", "broadcast"]


def _declare(model, *shapes, elem: int = TensorProto.FLOAT):
    """Give a build_model model's outputs explicit types (for models loaded directly)."""
    for out, shape in zip(model.graph.output, shapes):
        out.CopyFrom(helper.make_tensor_value_info(out.name, elem, list(shape)))
    return model


def _lower(op: str, inputs: dict, attrs: dict | None = None, opset: int = 20) -> Graph:
    """Apply op's fission rule directly, without the frontend (for models it
    cannot load); `Const` inputs become constants. The graph's outputs are the rule's."""
    g = Graph(name="t", kind=GraphKind.PRIMITIVE, opsets={"": opset})
    for name, v in inputs.items():
        arr = v.value if isinstance(v, Const) else np.asarray(v)
        g.types[name] = TensorType(arr.shape, DType.from_numpy(arr.dtype))
        if isinstance(v, Const):
            g.constants[name] = arr
        else:
            g.inputs.append(name)
    node = Node(name=f"{op.lower()}_0", op=op, inputs=tuple(inputs), outputs=("y",), attrs=attrs or {})
    g.outputs = lower_node(PrimBuilder(g), node, opset)
    return g


def _opaque_reasons(model) -> dict[str, str]:
    """op type -> why fission left it opaque."""
    return {o.op_type: o.reason for o in fission(load(model).graph).opaque}


def _positive(*shape: int, seed: int) -> np.ndarray:
    return rand(*shape, seed=seed, lo=0.5, hi=2.0)


# ---- Softmax / LogSoftmax -------------------------------------------------------
@pytest.mark.parametrize("shape,axis", [
    ((7,), -1), ((3, 5), 1), ((3, 5), 0), ((2, 3, 7), -1), ((2, 3, 7), -2),
    ((2, 5, 3, 11), 2), ((2, 5, 3, 11), -4), ((4, 1), 1),
])
@pytest.mark.parametrize("op,prims", [("Softmax", SOFTMAX_PRIMS), ("LogSoftmax", LOG_SOFTMAX_PRIMS)])
def test_softmax_axis(op, prims, shape, axis):
    x = rand(*shape, seed=len(shape) * 10 + axis)
    expect = prims if shape[axis] > 1 else None  # extent 1: nothing to broadcast
    check_op(op, {"x": x}, {"axis": axis}, opset=13, expect_prims=expect)


# Negative axes from opset 11: those combinations are not generated at opset 1.
SOFTMAX_FLATTENED_CASES = [
    pytest.param(op, opset, shape, axis, id=f"shape{i}-{axis}-{opset}-{op}")
    for op, opset, (i, (shape, axis)) in itertools.product(
        ["Softmax", "LogSoftmax"], [1, 11],
        enumerate([((2, 3, 5), 1), ((2, 3, 5), 0), ((3, 4, 5, 7), 2), ((5, 13), 1), ((5, 13), -1)]))
    if not (opset == 1 and axis < 0)
]


@pytest.mark.parametrize("op,opset,shape,axis", SOFTMAX_FLATTENED_CASES)
def test_softmax_flattened_tail(op, opset, shape, axis):
    pg = check_op(op, {"x": rand(*shape, seed=axis + 7)}, {"axis": axis}, opset=opset)
    (red,) = [n for n in pg.nodes if n.op == "reduce_max"]
    assert tuple(red.attrs["axes"]) == tuple(range(axis % len(shape), len(shape)))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_default_axis_by_opset(op):
    x = rand(3, 4, 5, seed=3)
    check_op(op, {"x": x}, opset=11)  # axis 1, over dims 1 and 2
    check_op(op, {"x": x}, opset=13)  # axis -1


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_is_stable_on_large_inputs(op):
    # exp(500) overflows float32: only the max-shifted form is finite.
    x = rand(4, 9, seed=11, lo=-500.0, hi=500.0)
    check_op(op, {"x": x}, {"axis": -1}, opset=13)


def test_softmax_float16():
    check_op("Softmax", {"x": rand(3, 17, seed=5).astype(np.float16)}, {"axis": -1}, opset=13, tol=1e-2)


def test_softmax_bad_axis_names_node():
    with pytest.raises(TesseraError, match="softmax_0"):
        load(_declare(build_model("Softmax", {"x": rand(2, 3, seed=1)}, {"axis": 2}, opset=13), (2, 3)))


# ---- LayerNormalization ---------------------------------------------------------
@pytest.mark.parametrize("shape,axis,pshape", [
    ((2, 3, 8), -1, (8,)),
    ((3, 5, 7), 1, (5, 7)),
    ((3, 5, 7), -2, (5, 7)),
    ((3, 5, 7), 1, (7,)),  # broadcast over the normalized shape
    ((4, 13), 0, (4, 13)),
    ((2, 3, 5, 11), -1, (11,)),
])
def test_layer_norm(shape, axis, pshape):
    check_op("LayerNormalization",
             {"x": rand(*shape, seed=1), "scale": Const(rand(*pshape, seed=2)), "bias": Const(rand(*pshape, seed=3))},
             {"axis": axis}, opset=17, expect_prims=NORM_PRIMS)


def test_layer_norm_inputs_not_constant_no_bias_and_epsilon():
    check_op("LayerNormalization", {"x": rand(6, 10, seed=4), "scale": rand(10, seed=5)},
             {"epsilon": 1e-2}, opset=17)


def test_layer_norm_large_mean():
    # A mean much larger than the spread: E[x^2]-E[x]^2 would lose ~1e-4 here.
    x = rand(4, 33, seed=6) + np.float32(100.0)
    check_op("LayerNormalization", {"x": x, "scale": Const(rand(33, seed=7)), "b": Const(rand(33, seed=8))},
             opset=17)


@pytest.mark.parametrize("n_outputs", [2, 3])
@pytest.mark.parametrize("axis,pshape", [(-1, (7,)), (1, (5, 7))])
def test_layer_norm_optional_outputs(n_outputs, axis, pshape):
    check_op("LayerNormalization",
             {"x": rand(3, 5, 7, seed=9), "scale": Const(rand(*pshape, seed=10)), "b": Const(rand(*pshape, seed=11))},
             {"axis": axis}, n_outputs=n_outputs, opset=17)


def test_layer_norm_inv_std_without_mean():
    """Outputs (Y, "", InvStdDev): the rule must not hand Mean to InvStdDev's slot."""
    model = build_model("LayerNormalization",
                        {"x": rand(4, 6, seed=12), "scale": Const(rand(6, seed=13))}, n_outputs=3, opset=17)
    node = model.graph.node[0]
    node.output[1] = ""
    del model.graph.output[1]
    feeds = {"x": rand(4, 6, seed=12)}
    ref = run_ort(model, feeds)
    pg = fission(load(model).graph).graph
    assert all(n.op != "opaque" for n in pg.nodes)
    got = interp.run(pg, feeds)
    assert pg.outputs == ["out0", "out2"]
    for name, r in zip(pg.outputs, ref):
        assert got[name].shape == r.shape and rel_l2(got[name], r) < 1e-5, name


def test_layer_norm_float16_stashes_float32():
    x = rand(3, 24, seed=14).astype(np.float16)
    pg = check_op("LayerNormalization", {"x": x, "scale": Const(rand(24, seed=15).astype(np.float16))},
                  n_outputs=3, opset=17, tol=1e-2, expect_prims=["cast"])
    assert pg.types[pg.outputs[1]].dtype.value == "float32"


def test_layer_norm_scale_must_broadcast():
    with pytest.raises(TesseraError, match="layernormalization_0"):
        load(_declare(build_model("LayerNormalization", {"x": rand(3, 4, seed=1), "scale": Const(rand(5, seed=2))},
                                  opset=17), (3, 4)))


# ---- InstanceNormalization ------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 3, 7), (1, 5, 2, 3, 3), (3, 1, 11)])
def test_instance_norm(shape):
    c = shape[1]
    check_op("InstanceNormalization",
             {"x": rand(*shape, seed=20), "scale": Const(rand(c, seed=21)), "b": Const(rand(c, seed=22))},
             opset=6, expect_prims=NORM_PRIMS + ["reshape"])


def test_instance_norm_epsilon_and_opset22():
    check_op("InstanceNormalization",
             {"x": rand(2, 3, 4, 5, seed=23), "scale": rand(3, seed=24), "b": rand(3, seed=25)},
             {"epsilon": 0.1}, opset=22)


def test_instance_norm_float16():
    h = np.float16
    inp = {"x": rand(2, 3, 64, seed=26).astype(h),
           "scale": Const(rand(3, seed=27).astype(h)), "b": Const(rand(3, seed=28).astype(h))}
    check_op("InstanceNormalization", inp, opset=6, tol=1e-2)


# ---- BatchNormalization ---------------------------------------------------------
def _bn_inputs(shape, seed: int, dtype=np.float32, pdtype=None, sdtype=None) -> dict:
    c = shape[1]
    pdtype, sdtype = pdtype or dtype, sdtype or dtype
    return {"x": rand(*shape, seed=seed).astype(dtype),
            "scale": Const(rand(c, seed=seed + 1).astype(pdtype)), "b": Const(rand(c, seed=seed + 2).astype(pdtype)),
            "mean": Const(rand(c, seed=seed + 3).astype(sdtype)),
            "var": Const(_positive(c, seed=seed + 4).astype(sdtype))}


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(5, 3), (2, 7, 5), (2, 3, 5, 7), (1, 6, 2, 3, 5)])
def test_batch_norm(opset, shape):
    check_op("BatchNormalization", _bn_inputs(shape, seed=30), opset=opset,
             expect_prims=["mul", "add", "broadcast", "reshape"])


def test_batch_norm_runtime_statistics_and_epsilon():
    inp = {"x": rand(2, 4, 3, 3, seed=40), "scale": rand(4, seed=41), "b": rand(4, seed=42),
           "mean": rand(4, seed=43), "var": _positive(4, seed=44)}
    check_op("BatchNormalization", inp, {"epsilon": 1e-3}, opset=15)


def test_batch_norm_mixed_types_opset15():
    check_op("BatchNormalization", _bn_inputs((2, 3, 4, 5), seed=45, dtype=np.float16, pdtype=np.float32,
                                              sdtype=np.float32), opset=15, tol=1e-2)


def test_batch_norm_training_is_unsupported():
    # The frontend cannot type this node at all (onnxruntime will not run it), so call the rule.
    with pytest.raises(Unsupported, match="training_mode"):
        _lower("BatchNormalization", _bn_inputs((2, 3, 4), seed=50), {"training_mode": 1}, opset=15)


def test_batch_norm_non_spatial_is_opaque():
    inp = _bn_inputs((2, 3, 4), seed=51)
    c = Const(rand(3, 4, seed=52))
    inp = {**inp, "scale": c, "b": c, "mean": c, "var": Const(_positive(3, 4, seed=53))}
    model = _declare(build_model("BatchNormalization", inp, {"spatial": 0}, opset=7), (2, 3, 4))
    assert "spatial" in _opaque_reasons(model)["BatchNormalization"]


# ---- GroupNormalization ---------------------------------------------------------
GROUP_CASES = [((2, 6, 5), 3), ((1, 4, 3, 3), 2), ((2, 9, 7), 3), ((2, 5, 3, 2), 1), ((2, 5, 3, 2), 5), ((3, 4), 2)]


@pytest.mark.parametrize("shape,groups", GROUP_CASES)
def test_group_norm21(shape, groups):
    c = shape[1]
    check_op("GroupNormalization",
             {"x": rand(*shape, seed=60), "scale": Const(rand(c, seed=61)), "bias": Const(rand(c, seed=62))},
             {"num_groups": groups}, opset=21, expect_prims=NORM_PRIMS + ["reshape"])


@pytest.mark.parametrize("shape,groups", GROUP_CASES)
def test_group_norm18_scale_per_group(shape, groups):
    # The ONNX checker rejects GroupNormalization-18 (deprecated), so neither the
    # frontend nor onnxruntime loads it: check the rule against NumPy.
    x, scale, bias = rand(*shape, seed=66), rand(groups, seed=67), rand(groups, seed=68)
    g = _lower("GroupNormalization", {"x": x, "scale": Const(scale), "bias": Const(bias)},
               {"num_groups": groups, "epsilon": 1e-3}, opset=18)
    xg = x.astype(np.float64).reshape(shape[0], groups, -1)
    ref = (xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-3)
    ref = (ref * scale[:, None] + bias[:, None]).reshape(shape)
    got = interp.run(g, {"x": x})[g.outputs[0]]
    assert got.shape == shape and rel_l2(got, ref) < 1e-5


def test_group_norm_epsilon_and_runtime_params():
    check_op("GroupNormalization", {"x": rand(2, 8, 5, seed=63), "scale": rand(8, seed=64), "bias": rand(8, seed=65)},
             {"num_groups": 4, "epsilon": 0.3}, opset=21)


def _near_coincident(shape, groups: int, spreads, seed: int) -> np.ndarray:
    """rand() input whose groups (n, (3k) % G) of sample n = k % N hold values m * (1 + s_k * noise):
    mean |m| in [1, 2], relative spread s_k. The rest are rand()'s, never zero."""
    rng = np.random.default_rng(seed)
    x = rand(*shape, seed=seed)
    xg = x.reshape(shape[0], groups, -1)
    for k, s in enumerate(spreads):
        m = rng.choice([-1.0, 1.0]) * (1.0 + rng.random())
        xg[k % shape[0], (3 * k) % groups] = m * (1.0 + s * rng.standard_normal(xg.shape[-1]))
    return x


def _group_norm21_float64(x, scale, bias, groups: int, eps: float = 1e-5) -> np.ndarray:
    """GroupNormalization-21 in float64, two passes: scale and bias per channel."""
    xg = x.astype(np.float64).reshape(x.shape[0], groups, -1)
    y = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)).reshape(x.shape)
    view = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    return y * scale.astype(np.float64).reshape(view) + bias.astype(np.float64).reshape(view)


@pytest.mark.parametrize("shape,groups,spreads", [
    ((7, 8, 1), 4, []),  # the fuzzer's shape (fz36.fail2): two values per group
    ((7, 8, 1), 4, [1e-3]),
    ((7, 8, 1), 4, [1e-3, 1e-2, 1e-4]),
    ((3, 8, 4, 4), 4, [1e-2, 1e-2]),
    ((2, 6, 5), 3, [1e-2]),
], ids=["pairs_random", "pairs_1e-3", "pairs_mixed", "16_per_group", "10_per_group"])
def test_group_norm21_nearly_coincident_groups_against_float64(shape, groups, spreads):
    """Groups whose values nearly coincide (variance << mean^2), against float64 with per-channel
    scale and bias: the variance must be the mean of squared deviations. E[x^2] - E[x]^2 in float32
    is 1e-4 to 1e-3 off on these inputs, and that is what onnxruntime computes (it runs ONNX's
    function body for GroupNormalization-21), so check_op's reference would be the wrong one here.
    The primitive graph runs in the interpreter (float32) and compiled (generated kernels)."""
    import torch

    import tessera

    c = shape[1]
    x = _near_coincident(shape, groups, spreads, seed=70)
    scale, bias = rand(c, seed=71), rand(c, seed=72) * np.float32(0.5)
    ref = _group_norm21_float64(x, scale, bias, groups)
    model = build_model("GroupNormalization", {"x": x, "scale": Const(scale), "bias": Const(bias)},
                        {"num_groups": groups, "epsilon": 1e-5}, opset=21)
    pg = fission(load(model).graph).graph
    got = interp.run(pg, {"x": x})[pg.outputs[0]]
    assert got.dtype == np.float32 and rel_l2(got, ref) < 1e-5, rel_l2(got, ref)
    (out,) = tessera.compile(model, tessera.CompileOptions(cost="analytical"))(torch.from_numpy(x))
    assert rel_l2(out.numpy(), ref) < 1e-5, rel_l2(out.numpy(), ref)


def test_group_norm_groups_must_divide_channels():
    with pytest.raises(TesseraError, match="groupnormalization_0"):
        load(_declare(build_model("GroupNormalization", {"x": rand(2, 6, 5, seed=1), "scale": Const(rand(6, seed=2)),
                                                         "bias": Const(rand(6, seed=3))}, {"num_groups": 4}, opset=21),
                      (2, 6, 5)))


# ---- Reduce* --------------------------------------------------------------------
REDUCE_SHAPES = [(3, 5, 7), (2, 3, 5, 11), (13,)]


def _axes_cases(rank: int) -> list[list[int] | None]:
    return [None, [0], [-1], [0, rank - 1], [-2, 0] if rank > 1 else [-1]]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("shape", REDUCE_SHAPES)
@pytest.mark.parametrize("opset", [11, 13])
def test_reduce_sum_axes_attribute_vs_input(opset, shape, keepdims):
    x = rand(*shape, seed=70)
    for axes in _axes_cases(len(shape)):
        if opset < 13:
            attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
            check_op("ReduceSum", {"x": x}, attrs, opset=opset, expect_prims=["reduce_sum"])
        else:
            inp = {"x": x} | ({} if axes is None else {"axes": Const(np.array(axes, np.int64))})
            check_op("ReduceSum", inp, {"keepdims": keepdims}, opset=opset, expect_prims=["reduce_sum"])


@pytest.mark.parametrize("op,prims", [
    ("ReduceMean", ["reduce_sum", "fill", "mul"]), ("ReduceMax", ["reduce_max"]), ("ReduceMin", ["reduce_min"]),
    ("ReduceSumSquare", ["mul", "reduce_sum"]), ("ReduceL1", ["abs", "reduce_sum"]),
    ("ReduceL2", ["mul", "reduce_sum", "sqrt"]), ("ReduceLogSumExp", ["reduce_max", "exp", "reduce_sum", "log"]),
    ("ReduceLogSum", ["reduce_sum", "log"]),
])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_family(op, prims, opset, keepdims):
    for shape in REDUCE_SHAPES:
        x = _positive(*shape, seed=71) if op == "ReduceLogSum" else rand(*shape, seed=71)
        for axes in _axes_cases(len(shape)):
            if opset < 18:
                attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
                check_op(op, {"x": x}, attrs, opset=opset, expect_prims=prims)
            else:
                inp = {"x": x} | ({} if axes is None else {"axes": Const(np.array(axes, np.int64))})
                check_op(op, inp, {"keepdims": keepdims}, opset=opset, expect_prims=prims)


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13), ("ReduceMean", 18), ("ReduceMax", 18),
                                      ("ReduceSumSquare", 18), ("ReduceL1", 18), ("ReduceLogSumExp", 18)])
def test_reduce_noop_with_empty_axes(op, opset):
    x = rand(3, 5, seed=72)
    check_op(op, {"x": x, "axes": Const(np.array([], np.int64))}, {"noop_with_empty_axes": 1}, opset=opset)
    check_op(op, {"x": x}, {"noop_with_empty_axes": 1}, opset=opset)
    # noop only applies to empty axes; with axes it reduces.
    check_op(op, {"x": x, "axes": Const(np.array([1], np.int64))}, {"noop_with_empty_axes": 1}, opset=opset)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integer(op, dtype):
    x = np.random.default_rng(73).integers(-50, 50, size=(4, 7, 3)).astype(dtype)
    check_op(op, {"x": x, "axes": Const(np.array([1, -1], np.int64))}, {"keepdims": 0}, opset=18)


def test_reduce_mean_large_extent():
    check_op("ReduceMean", {"x": rand(3, 1031, seed=74)}, {"axes": [1]}, opset=13)


def test_reduce_mean_integer_is_opaque():
    x = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
    model = _declare(build_model("ReduceMean", {"x": x}, {"axes": [1]}, opset=13), (3, 1), elem=TensorProto.INT32)
    assert "int32" in _opaque_reasons(model)["ReduceMean"]


def test_reduce_runtime_axes_is_unsupported():
    # Axes computed at run time make the output shape unknown: the rule declines.
    with pytest.raises(Unsupported, match="constant"):
        _lower("ReduceSum", {"x": rand(3, 4, seed=1), "axes": np.array([1], np.int64)}, opset=13)


def test_reduce_bad_axis_names_node():
    with pytest.raises(TesseraError, match="reducesum_0"):
        load(_declare(build_model("ReduceSum", {"x": rand(3, 4, seed=1), "axes": Const(np.array([2], np.int64))},
                                  opset=13), (3, 4)))


# ---- CumSum -------------------------------------------------------------------------------------
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5, 4), 1), ((3, 5, 4), -1), ((2, 6), 0)])
def test_cumsum(shape, axis, exclusive, reverse):
    check_op("CumSum", {"x": rand(*shape, seed=51), "axis": Const(np.array(axis, np.int64))},
             {"exclusive": exclusive, "reverse": reverse}, opset=14, expect_prims=["reduce_sum"])


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_cumsum_of_integers_is_exact(dtype):
    """RoBERTa's position ids: a running count of the non-padding tokens, in int64."""
    mask = np.random.default_rng(52).integers(0, 3, size=(2, 24)).astype(dtype)
    check_op("CumSum", {"x": mask, "axis": Const(np.array([1], np.int32))}, opset=11, tol=1e-12)


def test_a_long_or_computed_cumsum_axis_stays_opaque():
    x = rand(2, CUMSUM_MAX + 1, seed=53)
    pg = check_op("CumSum", {"x": x, "axis": Const(np.array(1, np.int64))}, opset=14, allow_opaque=True)
    assert [n.op for n in pg.nodes if n.op == "opaque"] == ["opaque"]
    pg = check_op("CumSum", {"x": rand(3, 4, seed=54), "axis": np.array(0, np.int64)}, opset=14, allow_opaque=True)
    assert any(n.op == "opaque" for n in pg.nodes)


def test_a_cumsum_of_a_scalar_is_an_error_naming_the_node():
    model = build_model("CumSum", {"x": np.array(3.0, np.float32), "axis": Const(np.array(0, np.int64))}, opset=14)
    with pytest.raises(TesseraError, match="CumSum takes one axis of an input of rank 1 or more"):
        fission(load(model).graph)


# ---- ArgMax, ArgMin ----------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(1, 1, 0), (1, 0, 1), (-1, 0, 0), (0, 1, 1)])
def test_arg_extremes_scan_as_onnxruntime_does(op, axis, keepdims, last):
    """Ties (first or last), NaN first (index 0), NaN later (skipped), all NaN, infinities."""
    x = np.array([[1, 3, 3, 0, np.nan], [np.nan, 1, np.nan, 5, 5], [2, 2, 2, 2, 2],
                  [np.nan] * 5, [-np.inf, np.nan, -np.inf, 7, np.inf], [0.5, -1, 4, -1, 4]], np.float32)
    x = np.concatenate([x, rand(4, 5, seed=70)])
    check_op(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last}, opset=13)


def test_arg_max_of_integers_and_at_opset_1():
    x = np.random.default_rng(71).integers(-3, 3, size=(4, 6, 5)).astype(np.int64)
    check_op("ArgMax", {"x": x}, {"axis": 2, "select_last_index": 1}, opset=13)
    check_op("ArgMin", {"x": rand(3, 7, seed=72)}, {"axis": 1}, opset=1)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_arg_max_compiles_and_runs(tmp_path, precision):
    """Through the whole compiler: the float reduction generated, the integer one run by torch; indices
    exact at any precision (a float iota would not be past 2048 in fp16)."""
    import onnx

    import tessera

    x = rand(3, 3000, seed=73)
    x[0, 2999] = 50.0
    x[1, 2500] = np.nan
    model = build_model("ArgMax", {"x": x}, {"axis": 1, "keepdims": 0}, opset=13)
    path = tmp_path / "argmax.onnx"
    onnx.save(model, path)
    (y,) = tessera.compile(str(path), tessera.CompileOptions(cost="analytical", precision=precision))(
        torch.from_numpy(x))
    want = run_ort(model, {"x": x})[0]
    if precision == "fp16":  # the values round to float16 first: only the planted maximum is sure
        assert y[0].item() == 2999
    else:
        assert y.tolist() == want.tolist()


# ---- TopK (session 51) -------------------------------------------------------------------------------
def _top_k_exactly(x: np.ndarray, k: int, attrs: dict | None = None, opset: int = 11) -> Graph:
    """Values and indices equal onnxruntime's element for element (NaN where its NaN, zeros signed as its,
    infinities), from the reference interpreter and from the primitive graph exported back to ONNX."""
    from tessera.ir.onnx_export import to_onnx

    inputs = {"x": x, "k": Const(np.array([k], np.int64))} if opset >= 10 else {"x": x}
    attrs = dict(attrs or {}) | ({} if opset >= 10 else {"k": k})
    model = build_model("TopK", inputs, attrs, n_outputs=2, opset=opset)
    ref = run_ort(model, {"x": x})
    pg = fission(load(model).graph).graph
    assert all(n.op != "opaque" for n in pg.nodes)
    got = interp.run(pg, {"x": x})
    exported = run_ort(to_onnx(pg), {"x": x})
    for j, r in enumerate(ref):
        for g in (got[pg.outputs[j]], exported[j]):
            assert g.dtype == r.dtype and g.shape == r.shape
            np.testing.assert_array_equal(g, r)
            assert (np.signbit(g) == np.signbit(r)).all() if r.dtype.kind == "f" else True
    return pg


NAN, INF = np.nan, np.inf
TOPK_EDGES = [[1, 3, 3, 2, 3, 0], [1, NAN, 3, 2, NAN, 0], [NAN, 1, 2], [-INF, -INF, 1, -INF], [0.0, -0.0, -0.0, 0.0],
              [NAN, NAN, INF, -INF, NAN]]


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("row", TOPK_EDGES)
def test_top_k_orders_as_onnxruntime(row, largest):
    """Ties by index; NaN above every number (first when largest, last when smallest); infinities; the
    value picked is the element itself (-0.0 stays -0.0): every k."""
    x = np.array([row], np.float32)
    for k in range(1, x.shape[1] + 1):
        _top_k_exactly(x, k, {"largest": largest})


@pytest.mark.parametrize("axis,k,largest", [(-1, 1, 1), (-1, 2, 1), (1, 4, 0), (0, 3, 1), (2, 16, 0)])
def test_top_k_axes_and_ties(axis, k, largest):
    x = np.round(rand(5, 7, 19, seed=80, lo=-4, hi=4))  # whole numbers: many ties
    _top_k_exactly(x, k, {"axis": axis, "largest": largest})


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16])
def test_top_k_of_integers_and_half(dtype):
    """Integers keep the type's extremes (int64's least among them); float16 values and NaN."""
    if dtype is np.float16:
        x = rand(3, 40, seed=81).astype(np.float16)
        x[0, 3] = x[2, 5] = np.nan
    else:
        info = np.iinfo(dtype)
        x = np.random.default_rng(82).integers(-20, 20, (3, 12)).astype(dtype)
        x[0, :4] = info.min
        x[1, 2] = info.max
    for largest in (1, 0):
        _top_k_exactly(x, 5, {"largest": largest})


def test_top_k_with_k_as_an_attribute():
    _top_k_exactly(rand(3, 9, seed=85), 2, opset=1)  # opset 1 to 9: floats only


def test_top_k_that_stays_opaque_says_why():
    x = rand(2, 40, seed=83)

    def reasons(k, attrs=None, k_const=True):
        inputs = {"x": x, "k": Const(np.array([k], np.int64)) if k_const else np.array([k], np.int64)}
        model = build_model("TopK", inputs, attrs, n_outputs=2, opset=11)
        return [o.reason for o in fission(load(model).graph).opaque]

    assert "sorted=0" in reasons(3, {"sorted": 0})[0]
    assert "17 > 16" in reasons(17)[0]
    # a computed k leaves the output's shape unknown: the load says so, naming the node
    with pytest.raises(TesseraError, match="'topk_0' \\(TopK\\).*output shapes are unknown"):
        reasons(3, k_const=False)


def test_top_k_compiles_and_runs_exactly():
    """A router's softmax, then its top 2 of 8 experts: compiled (analytical cost), run, exact."""
    import tessera
    from onnx import TensorProto

    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1),
             helper.make_node("TopK", ["p", "k"], ["v", "i"], axis=-1)]
    g = helper.make_graph(nodes, "router", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 8])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, [6, 2]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [6, 2])],
                          initializer=[helper.make_tensor("k", TensorProto.INT64, [1], [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    run = tessera.compile(model, tessera.CompileOptions(cost="analytical"))
    assert all(n.op != "opaque" for n in run.graph.nodes)
    x = rand(6, 8, seed=84)
    out = run.run(x=x)
    ref = run_ort(model, {"x": x})
    np.testing.assert_array_equal(out["i"].cpu().numpy(), ref[1])
    assert rel_l2(out["v"].cpu().numpy(), ref[0]) < 1e-6


# ---- RMSNormalization, MeanVarianceNormalization, LpNormalization, LRN, Hardmax (session 51) ----------
@pytest.mark.parametrize("attrs,scale_shape", [({}, (8,)), ({"axis": 1, "epsilon": 1e-3}, (3, 8)),
                                               ({"stash_type": 1}, (1, 8))])
def test_rms_normalization(attrs, scale_shape):
    check_op("RMSNormalization", {"x": rand(2, 3, 8, seed=110), "s": Const(rand(*scale_shape, seed=111))}, attrs,
             opset=23)
    check_op("RMSNormalization", {"x": rand(2, 3, 8, seed=112).astype(np.float16),
                                  "s": Const(rand(*scale_shape, seed=113).astype(np.float16))}, attrs, opset=23,
             tol=2e-3)


@pytest.mark.parametrize("axes", [None, [1, -1], [0, 1, 2, 3]])
def test_mean_variance_normalization(axes):
    check_op("MeanVarianceNormalization", {"x": rand(2, 3, 4, 5, seed=114)}, {} if axes is None else {"axes": axes},
             opset=13)


@pytest.mark.parametrize("p,axis", [(2, -1), (1, 0), (2, 1)])
def test_lp_normalization_keeps_a_zero_vector(p, axis):
    x = rand(4, 3, seed=115)
    x[0, :] = 0
    x[:, 2] = 0
    x[1, 1] = np.nan
    check_op("LpNormalization", {"x": x}, {"p": p, "axis": axis}, opset=1)


@pytest.mark.parametrize("attrs", [{"size": 3}, {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, {"size": 7},
                                   {"size": 1}])
def test_lrn(attrs):
    """onnxruntime takes odd sizes of 4-D inputs only; the window is sum of shifted slices of the
    zero-padded squares."""
    check_op("LRN", {"x": rand(2, 6, 3, 4, seed=116)}, attrs, opset=13)


@pytest.mark.parametrize("opset,attrs", [(13, {}), (13, {"axis": 1}), (11, {}), (11, {"axis": 2})])
def test_hardmax(opset, attrs):
    """The first greatest value wins; NaN is skipped, but a NaN first leaves the row all zeros (as
    onnxruntime scans); opset 11 views the input as 2-D at the axis."""
    x = np.round(rand(3, 4, 5, seed=117))
    x[0, 0, :] = [np.nan, 1, 2, 2, 0]
    x[1, 2, :] = [1, np.nan, 3, 3, -np.inf]
    x[2, 1, :] = -np.inf
    check_op("Hardmax", {"x": x}, attrs, opset=opset)



@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_an_operators_own_sums_and_squares_stay_float32_in_a_narrow_plan(precision):
    """A narrow plan stores its tensors narrow, but for the sums and squares an operator keeps to itself:
    a kernel boundary between a sum and its log (or a variance's square and its mean) would round a
    value that can pass float16's range where the operator's result does not (fuzz seed 5401,
    tests/fuzzregressions.py). The operators' results narrow as before."""
    from tessera.rewrite import convert_precision

    x = rand(2, 8, 96, seed=5)
    narrow = DType.FLOAT16 if precision == "fp16" else DType.BFLOAT16
    cases = [("ReduceLogSum", {"x": x}, {"axes": [2], "keepdims": 0}, 13),
             ("ReduceL2", {"x": x}, {"axes": [2]}, 13),
             ("LayerNormalization", {"x": x, "s": rand(96, seed=6), "b": rand(96, seed=7)}, {"axis": -1}, 17)]
    for op, feeds, attrs, opset in cases:
        pg = fission(load(build_model(op, feeds, attrs, opset=opset)).graph).graph
        got = convert_precision(pg, precision, io="precision")
        sums = {o for n in pg.nodes if n.op == "reduce_sum" for o in n.outputs}
        squares = {o for n in pg.nodes if n.op == "mul" and n.inputs[0] == n.inputs[1] for o in n.outputs}
        assert sums and (squares or op == "ReduceLogSum"), op
        assert {got.types[t].dtype for t in sums | squares} == {DType.FLOAT32}, op
        assert {got.types[t].dtype for t in got.outputs} == {narrow}, op  # the operator's result rounds
        if op == "LayerNormalization":  # and so does what it computes beside its sums and squares
            centred = {n.inputs[0] for n in pg.nodes if n.op == "mul" and n.inputs[0] == n.inputs[1]}
            assert {got.types[t].dtype for t in centred} == {narrow}


def test_an_lrns_squares_stay_float32_through_its_pad_and_slices():
    """LRN pads its squares and sums slices of them with adds: the copies carry the squares and the adds
    sum them, so they stay float32 too; what scales the sum is not a sum, and narrows."""
    from tessera.rewrite import convert_precision

    pg = fission(load(build_model("LRN", {"x": rand(1, 8, 5, 5, seed=5)}, {"size": 3}, opset=13)).graph).graph
    got = convert_precision(pg, "fp16", io="precision")
    square = next(n.outputs[0] for n in pg.nodes if n.op == "mul" and n.inputs[0] == n.inputs[1])
    moved = {n.outputs[0] for n in pg.nodes if n.op in ("pad", "slice")}
    added = {n.outputs[0] for n in pg.nodes if n.op == "add" and moved & set(n.inputs)}
    assert moved and len(added) == 2 and {got.types[t].dtype for t in moved | added | {square}} == {DType.FLOAT32}
    scaled = {n.outputs[0] for n in pg.nodes if set(n.inputs) & added and n.outputs[0] not in added}
    assert scaled and {got.types[t].dtype for t in scaled} == {DType.FLOAT16}


@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_sum_that_is_the_operators_result_rounds(keepdims):
    """ReduceSum's sum is its result (without keepdims, through a reshape of it): rounding after each
    operator rounds it, and so does the plan."""
    from tessera.rewrite import convert_precision
    from tessera.rewrite.precision import internal_accumulations

    pg = fission(load(build_model("ReduceSum", {"x": rand(4, 32, seed=8), "axes": Const(np.array([1]))},
                                  {"keepdims": keepdims}, opset=13)).graph).graph
    sums = [o for n in pg.nodes if n.op == "reduce_sum" for o in n.outputs]
    assert sums and not internal_accumulations(pg)
    got = convert_precision(pg, "fp16", io="precision")
    assert {got.types[t].dtype for t in sums} == {DType.FLOAT16}
