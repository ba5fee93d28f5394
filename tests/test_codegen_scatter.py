"""Scatters with constant indices as generated kernels, under Triton's interpreter on the CPU.

Fission writes a scatter as a GATHER of the updates by a constant position table picked over the
data by a constant mask (WHERE), or, for a box written once, as a CONCAT of the updates and data
slices; each case checks that one kernel computes the whole scatter like the reference.
"""
from __future__ import annotations

import numpy as np
import pytest
from kernelcheck import check_kernel
from onnx import helper
from opcheck import Const, build_model, graph_model, rand

I64 = np.int64


@pytest.mark.parametrize("reduction,opset", [("none", 13), ("add", 16), ("max", 18)])
def test_scatter_nd_rows(reduction, opset):
    """Rows 4, 1 and (for the reductions, again) 4 of [6, 5, 3]: a table of 6 rows, a mask broadcast
    over each row, and with a reduction two layers for the repeated row."""
    x, u = rand(6, 5, 3, seed=1), rand(3, 5, 3, seed=2)
    i = np.array([[4], [1], [-2 if reduction != "none" else 0]], I64)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    check_kernel(build_model("ScatterND", {"x": x, "i": Const(i), "u": u}, attrs, opset=opset), {"x": x, "u": u})


def test_scatter_nd_slice_assignment():
    """x[:, 2] = y: the updates CONCATenated between two slices of the data."""
    x, u = rand(4, 5, 3, seed=3), rand(4, 1, 3, seed=4)
    i = np.array([[[r, 2]] for r in range(4)], I64)
    check_kernel(build_model("ScatterND", {"x": x, "i": Const(i), "u": u}, opset=13), {"x": x, "u": u})


@pytest.mark.parametrize("reduction,opset", [("none", 13), ("mul", 16)])
def test_scatter_elements(reduction, opset):
    x, u = rand(4, 6, seed=5), rand(4, 3, seed=6)
    i = np.array([[0, -1, 3], [5, 2, -6], [1, 4, 2], [3, 0, 5]], I64)
    if reduction != "none":
        i[2] = [1, 1, 2]  # row 2 hits column 1 twice
    attrs = {"axis": 1} | ({} if reduction == "none" else {"reduction": reduction})
    check_kernel(build_model("ScatterElements", {"x": x, "i": Const(i), "u": u}, attrs, opset=opset),
                 {"x": x, "u": u})


def test_scatter_nd_and_elements_in_one_kernel():
    """Both scatters between elementwise ops, int64 indices into a graph fed by float inputs."""
    x, u, v = rand(5, 4, seed=7), rand(2, 4, seed=8), rand(1, 4, seed=9)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ScatterND", ["r", "i", "u"], ["s"]),
             helper.make_node("ScatterElements", ["s", "j", "v"], ["t"], axis=0, reduction="add"),
             helper.make_node("Tanh", ["t"], ["y"])]
    model = graph_model(nodes, {"x": x, "u": u, "v": v, "i": Const(np.array([[3], [0]], I64)),
                                "j": Const(np.array([[4, 0, -1, 2]], I64))}, ["y"], opset=16)
    check_kernel(model, {"x": x, "u": u, "v": v})


def test_scatter_bool_data():
    """bool data is scattered as uint8 bytes (onnxruntime has no bool Where) and cast back."""
    rng = np.random.default_rng(10)
    x, u = rng.random((5, 4)) < 0.5, rng.random((2, 4)) < 0.5
    check_kernel(build_model("ScatterND", {"x": x, "i": Const(np.array([[3], [0]], I64)), "u": u}, opset=13),
                 {"x": x, "u": u})
