"""The corpus of bad inputs: each gives a clear TesseraError that names the problem."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tessera.cli.main import main
from tessera.errors import MalformedModelError, ModelLoadError, ShapeError, TesseraError
from tessera.frontend import load
from tessera.verify import verify

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def _model(nodes, inputs, outputs, inits=(), opset=20) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_truncated_file(tmp_path):
    data = (MODELS / "candy_small.onnx").read_bytes()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelLoadError, match="trunc.onnx.*(truncated or corrupt|no graph)"):
        load(p)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load(tmp_path / "nope.onnx")


def test_not_onnx(tmp_path):
    p = tmp_path / "text.onnx"
    p.write_text("this is not a protobuf\n" * 10)
    with pytest.raises(ModelLoadError, match="text.onnx"):
        load(p)


def test_wrong_dtype_operands():
    m = _model([helper.make_node("Add", ["x", "i"], ["y"], name="add_mixed")],
               [_vi("x", [2, 3]), _vi("i", [2, 3], TensorProto.INT64)], [_vi("y", [2, 3])])
    with pytest.raises(TesseraError, match="add_mixed"):
        load(m)


def test_unsupported_input_dtype():
    m = _model([helper.make_node("Identity", ["s"], ["y"], name="id")],
               [_vi("s", [2], TensorProto.STRING)], [_vi("y", [2], TensorProto.STRING)])
    with pytest.raises(TesseraError, match="'s'.*STRING"):
        load(m)


def test_cycle():
    m = _model([helper.make_node("Relu", ["b"], ["a"], name="first"),
                helper.make_node("Add", ["a", "x"], ["b"], name="second")],
               [_vi("x", [4])], [_vi("a", [4])])
    with pytest.raises(MalformedModelError, match="cycle.*(first|second)"):
        load(m)


def test_dangling_tensor():
    m = _model([helper.make_node("Relu", ["ghost"], ["y"], name="reads_ghost")], [_vi("x", [4])], [_vi("y", [4])])
    with pytest.raises(MalformedModelError, match="reads_ghost.*'ghost'"):
        load(m)


def test_symbolic_dim_needs_override():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", ["batch", 3])], [_vi("y", ["batch", 3])])
    with pytest.raises(ShapeError, match="'x'.*'batch'.*--input-shape x=Nx3"):
        load(m)
    g = load(m, {"x": (5, 3)}).graph
    assert g.types["y"].shape == (5, 3)


def test_override_of_unknown_input():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ShapeError, match="'z'"):
        load(m, {"z": (1,)})


def test_mismatched_shapes():
    m = _model([helper.make_node("Add", ["x", "z"], ["y"], name="add_bad")],
               [_vi("x", [3, 4]), _vi("z", [5, 4])], [_vi("y", [3, 4])])
    with pytest.raises(ShapeError, match=r"add_bad.*\[3, 4\].*\[5, 4\]"):
        load(m)


def test_declared_shape_contradiction_is_reported():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu_decl")], [_vi("x", [3, 4])], [_vi("y", [4, 3])])
    loaded = load(m)
    assert loaded.graph.types["y"].shape == (3, 4)
    (warning,) = loaded.folding.warnings
    assert "relu_decl" in warning and "declared [4, 3]" in warning


def test_unknown_op_becomes_opaque_and_verifies():
    # Atan has no fission rule (Hardmax, here before, lowers since session 51): it must run through
    # onnxruntime, and verify must pass.
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Atan", ["r"], ["h"], name="atan"),
                helper.make_node("Add", ["h", "x"], ["y"], name="add")],
               [_vi("x", [2, 7])], [_vi("y", [2, 7])])
    report = verify(m)
    assert report.passed
    assert [o.op_type for o in report.opaque] == ["Atan"]
    assert "no fission rule" in report.opaque[0].reason


def test_op_nobody_knows():
    m = _model([helper.make_node("NoSuchOp", ["x"], ["y"], name="mystery")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(TesseraError, match="mystery.*NoSuchOp"):
        load(m)


def test_cli_reports_user_error_without_traceback(tmp_path, capsys):
    p = tmp_path / "trunc.onnx"
    p.write_bytes((MODELS / "candy_small.onnx").read_bytes()[:1000])
    assert main(["inspect", str(p)]) == 2
    err = capsys.readouterr().err
    assert "tessera: error:" in err and "Traceback" not in err
    assert main(["verify", str(p), "--input-shape", "bad"]) == 2
    assert "NAME=DIMS" in capsys.readouterr().err


def test_constant_folding_of_shape_subgraphs():
    loaded = load(MODELS / "candy_small_legacy.onnx")
    ops = loaded.graph.op_counts()
    for shape_op in ("Shape", "ConstantOfShape", "Cast", "Slice", "Concat", "Identity", "Gather"):
        assert shape_op not in ops, f"{shape_op} survived folding"
    assert loaded.folding.folded_nodes["ConstantOfShape"] == 16
    assert loaded.graph.types[loaded.graph.outputs[0]].shape == (1, 3, 64, 64)


def test_initializer_listed_as_input_is_a_constant():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3,)).astype(np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [3]), _vi("w", [3])],
               [_vi("y", [3])], inits=[w])
    g = load(m).graph
    assert g.inputs == ["x"] and "w" in g.constants


def test_a_model_newer_than_onnxruntime_reads_is_checked_at_its_newest_ir_version():
    """A model stamped with an IR version past onnxruntime's (an onnx newer than the onnxruntime beside it,
    as on the GPU machine) runs as that newest version for the reference; other load errors stay errors."""
    from tessera.verify import run_onnxruntime

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 99
    x = np.random.default_rng(0).standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(run_onnxruntime(model, {"x": x})["y"], np.maximum(x, 0))
    assert model.ir_version == 99  # the caller's model is left as it was
    model.opset_import[0].version = 999  # an opset onnxruntime lacks is still refused
    with pytest.raises(TesseraError, match="onnxruntime cannot load"):
        run_onnxruntime(model, {"x": x})


def test_folding_a_constant_through_log_of_zero_prints_nothing(tmp_path):
    """Constant folding computes what ONNX defines, -inf for log(0), without NumPy's "divide by zero"
    warning: T5's legacy export folds its relative position buckets that way, and `tessera compile`
    and `tessera run` each printed two warnings (session 50)."""
    import warnings

    import torch

    import tessera

    c = numpy_helper.from_array(np.array([0.0, 1.0, 2.0], np.float32), "c")
    nodes = [helper.make_node("Log", ["c"], ["l"]), helper.make_node("Exp", ["l"], ["e"]),
             helper.make_node("Mul", ["x", "e"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], initializer=[c])
    path = tmp_path / "logzero.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    # recorded, not raised: the folder catches an evaluator's exception and tries onnxruntime instead
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = tessera.compile(str(path), tessera.CompileOptions(cost="analytical"))
        (y,) = run(torch.tensor([5.0, 6.0, 7.0]))
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []
    assert y.tolist() == [0.0, 6.0, 14.0]
