"""A linear kernel's epilogue may read a runtime value through broadcasts and reshapes
(`orchestrate/candidates.epilogue_view`): the kernel before it writes the small tensor, and the
epilogue reads it at the view's indices. A rotary embedding at runtime positions is the case that
needs it: the gathered cos and sin rows, broadcast over the heads, were written H times (session 61's
weak point); now the gather writes one row per position."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from opcheck import Const, graph_model, rand, run_ort
from test_ops_rotary import B, D, H, MAX_POS, S, _caches, _positions

import tessera
from tessera.codegen.select import TritonLegality
from tessera.compiler import CompileOptions, compile_model
from tessera.fission import fission
from tessera.frontend import load
from tessera.orchestrate import build_ograph
from tessera.tolerance import rel_l2


def _rotated_heads(interleaved: int):
    """q = (h @ w) split into heads [B, H, S, D], then ONNX RotaryEmbedding at runtime positions."""
    cos, sin = _caches((MAX_POS,), D // 2, seed=41)
    inputs = {"h": rand(B, S, H * D, seed=42), "pos": _positions(43), "heads": Const(np.array([B, S, H, D])),
              "w": Const(rand(H * D, H * D, seed=44, lo=-0.3, hi=0.3)), "cos": Const(cos), "sin": Const(sin)}
    nodes = [helper.make_node("MatMul", ["h", "w"], ["p"]), helper.make_node("Reshape", ["p", "heads"], ["ph"]),
             helper.make_node("Transpose", ["ph"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["y"], interleaved=interleaved)]
    return graph_model(nodes, inputs, ["y"], opset=23), {k: v for k, v in inputs.items() if not isinstance(v, Const)}


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("templates", ["auto", "force"])
def test_runtime_rotary_tables_are_written_once_per_position(interleaved, templates):
    model, feeds = _rotated_heads(interleaved)
    result = compile_model(model, CompileOptions(cost="analytical", templates=templates))
    g = result.graph
    written = [t for k in result.plan.to_json()["kernels"] for t in k["outputs"]]
    # Nothing but y is [B, H, S, D]: the tables are written once per position ([B, S, 1, D / 2], or
    # widened to D where the kernel's 16 primitives leave no room for the widening's views) and the
    # projection's epilogue reads them through the head broadcast.
    assert [t for t in written if g.types[t].shape == (B, H, S, D)] == ["y"], written
    tables = [t for t in written if t.startswith("RotaryEmbedding")]
    assert len(tables) == 2 and all(g.types[t].numel <= B * S * D for t in tables), written
    run = tessera.compile(model, CompileOptions(cost="analytical", templates=templates))
    assert rel_l2(run.run(**feeds)["y"].cpu().numpy(), run_ort(model, feeds)[0]) < 1e-5


def _biased(read_outside: bool):
    """y = a @ w + expand(t) with t a runtime [4, 1] column; with `read_outside`, relu(expand(t)) too."""
    a, t = rand(4, 6, seed=51), rand(4, 1, seed=52)
    inputs = {"a": a, "t": t, "w": Const(rand(6, 8, seed=53)), "shape": Const(np.array([4, 8]))}
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Expand", ["t", "shape"], ["tb"]),
             helper.make_node("Add", ["m", "tb"], ["y"])]
    outputs = ["y"]
    if read_outside:
        nodes.append(helper.make_node("Relu", ["tb"], ["z"]))
        outputs.append("z")
    return graph_model(nodes, inputs, outputs), {"a": a, "t": t}


@pytest.mark.parametrize("read_outside", [False, True])
def test_a_view_joins_the_epilogue_only_when_nothing_else_reads_it(read_outside):
    model, feeds = _biased(read_outside)
    og = build_ograph(fission(load(model).graph).graph)
    idx = {n.op: i for i, n in enumerate(og.nodes)}
    kernel = sum(1 << idx[op] for op in ("matmul", "broadcast", "add"))
    why = TritonLegality(templates=True).check(og, kernel)
    assert (why is None) != read_outside, why
    assert why is None or "neither computed from the linear result" in why
    run = tessera.compile(model, CompileOptions(cost="analytical", templates="force"))
    got, ref = run.run(**feeds), run_ort(model, feeds)
    for name, r in zip(run.output_names, ref):
        assert rel_l2(got[name].cpu().numpy(), r) < 1e-5
