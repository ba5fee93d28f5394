"""Concatenations whose producers write straight into the output's buffer (runtime/concat_alias.py)."""
from __future__ import annotations

import numpy as np
import torch
from onnx import helper
from opcheck import Const, graph_model, rand

import tessera
from tessera.cost.analytical import AnalyticalCost
from tessera.cost.devices import device
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir.prims import Prim
from tessera.orchestrate.candidates import Candidate
from tessera.orchestrate.graphview import build_ograph
from tessera.tolerance import rel_l2
from tessera.verify import run_onnxruntime, verify_kernels


def _model(batch: int, piece_is_input: bool = False):
    # a = relu(x), b = sigmoid(y) (or y itself), c = concat(a, b) on the channels; c and a are read after.
    x, y = rand(batch, 3, 5, 7, seed=1), rand(batch, 2, 5, 7, seed=2)
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Sigmoid", ["y"], ["b"]),
             helper.make_node("Concat", ["a", "y" if piece_is_input else "b"], ["c"], axis=1),
             helper.make_node("Mul", ["c", "two"], ["out"]),
             helper.make_node("Tanh", ["a"], ["out2"])]
    return graph_model(nodes, {"x": x, "y": y, "two": Const(rand(1, seed=3))}, ["out", "out2"]), {"x": x, "y": y}


def _run(batch: int, piece_is_input: bool = False):
    m, feeds = _model(batch, piece_is_input)
    # One primitive a kernel, so that the concatenation is a step of its own.
    exe = tessera.compile(m, tessera.CompileOptions(max_kernel_nodes=1, cost="analytical"))
    ref = run_onnxruntime(m, feeds)
    outs = exe(*[torch.from_numpy(feeds[n]) for n in exe.input_names])
    for name, out in zip(exe.output_names, outs):
        assert rel_l2(out.numpy(), ref[name]) < 1e-6, name
    concat = next(n for n in exe.graph.nodes if n.op == Prim.CONCAT.value)
    return exe, concat


def test_pieces_are_written_into_the_output():
    exe, concat = _run(1)
    assert len(exe.in_place) == 1
    c = exe.pool.views[concat.outputs[0]]
    a, b = (exe.pool.views[t] for t in concat.inputs)
    assert a.data_ptr() == c.data_ptr() and b.data_ptr() == c.data_ptr() + a.numel() * a.element_size()
    # The first piece is read again after the concatenation (tanh): nothing else takes its memory
    # before then, which the check against onnxruntime above shows. Kernel by kernel, the skipped
    # step's output is what its producers wrote, against the float64 reference.
    _, feeds = _model(1)
    for propagate in (False, True):
        report = verify_kernels(exe, feeds, propagate=propagate)
        assert all(t.passed for k in report.kernels for t in k.tensors)


def test_a_piece_beneath_a_view_is_written_in_place():
    # d = reshape(relu(z)): the reshape is a view, so relu's kernel writes into the concatenation.
    z = rand(1, 2, 35, seed=4)
    b = rand(1, 3, 5, 7, seed=5)
    nodes = [helper.make_node("Relu", ["z"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["d"]),
             helper.make_node("Sigmoid", ["b"], ["s"]), helper.make_node("Concat", ["s", "d"], ["c"], axis=1),
             helper.make_node("Tanh", ["c"], ["out"])]
    m = graph_model(nodes, {"z": z, "b": b, "shape": Const([1, 2, 5, 7], np.int64)}, ["out"])
    exe = tessera.compile(m, tessera.CompileOptions(max_kernel_nodes=1, cost="analytical"))
    assert exe.backends.get("view") and len(exe.in_place) == 1
    ref = run_onnxruntime(m, {"z": z, "b": b})["out"]
    assert rel_l2(exe(torch.from_numpy(z), torch.from_numpy(b))[0].numpy(), ref) < 1e-6


def test_a_concatenation_of_a_skipped_one_keeps_its_copy():
    # u = concat(relu(x), sigmoid(x)); w = concat(u, tanh(relu(u))): u's pieces sit in u's buffer, so
    # u cannot also be a piece of w (the fuzzer, session 48: the executable failed to build with a
    # KeyError). The inner one copies nothing, the outer one copies.
    x = rand(1, 6, seed=4)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["u"], axis=1),
             helper.make_node("Relu", ["u"], ["r"]), helper.make_node("Tanh", ["r"], ["t"]),
             helper.make_node("Concat", ["u", "t"], ["w"], axis=1)]
    m = graph_model(nodes, {"x": x}, ["w"])
    exe = tessera.compile(m, tessera.CompileOptions(max_kernel_nodes=1, cost="analytical"))
    out = exe(torch.from_numpy(x))[0]
    assert rel_l2(out.numpy(), run_onnxruntime(m, {"x": x})["w"]) < 1e-6
    assert len(exe.in_place) == 1
    inner = next(s.impl.prims[0] for s in exe.steps if s.impl.name in exe.in_place)
    outer = next(n for n in exe.graph.nodes if n.op == Prim.CONCAT.value and n is not inner)
    assert inner.outputs[0] in outer.inputs
    # The cost models price them so: the inner one free, the outer one a copy.
    og = build_ograph(fission(load(m).graph).graph)
    cost = AnalyticalCost(og, device("h100"), "fp32")
    priced = {og.nodes[i].name: cost(Candidate(1 << i, 1 << i, 0)) for i, n in enumerate(og.nodes)
              if n.op == Prim.CONCAT.value}
    assert priced[inner.name] < 1e-8 and priced[outer.name] > 1e-7


def test_a_concat_that_is_not_contiguous_pieces_copies():
    exe, _ = _run(2)  # a batch of 2: each input is two pieces of the output
    assert not exe.in_place


def test_a_graph_input_is_never_a_piece():
    exe, _ = _run(1, piece_is_input=True)
    assert not exe.in_place


def test_the_cost_models_price_it_free():
    m, _ = _model(1)
    g = fission(load(m).graph).graph
    og = build_ograph(g)
    i = next(i for i, n in enumerate(og.nodes) if n.op == Prim.CONCAT.value)
    cost = AnalyticalCost(og, device("h100"), "fp32")
    assert cost(Candidate(1 << i, 1 << i, 0)) < 1e-8
    m2, _ = _model(2)
    g2 = fission(load(m2).graph).graph
    og2 = build_ograph(g2)
    j = next(i for i, n in enumerate(og2.nodes) if n.op == Prim.CONCAT.value)
    assert AnalyticalCost(og2, device("h100"), "fp32")(Candidate(1 << j, 1 << j, 0)) > 1e-7


def test_segformer_decoder_concat_in_place():
    # The decoder concatenates its four upsampled maps in NCHW: each is written in place.
    from pathlib import Path

    from tessera.verify import random_inputs

    path = Path(__file__).resolve().parents[2] / "shared" / "models" / "segformer_b0_small.onnx"
    exe = tessera.compile(path, tessera.CompileOptions(cost="analytical", layout="nchw"))
    assert exe.in_place
    model = load(path)
    feeds = random_inputs(model.graph, seed=13)
    ref = run_onnxruntime(model.model, feeds)
    outs = exe(*[torch.from_numpy(feeds[n]) for n in exe.input_names])
    for name, out in zip(exe.output_names, outs):
        assert rel_l2(out.numpy(), ref[name]) < 1e-5
