"""A norm computed inside the GEMM template of the projection it feeds: a LayerNorm's or an RMSNorm's
row statistics in loops of their own before the template's K loop (`GemmTemplate.row_statistic`,
`Emitter.hoisted`), the normalized operand computed where its tile loads; the orchestrator forms such
candidates past the size rule (`candidates.norm_prologues`). In Triton's interpreter on the CPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fake_profiler import TemplatePrologueProfiler
from kernelcheck import DEVICE
from onnx import helper
from opcheck import Const, graph_model, rand
from test_gemm_template import _prologue_kernel, run_exe

import tessera
from tessera import compiler
from tessera.codegen.kernels import GemmSchedule
from tessera.codegen.select import TritonLegality
from tessera.compiler import CompileOptions, compile_model, write_artifacts
from tessera.fission import fission
from tessera.frontend import load
from tessera.orchestrate import build_ograph
from tessera.orchestrate.candidates import CandidateRules, StructuralLegality, enumerate_candidates
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import run_onnxruntime


def _layernorm_matmul(x: np.ndarray, k: int, n: int, seed: int) -> object:
    return graph_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
                        helper.make_node("MatMul", ["y", "w"], ["out"])],
                       {"x": x, "g": Const(rand(k, seed=seed)), "b": Const(rand(k, seed=seed + 1)),
                        "w": Const(rand(k, n, seed=seed + 2))}, ["out"], opset=17)


def _rmsnorm(x: str, out: str, k: int, seed: int) -> tuple[list, dict]:
    """Llama's RMSNorm as its ONNX export spells it: x * (1 / sqrt(mean(x^2) + eps)) * gamma."""
    nodes = [helper.make_node("Pow", [x, "two"], [f"{out}_sq"]),
             helper.make_node("ReduceMean", [f"{out}_sq", "axes"], [f"{out}_ms"], keepdims=1),
             helper.make_node("Add", [f"{out}_ms", "eps"], [f"{out}_v"]),
             helper.make_node("Sqrt", [f"{out}_v"], [f"{out}_s"]),
             helper.make_node("Reciprocal", [f"{out}_s"], [f"{out}_r"]),
             helper.make_node("Mul", [x, f"{out}_r"], [f"{out}_n"]),
             helper.make_node("Mul", [f"{out}_n", f"{out}_g"], [out])]
    consts = {"two": Const(np.array(2.0, np.float32)), "axes": Const(np.array([-1], np.int64)),
              "eps": Const(np.array(1e-6, np.float32)), f"{out}_g": Const(rand(k, seed=seed))}
    return nodes, consts


@pytest.mark.parametrize("k,block", [(40, 16), (96, 32)])  # a ragged and a whole K walk; statistics over 64 lanes
def test_a_layernorm_is_computed_before_the_k_loop(k, block):
    # Mean, then the variance that reads it: two loops hoisted before the K loop, in that order.
    x = rand(2, 13, k, seed=90)
    ks = _prologue_kernel(_layernorm_matmul(x, k, 24, 91), {"x": x}, GemmSchedule(16, 16, block, 2, 2, 1, 1))
    src = ks.source
    mean, var, walk = src.index("/reduce_sum\n"), src.index("/reduce_sum_1\n"), src.index("for k")
    assert mean < var < walk


def test_split_k_templates_take_the_statistics_too():
    x = rand(3, 16, 256, seed=92)
    _prologue_kernel(_layernorm_matmul(x, 256, 16, 93), {"x": x}, GemmSchedule(16, 16, 32, 2, 2, 1, 4))


def _rmsnorm_matmul(x: np.ndarray, k: int, seed: int) -> object:
    norm, consts = _rmsnorm("x", "y", k, seed=seed)
    return graph_model([*norm, helper.make_node("MatMul", ["y", "w"], ["out"])],
                       {"x": x, **consts, "w": Const(rand(k, 24, seed=seed + 1))}, ["out"], opset=18)


@pytest.mark.parametrize("k", [40, 96])
def test_an_rmsnorm_scales_the_accumulator_after_one_walk(k):
    # rstd is a factor of each row: the operand loads without it, the mean square accumulates from
    # the same tiles in the K loop, and the accumulator is scaled once after it. One loop in all.
    x = rand(2, 13, k, seed=110)
    src = _prologue_kernel(_rmsnorm_matmul(x, k, 111), {"x": x}, GemmSchedule(16, 16, 16, 2, 2, 1, 1)).source
    assert src.count("for ") == 1 and "deferred" in src and "stat" in src
    # each step's squares are summed per row at once: no [BLOCK_M, BLOCK_K] sum is held across the walk
    assert "= tl.full([BLOCK_M, 1], 0.0, tl.float32)" in src and "tl.full([BLOCK_M, BLOCK_K]" not in src


