"""Programmatic dependent launch: every generated kernel may be launched so that the next kernel in
the stream launches while it runs (`codegen/triton_ops.PDL_PROLOGUE`, `codegen/launch.pdl_supported`).
On the CPU the prologue is compiled away; the GPU test compares a replay with and without it."""
from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch
from opcheck import models_dir

import tessera
from tessera.codegen import launch
from tessera.frontend import load
from tessera.runtime.profile import busy_us
from tessera.verify import random_inputs

MODELS = models_dir()
FORCE = tessera.CompileOptions(cost="analytical", templates="force", precision="fp16", solver="highs")


def _first_statement_waits(fn: ast.FunctionDef) -> bool:
    """The function's first statement is `if PDL:` that calls launch_dependents (at PDL 1 only: PDL 2 lets
    the next kernel launch as this one ends) and then wait, and nothing else."""
    first = fn.body[0]
    if not (isinstance(first, ast.If) and isinstance(first.test, ast.Name) and first.test.id == "PDL"):
        return False

    def calls(body: list[ast.stmt]) -> list[str]:
        return [s.value.func.id for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    early, wait = first.body
    return (isinstance(early, ast.If) and ast.unparse(early.test) == "PDL == 1"
            and calls(early.body) == ["gdc_launch_dependents"] and calls([wait]) == ["gdc_wait"])


@pytest.mark.parametrize("name", ["gpt2_tiny.onnx", "candy_small.onnx"])
def test_every_generated_kernel_waits_for_the_kernel_before_it_first_thing(name):
    # A kernel launched with PDL may start while the kernel before it still runs: it must not read
    # what that kernel writes, nor write what it reads, before `gdc_wait`. The forms differ in how
    # their functions are rendered (memory-bound kernels, GEMM, convolution and chain templates,
    # split launches): each function must open with the prologue, and default it off.
    exe = tessera.compile(MODELS / name, FORCE)
    forms, functions = set(), 0
    for st in exe.steps:
        if st.kernel is None:
            continue
        forms.add(st.impl.backend)
        for fn in (n for n in ast.walk(ast.parse(st.kernel.ks.source)) if isinstance(n, ast.FunctionDef)):
            functions += 1
            assert _first_statement_waits(fn), f"{st.impl.name}: {fn.name} touches memory before gdc_wait"
            pdl = [a for a in fn.args.args if a.arg == "PDL"]
            assert pdl and isinstance(fn.args.defaults[-1], ast.Constant) and fn.args.defaults[-1].value == 0
    assert functions > len(forms) > 1, forms  # several forms, and more functions than kernels of one


def test_a_pdl_kernel_is_launched_and_compiled_with_the_flag():
    # `launch_pdl` is one of Triton's compile options: the warmup must compile what the launch runs.
    exe = tessera.compile(MODELS / "gpt2_tiny.onnx", FORCE)
    kernel = next(st.kernel for st in exe.steps if st.kernel is not None)
    seen = []

    class Fake:
        def __getitem__(self, grid):
            return lambda *args, **meta: seen.append(("launch", meta))

        def warmup(self, *args, grid, **meta):
            seen.append(("warmup", meta))

    kernel.launches = [(Fake(), grid, meta) for _, grid, meta in kernel.launches]
    args = [torch.empty(0)] * (len(kernel.ks.inputs) + len(kernel.ks.outputs))
    kernel.pdl = False
    kernel(*args)
    assert all("PDL" not in meta and "launch_pdl" not in meta for _, meta in seen)
    seen.clear()
    kernel.pdl = True
    kernel(*args)
    kernel.compile_only(*args)
    assert [w for w, _ in seen] == ["launch"] * len(kernel.launches) + ["warmup"] * len(kernel.launches)
    assert all(meta["PDL"] == 1 and meta["launch_pdl"] is True for _, meta in seen)


def test_pdl_needs_hopper_and_can_be_turned_on_and_off(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("TESSERA_PDL", raising=False)
    assert launch.pdl_supported(gpu) == launch.PDL_DEFAULT
    monkeypatch.setenv("TESSERA_PDL", "1")
    assert launch.pdl_supported(gpu)
    assert not launch.pdl_supported(torch.device("cpu"))
    monkeypatch.setenv("TESSERA_PDL", "0")
    assert not launch.pdl_supported(gpu)
    monkeypatch.setenv("TESSERA_PDL", "1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not launch.pdl_supported(gpu)  # griddepcontrol is sm_90's


def _span(start: float, end: float) -> SimpleNamespace:
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end))


def test_busy_time_counts_overlapping_kernels_once():
    # Under PDL a kernel starts (and waits) while the one before runs: summing their spans counts the
    # overlap twice. Gaps between kernels are not busy; a span inside another adds nothing.
    spans = [_span(0, 10), _span(4, 12), _span(5, 6), _span(15, 20), _span(19, 21)]
    assert busy_us(spans) == 12 + 6
    assert busy_us([_span(0, 3), _span(3, 5)]) == 5
    assert busy_us([]) == 0


def test_each_kernel_counts_its_time_after_the_kernels_before_it():
    # A plan kernel's profiled time under PDL is its span after the kernel before it ended, not the
    # span that counts its wait (session 63: bert_base's 12 attention kernels read 133 µs by their
    # spans). The times sum to the busy time; without overlap they are the spans.
    from tessera.runtime.profile import _attribute, exposed_us

    def ev(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end,
                                                                     elapsed_us=lambda: end - start))
    spans = [_span(0, 10), _span(4, 12), _span(5, 6), _span(15, 20)]
    assert exposed_us(spans) == [10, 2, 0, 5]
    replay = [ev("k0_a", 0, 3), ev("k1_b", 1, 7), ev("k0_a", 10, 13), ev("k1_b", 11, 15)]
    rows, how = _attribute([("k0", "k0_a"), ("k1", "k1_b")], replay, 2)
    assert how == "order"
    assert [(pk, us) for pk, _, us, _ in rows] == [("k0", 3), ("k1", 3)]  # spans 6 and 4
    assert sum(us for *_, us, _ in rows) == busy_us(replay) / 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["gpt2_tiny.onnx", "candy_small.onnx"])
