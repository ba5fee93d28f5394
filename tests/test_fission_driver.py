"""The fission driver: output naming, opaque fallback and rollback, source tracking."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opcheck import run_ort
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.prims import Category, Prim


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=8)


def _run_both(m: onnx.ModelProto, feeds):
    pg = fission(load(m).graph).graph
    got = interp.run(pg, feeds)
    ref = run_ort(m, feeds)
    for name, r in zip(pg.outputs, ref):
        np.testing.assert_allclose(got[name], r, rtol=1e-6, atol=1e-6)
    return pg


def test_outputs_keep_model_names_even_for_identity_and_constants():
    c = numpy_helper.from_array(np.array([1.5, -2.0, 3.0], dtype=np.float32), "c")
    m = _model([helper.make_node("Identity", ["x"], ["same"], name="id"),
                helper.make_node("Identity", ["c"], ["const_out"], name="idc"),
                helper.make_node("Softmax", ["x"], ["sm"], name="sm", axis=-1)],
               [_vi("x", [2, 3])], [_vi("same", [2, 3]), _vi("const_out", [3]), _vi("sm", [2, 3])], [c])
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)}
    pg = _run_both(m, feeds)
    assert pg.outputs == ["same", "const_out", "sm"]
    assert {"same", "sm"} <= set(pg.producers())
    assert "const_out" in pg.constants  # folded by the frontend; still an output


def test_same_tensor_as_two_outputs():
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Identity", ["r"], ["r2"], name="id")],
               [_vi("x", [4])], [_vi("r", [4]), _vi("r2", [4])])
    pg = _run_both(m, {"x": np.array([-1.0, 2.0, -3.0, 4.0], dtype=np.float32)})
    assert pg.outputs == ["r", "r2"]


def test_opaque_node_keeps_neighbours_split_and_records_source():
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="relu_1"),
                helper.make_node("Atan", ["r"], ["c"], name="atan_1"),
                helper.make_node("Sigmoid", ["c"], ["y"], name="sig_1")],
               [_vi("x", [3, 5])], [_vi("y", [3, 5])])
    result = fission(load(m).graph)
    pg = result.graph
    assert [o.op_type for o in result.opaque] == ["Atan"]
    cats = {n.source[0]: Prim(n.op).category for n in pg.nodes}
    assert cats["atan_1"] is Category.OPAQUE and cats["sig_1"] is Category.ELEMENTWISE
    _run_both(m, {"x": np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)})


def test_multi_output_opaque():
    # a TopK of k over TOPK_STEPS (16) stays opaque (smaller ones lower since session 51)
    m = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", axis=-1),
                helper.make_node("Neg", ["v"], ["y"], name="neg")],
               [_vi("x", [2, 19])], [_vi("y", [2, 17]), _vi("i", [2, 17], TensorProto.INT64)],
               [numpy_helper.from_array(np.array([17], dtype=np.int64), "k")])
    pg = _run_both(m, {"x": np.random.default_rng(3).permutation(38).reshape(2, 19).astype(np.float32)})
    opaque = [n for n in pg.nodes if n.op == "opaque"]
    assert len(opaque) == 1 and len(opaque[0].outputs) == 2


def test_issue_operator_list_has_rules():
    from tessera.ops import supported_ops

    required = ("Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Neg Abs Erf Tanh Sigmoid Relu Clip LeakyRelu Gelu "
                "HardSwish HardSigmoid Softplus Min Max Where Cast Equal Greater Less IsNaN Softmax "
                "LayerNormalization InstanceNormalization BatchNormalization GroupNormalization ReduceMean "
                "ReduceSum ReduceMax MatMul Gemm Conv ConvTranspose MaxPool AveragePool GlobalAveragePool "
                "Transpose Reshape Flatten Squeeze Unsqueeze Concat Split Slice Pad Expand Gather GatherElements "
                "Resize Identity Dropout").split()
    assert not set(required) - set(supported_ops())


def test_repeated_primitives_are_computed_once():
    # Three MatMuls of one 3-D activation: operator lowering flattens it three times; after fission
    # the three products read one view, so the merge of matmuls sharing an operand can match them.
    rng = np.random.default_rng(5)
    ws = [numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)]
    nodes.append(helper.make_node("Add", ["y0", "y1"], ["s"]))
    nodes.append(helper.make_node("Add", ["s", "y2"], ["out"]))
    m = _model(nodes, [_vi("x", [2, 3, 8])], [_vi("out", [2, 3, 5])], ws)
    pg = _run_both(m, {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)})
    mats = [n for n in pg.nodes if n.op == Prim.MATMUL.value]
    assert len(mats) == 3 and len({n.inputs[0] for n in mats}) == 1
    from tessera.rewrite.rules import RULES, find
    assert sum(mt.rule == "matmuls_sharing_left" for mt in find(pg, RULES)) == 3
    # The kept view names every ONNX node it now stands for.
    view = next(n for n in pg.nodes if n.outputs[0] == mats[0].inputs[0])
    assert view.source == ("mm0", "mm1", "mm2")


def test_repeats_that_stay_apart():
    # An opaque operator is not known to be pure, and a node that writes a graph output keeps it.
    nodes = [helper.make_node("Atan", ["x"], ["c0"]), helper.make_node("Atan", ["x"], ["c1"]),
             helper.make_node("Relu", ["x"], ["r0"]), helper.make_node("Relu", ["x"], ["r1"]),
             helper.make_node("Add", ["c0", "c1"], ["out"])]
    m = _model(nodes, [_vi("x", [4])], [_vi("out", [4]), _vi("r0", [4]), _vi("r1", [4])])
    pg = _run_both(m, {"x": np.arange(4, dtype=np.float32) - 1.5})
    assert sum(n.op == Prim.OPAQUE.value for n in pg.nodes) == 2
    assert {"r0", "r1"} <= {o for n in pg.nodes for o in n.outputs}
