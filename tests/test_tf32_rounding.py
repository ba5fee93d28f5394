"""tf32 activations rounded where they are written, not in each product's K loop
(rewrite/precision.py `mark_tf32_operands`, `KernelBody.store`, `tile.dot_operand`)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import triton.language as tl
from onnx import helper
from opcheck import Const, graph_model, rand

import tessera
import tessera.compiler as compiler
from tessera.cli.main import main
from tessera.codegen.select import implement, prologue_of
from tessera.codegen.triton_ops import TF32_ROUND, module_source
from tessera.cost.measured import kernel_signature
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir.prims import Prim
from tessera.orchestrate import build_ograph
from tessera.rewrite import mark_tf32_operands
from tessera.runtime.executable import Executable

ROUNDING = TF32_ROUND.split("{")[0]  # the expression's opening words


def _model(residual: bool) -> onnx.ModelProto:
    """h = x * s + t (generated), then h @ w, viewed through a transpose and a reshape; with
    `residual`, h is also added to x (a reader that is no product)."""
    x = rand(6, 16, seed=1)
    nodes = [helper.make_node("Mul", ["x", "s"], ["hs"]), helper.make_node("Add", ["hs", "t"], ["h"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[1, 0]),
             helper.make_node("Transpose", ["ht"], ["h2"], perm=[1, 0]),
             helper.make_node("MatMul", ["h2", "w"], ["y"]), helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["out"])]
    outs = ["out"]
    if residual:
        nodes.append(helper.make_node("Add", ["h", "x"], ["res"]))
        outs.append("res")
    return graph_model(nodes, {"x": x, "s": Const(rand(16, seed=2)), "t": Const(rand(16, seed=3)),
                               "w": Const(rand(16, 24, seed=4)), "w2": Const(rand(24, 8, seed=5))}, outs)


def _graph(residual: bool):
    return fission(load(_model(residual)).graph).graph


def test_only_activations_that_products_alone_read_are_marked():
    g = _graph(residual=False)
    marked = mark_tf32_operands(g, "tf32").tf32_rounded
    producers = g.producers()
    ops = {producers[t].op for t in marked}
    # h (the add), its two transposes, and the ReLU between the two products
    assert {Prim.ADD.value, Prim.TRANSPOSE.value, Prim.MAX.value} <= ops
    assert ops <= {Prim.ADD.value, Prim.MAX.value, Prim.TRANSPOSE.value, Prim.RESHAPE.value, Prim.BROADCAST.value}
    assert not marked & (set(g.outputs) | set(g.inputs) | set(g.constants))
    assert mark_tf32_operands(g, "fp32") is g and mark_tf32_operands(g, "fp16") is g
    # h read by a residual add too: h stays unrounded; the ReLU's output still qualifies
    g2 = _graph(residual=True)
    p2 = g2.producers()
    marked2 = mark_tf32_operands(g2, "tf32").tf32_rounded
    assert not any(p2[t].op == Prim.ADD.value for t in marked2)
    assert any(p2[t].op == Prim.MAX.value for t in marked2)


def test_the_signature_says_whether_a_tensor_is_stored_rounded():
    g = _graph(residual=False)
    m = mark_tf32_operands(g, "tf32")
    relu = next(n for n in g.nodes if n.op == Prim.MAX.value)
    assert relu.outputs[0] in m.tf32_rounded
    assert kernel_signature(g, [relu], [], relu.outputs) != kernel_signature(m, [relu], [], relu.outputs)


def test_a_library_call_does_not_write_a_rounded_tensor():
    # cuBLASLt's RELU_BIAS epilogue would write the ReLU unrounded: the generated epilogue does.
    x = rand(6, 16, seed=1)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
                         helper.make_node("Relu", ["z"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["out"])],
                        {"x": x, "w": Const(rand(16, 24, seed=4)), "b": Const(rand(24, seed=6)),
                         "w2": Const(rand(24, 8, seed=5))}, ["out"])
    g = fission(load(model).graph).graph
    rounded = mark_tf32_operands(g, "tf32")
    impls = []
    for graph in (g, rounded):
        og = build_ograph(graph)
        last = next(i for i, n in enumerate(og.nodes) if n.op == Prim.MAX.value)
        prims = list(og.nodes[:last + 1])
        impls.append(implement(graph, prims, prologue_of(og, prims), prims[-1].outputs, "k"))
    relu = prims[-1]
    assert relu.outputs[0] in rounded.tf32_rounded
    plain, impl = impls
    assert plain.activation == "relu"
    assert impl.activation is None and relu not in impl.fused
    assert impl.triton is not None and ROUNDING in impl.triton.source


def _compile(path: Path) -> compiler.CompileResult:
    return compiler.compile_model(path, compiler.CompileOptions(precision="tf32", templates="force", chains=False,
                                                                prologues=False, cost="analytical"))


def _rounding_lines(res: compiler.CompileResult, indent: str) -> int:
    """Lines of the plan's generated kernels that round to tf32, at exactly this indentation."""
    return sum(1 for k in res.kernels if k.triton is not None for line in k.triton.source.splitlines()
               if ROUNDING in line and line.startswith(indent) and not line.startswith(indent + " "))


