"""GEMM templates in the compiler (codegen/gemm.py's wiring): analytical plans, measured compiles
that weigh a template against the library, artifacts that reload it, operand prologues, and a whole
model with every matmul kernel forced onto its template. The generator's own cases are in
test_gemm_template.py, whose harness this file shares.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from kernelcheck import DEVICE
from onnx import helper
from fake_profiler import TemplatePrologueProfiler
from opcheck import Const, graph_model, models_dir, rand
from test_gemm_template import dense, matmul_kernel, run_exe

import tessera
from tessera import compiler
from tessera.codegen.kernels import ChainSchedule, GemmSchedule, schedule_from_json
from tessera.codegen.launch import use_interpreter
from tessera.codegen.select import implement, prologue_of
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import CompileOptions, compile_model, write_artifacts
from tessera.cost.measured import Job
from tessera.cost.schedule_model import rank_templates
from tessera.fission import fission
from tessera.frontend import load
from tessera.orchestrate import build_ograph
from tessera.runtime.buffers import round_tf32
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime


# ---- wiring --------------------------------------------------------------------------------------
def mlp(weights_as_inputs: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two dense layers with a GELU between: two matmul kernels with epilogues."""
    x = rand(13, 31, seed=30)
    w = {"w1": rand(31, 67, seed=31, lo=-0.5, hi=0.5), "w2": rand(67, 7, seed=33, lo=-0.5, hi=0.5)}
    m = graph_model([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
                     helper.make_node("Gelu", ["hb"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["y"]),
                     helper.make_node("Add", ["y", "b2"], ["out"])],
                    {"x": x, **{k: v if weights_as_inputs else Const(v) for k, v in w.items()},
                     "b1": Const(rand(67, seed=32)), "b2": Const(rand(7, seed=34))}, ["out"])
    return m, {"x": x, **(w if weights_as_inputs else {})}


def test_analytical_compiles_are_unchanged_unless_forced():
    model, feeds = mlp()
    auto = compile_model(model, CompileOptions(cost="analytical"))
    assert "template" not in {k.backend for k in auto.kernels}
    off = compile_model(model, CompileOptions(cost="analytical", templates="off"))
    assert [k.triton.source if k.triton else k.backend for k in auto.kernels] == \
        [k.triton.source if k.triton else k.backend for k in off.kernels]
    # Chains off: forced, the two matmuls would form one GEMM chain (tests/test_chain.py).
    exe = tessera.compile(model, CompileOptions(cost="analytical", templates="force", chains=False), DEVICE)
    assert exe.backends.get("template") == 2 and "linear" not in exe.backends
    (src,) = [s for n, s in exe.sources().items() if "erf" in s]
    assert "GEMM template" in src and "ONNX nodes: Add_1, Gelu_2, MatMul_0" in src
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(exe, feeds)[0], ref) < TOLERANCE["fp32"]


def test_tf32_constant_operands_are_rounded_once_at_load():
    # A tf32 template rounds an activation operand in its K loop. A constant that only its dot
    # reads is rounded once, at load, into a copy that replaces the original (the weight is held
    # once). The same bits reach the dot: the output equals the one with the weights fed as inputs,
    # which the loop rounds. The copy of a B operand is also stored K-major ([N, K]), the order
    # Hopper's wgmma reads tf32 operands in.
    opts = CompileOptions(cost="analytical", templates="force", precision="tf32", chains=False)
    model, feeds = mlp()
    exe = tessera.compile(model, opts, DEVICE)
    tmpl = [s.kernel.ks for s in exe.steps if s.impl.backend == "template"]
    assert [ks.rounded_inputs for ks in tmpl] == [("w1",), ("w2",)]
    assert [ks.input_layouts for ks in tmpl] == [{"w1": (1, 0)}, {"w2": (1, 0)}]
    # x rounds in the first loop; the GELU between is stored rounded by the first template and read
    # as it is by the second (Graph.tf32_rounded: only the second product reads it)
    assert [ks.source.count(" = tf32_round(") for ks in tmpl] == [2, 0]
    assert all("(stored in dim order 10, rounded to tf32 once, at load)" in ks.source for ks in tmpl)
    assert {"w1@10@tf32", "w2@10@tf32"} <= set(exe.constants) and not {"w1", "w2"} & set(exe.constants)
    w1 = exe.constants["w1@10@tf32"].cpu()
    assert w1.stride() == (1, 31) and torch.equal(w1, round_tf32(torch.from_numpy(np.array(exe.graph.constants["w1"]))))
    fed_model, fed = mlp(weights_as_inputs=True)
    fed_exe = tessera.compile(fed_model, opts, DEVICE)
    fed_tmpl = [s.kernel.ks for s in fed_exe.steps if s.impl.backend == "template"]
    assert all(ks.rounded_inputs == () for ks in fed_tmpl)
    assert [ks.source.count(" = tf32_round(") for ks in fed_tmpl] == [3, 1]  # x, w1 and the stored GELU; w2
    got = run_exe(exe, feeds)[0]
    assert np.array_equal(got, run_exe(fed_exe, fed)[0])
    err = rel_l2(got, run_onnxruntime(model, feeds)["out"])
    assert 1e-6 < err < TOLERANCE["tf32"]  # tf32's error, not fp32's