def test_a_pdl_replay_computes_what_the_same_plan_computes_without_it(name, monkeypatch):
    opts = tessera.CompileOptions(cost="analytical", templates="force", precision="fp16", solver="highs")
    monkeypatch.setenv("TESSERA_PDL", "1")
    with_pdl = tessera.compile(MODELS / name, opts, device="cuda")
    monkeypatch.setenv("TESSERA_PDL", "0")
    without = tessera.compile(MODELS / name, opts, device="cuda")
    assert with_pdl.pdl == (torch.cuda.get_device_capability()[0] >= 9) and not without.pdl
    graph = load(MODELS / name).graph
    for seed in (1, 2, 3):  # the first call captures, the others replay on new inputs
        feeds = {k: torch.from_numpy(v) for k, v in random_inputs(graph, seed).items()}
        got, want = with_pdl.run(**feeds), without.run(**feeds)
        for k in want:
            assert torch.equal(got[k], want[k])  # same kernels in the same order: bitwise equal
    assert with_pdl._graph is not None


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a Hopper GPU")
def test_late_chain_kernels_compute_the_same_bits(monkeypatch):
    # A chain kernel launched late (`ChainSchedule.late`) makes the kernel before it launch with PDL=2:
    # it waits for its own predecessor but lets the next launch only as it ends. Same kernels, same
    # order: the same bits as the plan launched as tuned.
    from tessera.compiler import compile_model, plan_document
    from tessera.runtime.executable import Executable

    monkeypatch.setenv("TESSERA_PDL", "1")
    result = compile_model(MODELS / "gpt2_tiny.onnx", FORCE)
    plan = plan_document(result)
    chains = [k for k in plan["kernels"] if k.get("schedule", {}).get("form") == "chain"]
    assert chains, "gpt2_tiny's attention should be chain kernels under forced templates"
    tuned = Executable(result.graph, plan, "cuda")
    for k in chains:
        k["schedule"]["late"] = True
    late = Executable(result.graph, plan, "cuda")
    assert any(st.kernel.pdl == 2 for st in late.steps if st.kernel is not None)
    assert all(st.kernel.pdl == 1 for st in tuned.steps if st.kernel is not None)
    graph = load(MODELS / "gpt2_tiny.onnx").graph
    for seed in (1, 2):
        raw = {k: torch.from_numpy(v) for k, v in random_inputs(graph, seed).items()}
        got = late.run_static(late.bind_inputs(late.prepare_inputs(**raw)))
        want = tuned.run_static(tuned.bind_inputs(tuned.prepare_inputs(**raw)))
        for k in want:
            assert torch.equal(got[k], want[k])


def test_timings_with_pdl_are_kept_apart_from_those_without(monkeypatch):
    # A PDL launch overlaps the one before it in the timing graph: its timings must not answer for a
    # compile without PDL, nor the reverse.
    from tessera.cost.db import software_versions

    monkeypatch.setenv("TESSERA_PDL", "1")
    with_pdl = software_versions()
    monkeypatch.setenv("TESSERA_PDL", "0")
    assert software_versions() != with_pdl and "pdl" in with_pdl


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a Hopper GPU")
def test_a_split_k_template_under_pdl_sums_each_launch_after_the_one_before():
    # A split-K template's last program per tile resets the tile's arrival counter. Launched back to
    # back under PDL, each launch starts while the one before runs: its programs may count themselves
    # in only after that launch has finished (gdc_wait first thing), or the sums mix.
    from test_gemm_template import dense, matmul_kernel, template_launch

    from tessera.codegen.kernels import GemmSchedule
    from tessera.codegen.select import implement
    from tessera.fission import fission
    from tessera.ir import interp

    model, feeds = dense(19, 37, 301, "relu", seed=25)
    g = fission(load(model).graph).graph
    prims, pro, outputs = matmul_kernel(g)
    ks = implement(g, prims, pro, outputs, "k0", (), GemmSchedule(16, 16, 16, 2, 2, 1, 3)).triton
    env = {**g.constants, **interp.run(g, feeds, keep_all=True)}
    plain, args, outs = template_launch(g, ks, env)
    plain(*args, *outs)
    pdl, pdl_args, pdl_outs = template_launch(g, ks, env)
    pdl.pdl = True
    for _ in range(8):
        pdl(*pdl_args, *pdl_outs)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(outs, pdl_outs))
    tiles = 2 * 3  # ceil(19 / 16) x ceil(37 / 16)
    assert pdl.workspace is not None and pdl.workspace[-tiles:].abs().sum().item() == 0