@pytest.mark.parametrize("residual", [False, True])
def test_rounded_at_the_writer_gives_the_same_bits(tmp_path, monkeypatch, residual):
    """Forced tf32 templates with the rounding at the writer, and with it in the K loop (the marking
    turned off): the same outputs, bit for bit, and the rounding moved out of the templates."""
    path = tmp_path / "m.onnx"
    onnx.save(_model(residual), path)
    feeds = {"x": rand(6, 16, seed=9)}
    writer = _compile(path)
    got = Executable(writer.graph, compiler.plan_document(writer), "cpu").run(**feeds)
    with monkeypatch.context() as m:
        m.setattr(compiler, "mark_tf32_operands", lambda g, p: g)
        loop = _compile(path)
    want = Executable(loop.graph, compiler.plan_document(loop), "cpu").run(**feeds)
    assert got.keys() == want.keys()
    for t in got:
        assert np.array_equal(got[t].numpy(), want[t].numpy()), t
    in_loop = [_rounding_lines(r, " " * 8) for r in (writer, loop)]  # a K loop's body
    at_store = [_rounding_lines(r, " " * 4) for r in (writer, loop)]  # a kernel's last lines
    assert in_loop[0] < in_loop[1] and at_store[0] > at_store[1] == 0
    # and the artifact: the loader marks the rebuilt graph the same way, and it checks
    out = tmp_path / "art"
    assert main(["compile", str(path), "--precision", "tf32", "--templates", "force", "--chains", "off",
                 "--prologues", "off", "-o", str(out)]) == 0
    assert main(["run", str(out), "--check"]) == 0
    assert all(np.array_equal(v.numpy(), got[t].numpy()) for t, v in tessera.load(out).run(**feeds).items())


def test_the_rounding_helper_is_defined_where_used_and_follows_the_interpreter(monkeypatch):
    """`module_source` defines `tf32_round` only in modules whose kernels call it; its PTX form is
    chosen unless Triton's interpreter runs the module (which has no inline PTX) or the GPU is older
    than sm_80 (a V100 has no cvt to tf32)."""
    assert "tf32_round" not in module_source(["x = 1"])
    src = module_source([f"y = {TF32_ROUND.format(x='x')}"])
    assert src.count("def tf32_round(x):") == 1 and "cvt.rna.tf32.f32" in src
    lines = src.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("TF32_CVT = "))
    choice = "\n".join(lines[start:start + 2])  # the constant's statement (two lines)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for interpret, major, cvt in (("1", 9, False), ("0", 9, True), ("0", 8, True), ("0", 7, False)):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda major=major: (major, 0))
        scope: dict = {"os": os, "tl": tl, "torch": torch}
        exec(choice, scope)
        assert bool(scope["TF32_CVT"]) is cvt, (interpret, major)
