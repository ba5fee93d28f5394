"""Reshapes of reshapes collapse after fission (`fission/views.py`), checked against onnxruntime."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from opcheck import run_ort
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp


def _model(nodes, outputs, shapes):
    """x [2, 3, 4] through `nodes`; `outputs` as (name, shape); `shapes` the constants s0, s1, ..."""
    inits = [numpy_helper.from_array(np.array(s, dtype=np.int64), f"s{i}") for i, s in enumerate(shapes)]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o, shape in outputs],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=8)


def _checked(m):
    """The primitive graph, after its outputs were checked against onnxruntime on random inputs."""
    pg = fission(load(m).graph).graph
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)}
    got = interp.run(pg, feeds)
    for name, want in zip(pg.outputs, run_ort(m, feeds)):
        np.testing.assert_array_equal(got[name], want)
    return pg


def _reshapes(pg):
    return [n for n in pg.nodes if n.op == "reshape"]


def test_a_chain_of_reshapes_is_one_reading_the_first_input():
    m = _model([helper.make_node("Reshape", ["x", "s0"], ["a"]), helper.make_node("Reshape", ["a", "s1"], ["b"]),
                helper.make_node("Reshape", ["b", "s2"], ["c"]), helper.make_node("Relu", ["c"], ["y"])],
               [("y", [4, 6])], [[6, 4], [24], [4, 6]])
    (r,) = _reshapes(_checked(m))
    assert r.inputs == ("x",) and r.attrs["shape"] == (4, 6)


def test_a_chain_back_to_the_input_shape_is_the_input_and_a_shared_middle_stays():
    # a = x viewed [6, 4] is read by the Relu too, so it stays; a viewed back to x's shape is x.
    m = _model([helper.make_node("Reshape", ["x", "s0"], ["a"]), helper.make_node("Reshape", ["a", "s1"], ["b"]),
                helper.make_node("Add", ["b", "x"], ["y"]), helper.make_node("Relu", ["a"], ["z"])],
               [("y", [2, 3, 4]), ("z", [6, 4])], [[6, 4], [2, 3, 4]])
    pg = _checked(m)
    (r,) = _reshapes(pg)
    assert r.inputs == ("x",) and r.attrs["shape"] == (6, 4)
    (add,) = [n for n in pg.nodes if n.op == "add"]
    assert add.inputs == ("x", "x")


def test_a_reshape_that_writes_a_graph_output_keeps_its_name():
    m = _model([helper.make_node("Reshape", ["x", "s0"], ["a"]), helper.make_node("Reshape", ["a", "s1"], ["y"])],
               [("y", [2, 3, 4])], [[6, 4], [2, 3, 4]])
    pg = _checked(m)
    assert pg.outputs == ["y"] and [r.inputs for r in _reshapes(pg)] == [("x",)]