def test_round_tf32_rounds_to_nearest_ties_away():
    x = torch.tensor([1 + 2**-11, 1 + 2**-11 - 2**-23, -(1 + 3 * 2**-11), 1 + 2**-10 + 2**-11, 65504.0,
                      float("inf"), -float("inf"), float("nan"), 3.4e38])
    got = round_tf32(x)
    want = torch.tensor([1 + 2**-10, 1.0, -(1 + 2 * 2**-10), 1 + 2 * 2**-10, 65504.0,
                         float("inf"), -float("inf"), float("nan"), float(np.float32(3.4e38))])
    # the last: its rounded mantissa stays finite (3.4e38 is below tf32's largest finite value)
    assert torch.equal(got[:7], want[:7]) and torch.isnan(got[7]) and torch.isfinite(got[8])
    assert (got.view(torch.int32) & 8191 == 0)[torch.isfinite(got)].all()


class TemplateFavouringProfiler:
    """Templates measure faster than the library here (split-K fastest of all)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def measure(self, jobs: list[Job], record) -> None:
        for i, j in enumerate(jobs):
            self.keys.append(j.key.schedule)
            s = j.schedule
            record(i, 1e-6 / s.split_k if isinstance(s, GemmSchedule) else 5e-6, "")


@pytest.fixture
def fake_gpu(monkeypatch) -> TemplateFavouringProfiler:
    prof = TemplateFavouringProfiler()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    return prof


def test_measured_compile_picks_a_template_and_the_artifact_reloads_it(tmp_path, fake_gpu):
    model, feeds = mlp()
    check_template_round_trip(model, feeds, tmp_path, fake_gpu.keys, "gemm", 2)


def check_template_round_trip(model: onnx.ModelProto, feeds: dict, tmp_path, keys: list, form: str,
                              count: int) -> None:
    """A measured compile (fake GPU whose `keys` log what it timed) runs `count` kernels as `form`
    templates; the artifact saves their schedules, reloads, runs them and checks; a second compile
    takes everything from the database."""
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db")))
    templates = [k for k in result.kernels if k.backend == "template"]
    assert len(templates) == count and all(k.linear.op == ("matmul" if form == "gemm" else "conv") for k in templates)
    other = "conv" if form == "gemm" else "gemm"
    assert "default" in keys and any(k.startswith(f"{form}-") for k in keys)
    assert not any(k.startswith(f"{other}-") for k in keys)
    out = tmp_path / "art"
    write_artifacts(result, out)
    doc = json.loads((out / "plan.json").read_text())
    saved = [k for k in doc["kernels"] if k["backend"] == "template"]
    assert len(saved) == count and all(k["schedule"]["form"] == form for k in saved)
    assert {k.name: k.triton.schedule for k in templates} == \
        {k["name"]: schedule_from_json(k["schedule"]) for k in saved}
    exe = tessera.load(out, DEVICE)
    assert exe.backends.get("template") == count
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(exe, feeds)[0], ref) < TOLERANCE["fp32"]
    keys.clear()
    again = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db")))
    assert not keys  # all from the database
    assert [k.backend for k in again.kernels] == [k.backend for k in result.kernels]


class FusionProfiler:
    """A library call costs 1 us alone and 5 us with its epilogue kernel, an epilogue alone 1 us;
    a template 3 us alone and 1.5 us with the whole epilogue fused (2.5 with part of it)."""

    def measure(self, jobs: list[Job], record) -> None:
        for i, j in enumerate(jobs):
            linear = any(n.op == "matmul" for n in j.prims)
            alone = len(j.prims) == 1
            if isinstance(j.schedule, GemmSchedule):
                us = 3.0 if alone else 1.5 if "out" in j.outputs else 2.5
            else:
                us = (1.0 if alone else 5.0) if linear else 1.0
            record(i, us * 1e-6, "")


def test_the_binary_program_weighs_template_costs(tmp_path, monkeypatch):
    # Split, the library plan costs 1 + 1 us against 5 us fused; as a template the fused kernel
    # costs 1.5. Measured as candidates (not only after the plan), the template changes the plan.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: FusionProfiler())
    x = rand(13, 31, seed=40)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
                         helper.make_node("Gelu", ["hb"], ["out"])],
                        {"x": x, "w": Const(rand(31, 67, seed=41)), "b": Const(rand(67, seed=42))}, ["out"])
    fused = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "a.db")))
    assert [k.backend for k in fused.kernels] == ["template"]
    assert fused.tuning["template_candidates"] > 0 and fused.tuning["templates_faster"] > 0
    assert fused.plan.estimated_total_s == pytest.approx(1.5e-6)
    split = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "b.db"), templates="off"))
    assert sorted(k.backend for k in split.kernels) == ["linear", "triton"]
    assert split.tuning["template_candidates"] == 0 and split.plan.estimated_total_s == pytest.approx(2e-6)
    exe = tessera.compile(model, CompileOptions(cost="measured", db=str(tmp_path / "a.db")), DEVICE)
    assert rel_l2(run_exe(exe, {"x": x})[0], run_onnxruntime(model, {"x": x})["out"]) < TOLERANCE["fp32"]


def test_an_operand_prologue_fuses_into_a_measured_template(tmp_path, monkeypatch):
    from tessera.codegen.select import operand_prologue

    # relu(x * s + t) @ w: three elementwise primitives feed the matmul's A operand. With templates
    # measured, the binary program may put them in the matmul's kernel, computed as A is loaded
    # (issue 14: prologue fusion); the library cannot, so only its template prices the candidate.
    prof = TemplatePrologueProfiler(GemmSchedule)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    x, sc = rand(13, 31, seed=60), rand(13, 1, seed=61)
    model = graph_model([helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Add", ["xs", "t"], ["xt"]),
                         helper.make_node("Relu", ["xt"], ["xr"]), helper.make_node("MatMul", ["xr", "w"], ["out"])],
                        {"x": x, "s": sc, "t": Const(rand(31, seed=62)), "w": Const(rand(31, 17, seed=63))}, ["out"])
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db")))
    (k,) = result.kernels
    assert k.backend == "template" and {n.op for n in k.prims} >= {"mul", "add", "max", "matmul"}
    assert prof.failed == 0  # no library job is formed for a prologue candidate: only its template is timed
    assert result.tuning["failed"] == 0
    feeds = {"x": x, "s": sc}
    ref = run_onnxruntime(model, feeds)["out"]
    out = tmp_path / "art"
    write_artifacts(result, out)
    assert rel_l2(run_exe(tessera.load(out, DEVICE), feeds)[0], ref) < TOLERANCE["fp32"]
    # Without templates, with prologues off, or with analytical costs, no kernel holds an operand prologue.
    for opts in (CompileOptions(cost="measured", db=str(tmp_path / "t.db"), templates="off"),
                 CompileOptions(cost="measured", db=str(tmp_path / "t.db"), prologues=False),
                 CompileOptions(cost="analytical")):
        plain = compile_model(model, opts)
        assert len(plain.kernels) == 2 and not any(operand_prologue(k.prims) for k in plain.kernels)


def test_the_library_refuses_an_operand_prologue():
    x = rand(13, 31, seed=64)
    model = graph_model([helper.make_node("Relu", ["x"], ["xr"]), helper.make_node("MatMul", ["xr", "w"], ["out"])],
                        {"x": x, "w": Const(rand(31, 17, seed=65))}, ["out"])
    g = fission(load(model).graph).graph
    og = build_ograph(g)
    prims = list(og.nodes)
    with pytest.raises(Unsupported, match="cannot compute its operands' prologue"):
        implement(g, prims, prologue_of(og, prims), ["out"], "k0")


def test_measured_compile_keeps_the_library_when_it_is_faster(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(fake_gpu, "measure", lambda jobs, record: [
        record(i, 1e-5 if isinstance(j.schedule, (GemmSchedule, ChainSchedule)) else 1e-6, "")
        for i, j in enumerate(jobs)])
    model, _ = mlp()
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db")))
    assert "template" not in {k.backend for k in result.kernels}


def test_gpt2_tiny_with_every_matmul_on_its_template(monkeypatch):
    # Forced templates; the largest tiles keep the interpreter's program count (and time) small.
    from tessera.cost import schedule_model

    ranking = schedule_model.rank_templates
    monkeypatch.setattr(schedule_model, "rank_templates", lambda *a, **k: sorted(
        ranking(*a, **k), key=lambda s: -s.block_m * s.block_n * s.block_k))
    path = models_dir() / "gpt2_tiny.onnx"
    exe = tessera.compile(path, CompileOptions(cost="analytical", templates="force", chains=False), DEVICE)
    assert exe.backends.get("template") == 12 and "linear" not in exe.backends
    assert any("tanh" in s and "GEMM template" in s for s in exe.sources().values())  # GPT-2's GELU, fused
    model = load(path)
    feeds = random_inputs(model.graph, seed=11)
    ref = run_onnxruntime(model.model, feeds)
    for name, out in zip(exe.output_names, run_exe(exe, feeds)):
        assert rel_l2(out, ref[name]) < TOLERANCE["fp32"]


def test_a_template_candidate_that_disagrees_with_the_library_fails_its_build():
    # The profiler's build phase runs each template candidate beside the library kernel on the
    # same inputs: a kernel that Triton miscompiles must lose its measurement, never win it.
    from tessera.cost.db import Key
    from tessera.cost.profiler import _inputs, kernel_graph, template_disagreement
    from tessera.runtime.executable import Executable

    model, _ = dense(13, 17, 31, "relu")
    g = fission(load(model).graph).graph
    prims, pro, outputs = matmul_kernel(g)
    s = rank_templates(g, pro + prims, outputs, "fp32")[0]
    mini, plan = kernel_graph(Job(Key("d", "v", "sig", "s"), g, tuple(prims), tuple(pro), tuple(outputs), s))
    use_interpreter(torch.device(DEVICE))
    feeds = _inputs(mini, DEVICE, 0)
    exe = Executable(mini, plan, DEVICE, cuda_graph=False)
    got = exe._launch(feeds)
    assert exe.backends == {"template": 1}
    assert template_disagreement(mini, plan, feeds, got, DEVICE) == ""
    off = {t: v * 1.01 for t, v in got.items()}  # 1% off: an fp32 template must agree far better
    assert "wrong result" in template_disagreement(mini, plan, feeds, off, DEVICE)
    library = {**plan, "kernels": [{k: v for k, v in plan["kernels"][0].items() if k != "schedule"}]}
    assert template_disagreement(mini, library, feeds, off, DEVICE) == ""  # only templates are checked


def test_a_prologue_template_is_checked_against_the_prologue_then_the_library():
    # No library call computes an operand prologue: the reference runs it as a generated kernel
    # first, then the library call, so a prologue candidate can pass its check (and fail it).
    from tessera.cost.profiler import template_disagreement

    model = graph_model([helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Relu", ["xs"], ["xr"]),
                         helper.make_node("MatMul", ["xr", "w"], ["out"])],
                        {"x": rand(13, 31, seed=66), "s": Const(rand(31, seed=67)), "w": Const(rand(31, 17, seed=68))},
                        ["out"])
    mini, plan, feeds, got = template_run(model, lambda n: True)
    assert template_disagreement(mini, plan, feeds, got, DEVICE) == ""
    assert "wrong result" in template_disagreement(mini, plan, feeds, {t: v * 1.01 for t, v in got.items()}, DEVICE)


def template_run(model, keep):
    """The template candidate of `model`'s primitives that `keep`, as the profiler's build runs it:
    (its one-kernel graph, plan, inputs, outputs)."""
    from tessera.cost.db import Key
    from tessera.cost.profiler import _inputs, kernel_graph
    from tessera.runtime.executable import Executable

    g = fission(load(model).graph).graph
    og = build_ograph(g)
    prims = [n for n in og.nodes if keep(n)]
    pro = prologue_of(og, prims)
    s = rank_templates(g, pro + prims, ["out"], "fp32")[0]
    mini, plan = kernel_graph(Job(Key("d", "v", "sig", "s"), g, tuple(prims), tuple(pro), ("out",), s))
    use_interpreter(torch.device(DEVICE))
    feeds = _inputs(mini, DEVICE, 0)
    return mini, plan, feeds, Executable(mini, plan, DEVICE, cuda_graph=False)._launch(feeds)


def test_a_prologue_of_two_reshapes_runs_in_order_in_the_reference():
    # segformer_b0 (session 16): a template reading a transposed activation through two reshapes
    # failed every build with a KeyError: the reference ran its operand prologue's reshapes last
    # first (`operand_prologue` listed them walking back from the matmul).
    from tessera.cost.profiler import template_disagreement

    model = graph_model([helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1, 3]),
                         helper.make_node("Reshape", ["xt", "shape"], ["xr"]),
                         helper.make_node("MatMul", ["xr", "w"], ["out"])],
                        {"x": rand(1, 4, 8, 16, seed=69), "shape": Const(np.array([1, 8, 64], np.int64)),
                         "w": Const(rand(64, 17, seed=70))}, ["out"])
    mini, plan, feeds, got = template_run(model, lambda n: n.op != "transpose")
    assert [n.op for n in mini.nodes].count("reshape") >= 2
    assert template_disagreement(mini, plan, feeds, got, DEVICE) == ""