def test_a_split_k_rmsnorm_takes_its_statistic_before_the_walk():
    # Each program walks a slice of K, so the statistic gets its own loop over the whole row.
    x = rand(2, 13, 256, seed=112)
    src = _prologue_kernel(_rmsnorm_matmul(x, 256, 113), {"x": x}, GemmSchedule(16, 16, 32, 2, 2, 1, 4)).source
    assert "deferred" not in src and src.index("/reduce_sum") < src.index("for k")


def _measured(model, tmp_path: Path, monkeypatch, precision: str):
    """A measured compile whose profiler prices every template at 1.5 us (other kernels 1 us a
    primitive): the fused norm wins wherever it is a legal candidate."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: TemplatePrologueProfiler(GemmSchedule))
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), precision=precision))
    # the real GPU again where there is one (torch's streams refuse a CUDA that says it is absent:
    # "invalid argument to getCurrentStream", this test on the H100, session 57); the CPU's says none
    monkeypatch.undo()
    return result


@pytest.mark.parametrize("precision,kind", [("fp32", "layernorm"), ("fp16", "layernorm"), ("fp16", "rmsnorm")])
def test_a_pre_norm_block_folds_its_norms_into_the_projections(tmp_path, monkeypatch, precision, kind):
    # h = x + r; norm(h) @ w1 + b1 -> relu -> @ w2, plus h. The norm (its reductions, root and scale)
    # joins the first projection's template: a LayerNorm with the bias and relu is past the
    # 16-primitive size rule. h, read by the residual add too, comes from another kernel.
    x, r = rand(2, 13, 48, seed=94), rand(2, 13, 48, seed=95)
    if kind == "rmsnorm":
        norm, consts = _rmsnorm("h", "y", 48, seed=96)
    else:
        norm = [helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
        consts = {"g": Const(rand(48, seed=96)), "b": Const(rand(48, seed=106))}
    model = graph_model([helper.make_node("Add", ["x", "r"], ["h"]), *norm,
                         helper.make_node("MatMul", ["y", "w1"], ["u"]), helper.make_node("Add", ["u", "b1"], ["ub"]),
                         helper.make_node("Relu", ["ub"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["o"]),
                         helper.make_node("Add", ["o", "h"], ["out"])],
                        {"x": x, "r": r, **consts, "w1": Const(rand(48, 40, seed=97)), "b1": Const(rand(40, seed=98)),
                         "w2": Const(rand(40, 48, seed=99))}, ["out"], opset=18)
    result = _measured(model, tmp_path, monkeypatch, precision)
    (folded,) = [k for k in result.kernels if {"reduce_sum", "matmul"} <= {n.op for n in k.prims}]
    assert folded.backend == "template" and {"sqrt", "reciprocal"} <= {n.op for n in folded.prims}
    assert result.tuning["failed"] == 0
    write_artifacts(result, tmp_path / "art")
    feeds = {"x": x, "r": r}
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), feeds)[0]
    assert rel_l2(got, run_onnxruntime(model, feeds)["out"]) < TOLERANCE[precision]


def test_the_norm_joins_its_projection_past_the_size_rule():
    # The LayerNorm alone is 14 primitives; under a cap of 8 only the grown set holds it whole.
    x = rand(2, 13, 40, seed=107)
    og = build_ograph(fission(load(_layernorm_matmul(x, 40, 24, 108)).graph).graph)

    def whole(rules: CandidateRules) -> bool:
        cands = enumerate_candidates(og, og.all, rules, TritonLegality(templates=True))
        return any(c.nodes == og.all for c in cands)

    assert og.n > 8 and whole(CandidateRules(max_nodes=8))
    assert not whole(CandidateRules(max_nodes=8, max_norm_prologue=0))


def test_a_norm_read_elsewhere_is_not_grown_into_the_projection():
    # Post-norm (BERT): the norm's result feeds the projection and the residual add after the next
    # one, so the projection would have to write a value of its prologue; no candidate holds both.
    x = rand(2, 13, 40, seed=100)
    model = graph_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
                         helper.make_node("MatMul", ["y", "w"], ["u"]), helper.make_node("Relu", ["u"], ["a"]),
                         helper.make_node("MatMul", ["a", "w2"], ["o"]), helper.make_node("Add", ["o", "y"], ["out"])],
                        {"x": x, "g": Const(rand(40, seed=101)), "b": Const(rand(40, seed=102)),
                         "w": Const(rand(40, 40, seed=103)), "w2": Const(rand(40, 40, seed=104))}, ["out"], opset=17)
    og = build_ograph(fission(load(model).graph).graph)
    cands = enumerate_candidates(og, og.all, CandidateRules(), TritonLegality(templates=True))
    assert cands and not any({"reduce_sum", "matmul"} <= {og.nodes[i].op for i in range(og.n) if (c.nodes >> i) & 1}
                             for c in cands)


def test_a_statistic_of_a_value_the_operand_does_not_read_is_refused():
    # A norm cut apart: the kernel from the variance's reduction on reads the squares from memory,
    # which the normalized operand itself never reads. Refused, and so is every kernel like it.
    x = rand(2, 13, 40, seed=104)
    og = build_ograph(fission(load(_layernorm_matmul(x, 40, 24, 105)).graph).graph)
    (var,) = [i for i in range(og.n) if og.nodes[i].name.endswith("/reduce_sum_1")]
    partial = og.desc[var] | (1 << var)  # the variance's reduction and everything after it
    assert og.preds[var] and not partial & og.preds[var]
    why = StructuralLegality(prologues=True).check(og, partial)
    assert why is not None and "row statistic reads only what its operand reads" in why
    assert StructuralLegality(prologues=True).check(og, og.all) is None
    assert StructuralLegality().check(og, og.all) is not None  # no prologues: no norm either


def test_a_statistic_over_more_than_the_row_the_k_loop_walks_is_refused():
    # An InstanceNorm's statistics reduce 36 pixels per channel; the projection after it walks the
    # 4 channels of each pixel. Every program would recompute them for each of its rows.
    x = rand(1, 4, 6, 6, seed=116)
    model = graph_model([helper.make_node("InstanceNormalization", ["x", "g", "b"], ["n"], epsilon=1e-5),
                         helper.make_node("Transpose", ["n"], ["t"], perm=[0, 2, 3, 1]),
                         helper.make_node("MatMul", ["t", "w"], ["out"])],
                        {"x": x, "g": Const(rand(4, seed=117)), "b": Const(rand(4, seed=118)),
                         "w": Const(rand(4, 5, seed=119))}, ["out"])
    og = build_ograph(fission(load(model).graph).graph)
    why = StructuralLegality(prologues=True).check(og, og.all)
    assert why is not None and "reduces at most the 4 elements" in why


def test_a_float16_operand_without_its_row_factor_stays_in_range():
    # x holds values near float16's largest and gamma is 3: x * gamma alone would overflow, the
    # normalized operand does not. The operand is scaled by a power of two first (2**-2 here) and
    # the accumulator takes it back; the result matches the float64 reference.
    from test_gemm_template import run_template
    from tessera.codegen.select import implement, prologue_of
    from tessera.ir import interp

    x = rand(2, 13, 64, seed=114)
    x[:, :, 5] = 60000.0
    x[:, 3, 9] = -50000.0
    norm, consts = _rmsnorm("x", "y", 64, seed=115)
    consts["y_g"] = Const(np.full(64, 3.0, np.float32))
    w = Const(rand(64, 24, seed=116).astype(np.float16))
    for c in ("two", "eps", "y_g"):
        consts[c] = Const(consts[c].value.astype(np.float16))
    model = graph_model([*norm, helper.make_node("MatMul", ["y", "w"], ["out"])],
                        {"x": x.astype(np.float16), **consts, "w": w}, ["out"], opset=18)
    g = fission(load(model).graph).graph
    og = build_ograph(g)
    prims = list(og.nodes)
    ks = implement(g, prims, prologue_of(og, prims), list(g.outputs), "k0_test", (),
                   GemmSchedule(16, 16, 16, 2, 2, 1, 1)).triton
    assert "* 0.25" in ks.source and "* 4.0" in ks.source and "deferred" in ks.source
    feeds = {"x": x.astype(np.float16)}
    got = run_template(g, ks, {**g.constants, **feeds})["out"]
    want = interp.run(g, feeds, exact=True)["out"]
    assert np.isfinite(got).all() and rel_l2(got, want) < TOLERANCE["fp16"]


def test_a_layernorm_beta_moves_after_the_projection():
    # matmul(u + beta, W) = matmul(u, W) + beta @ W: the product's operand ends in rstd's product,
    # so a template defers rstd too (the mean keeps its loop before the walk).
    from tessera.ir import interp
    from tessera.rewrite.bias_after import move_bias_after_matmul

    x = rand(2, 13, 40, seed=117)
    g = fission(load(_layernorm_matmul(x, 40, 24, 118)).graph).graph
    moved, n = move_bias_after_matmul(g)
    assert n == 1 and move_bias_after_matmul(moved)[1] == 0
    (mm,) = [m for m in moved.nodes if m.op == "matmul"]
    producer = {o: m for m in moved.nodes for o in m.outputs}
    assert all(producer[t].op != "add" for t in mm.inputs if t in producer)
    want = interp.run(g, {"x": x}, exact=True)["out"]
    assert rel_l2(interp.run(moved, {"x": x}, exact=True)["out"], want) < 1e-6  # b @ W stored in float32
    og = build_ograph(moved)
    prims = list(og.nodes)
    from tessera.codegen.select import implement, prologue_of
    src = implement(moved, prims, prologue_of(og, prims), list(moved.outputs), "k0_test", (),
                    GemmSchedule(16, 16, 16, 2, 2, 1, 1)).triton.source
    assert "deferred" in src and src.count("for ") == 2  # the mean's loop, then the walk


def test_the_bias_stays_where_the_weight_is_computed():
    # W = transpose(V): not a constant matrix the rule can fold b @ W from.
    x = rand(2, 13, 40, seed=119)
    from tessera.rewrite.bias_after import move_bias_after_matmul

    model = graph_model([helper.make_node("Add", ["x", "b"], ["y"]), helper.make_node("MatMul", ["y", "v"], ["out"])],
                        {"x": x, "b": Const(rand(40, seed=120)), "v": rand(40, 24, seed=121)}, ["out"])
    assert move_bias_after_matmul(fission(load(model).graph).graph)[1] == 0


def test_a_product_of_the_normalized_rows_with_themselves_has_no_template_form():
    # y @ y^T: B needs rstd per column of the tile, which no loop of the template computes. The
    # kernel is refused (the norm stays a kernel of its own), with the reason.
    x = rand(2, 13, 40, seed=122)
    norm, consts = _rmsnorm("x", "y", 40, seed=123)
    model = graph_model([*norm, helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
                         helper.make_node("MatMul", ["y", "yt"], ["out"])], {"x": x, **consts}, ["out"], opset=18)
    og = build_ograph(fission(load(model).graph).graph)
    assert StructuralLegality(prologues=True).check(og, og.all) is None
    assert "one value per row of the tile" in TritonLegality(templates=True).check(og, og.all)


class _SplitFavouringProfiler:
    """Split-K templates 1 us, unsplit 2 us, everything else 3 us; a library call with an operand
    prologue fails. Keeps every job it saw."""

    def __init__(self) -> None:
        self.jobs: list = []

    def measure(self, jobs, record) -> None:
        from tessera.codegen.select import operand_prologue

        for i, j in enumerate(jobs):
            self.jobs.append(j)
            if isinstance(j.schedule, GemmSchedule):
                record(i, 1e-6 if j.schedule.split_k > 1 else 2e-6, "")
            elif operand_prologue(j.prims):
                record(i, float("inf"), "a library call cannot compute its operands' prologue")
            else:
                record(i, 3e-6, "")


def test_a_norm_twin_of_a_split_k_core_is_also_timed_unsplit(tmp_path):
    # Few output tiles and a long K: the plain product's fastest tile splits K. Its twin with the
    # RMSNorm in the prologue is timed there (the statistic in a loop of its own) and at an unsplit
    # tile, where rstd moves onto the accumulator and the walk is the only pass.
    from tessera.cost.db import TuningDB
    from tessera.cost.measured import MeasuredCost
    from tessera.orchestrate import orchestrate

    x = rand(16, 512, seed=124)
    og = build_ograph(fission(load(_rmsnorm_matmul(x, 512, 125)).graph).graph)
    prof = _SplitFavouringProfiler()
    with TuningDB(tmp_path / "t.db") as db:
        orchestrate(og, MeasuredCost(og, db, prof, "fake", "v1", templates=True),
                    rules=CandidateRules(max_linear=1), legality=TritonLegality(templates=True))
    plain = [j.schedule for j in prof.jobs if isinstance(j.schedule, GemmSchedule) and len(j.prims) == 1]
    norm = [j.schedule for j in prof.jobs if isinstance(j.schedule, GemmSchedule)
            and any(n.op == "reduce_sum" for n in j.prims)]
    assert plain and all(s.split_k > 1 for s in plain), plain  # (every head of the first tile shapes splits K)
    assert any(s.split_k > 1 for s in norm) and any(s.split_k == 1 for s in norm), norm
