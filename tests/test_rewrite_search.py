"""The rewrite search (rewrite/search.py): kept only where the window's plan costs less, replayed
exactly from an artifact, and every shared model still correct after it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tessera.cli.main import main
from tessera.frontend import load
from tessera.fission import fission
from tessera.ir.interp import run
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import new_graph
from tessera.rewrite.search import neighbourhood, replay, search, window_graph
from tessera.runtime.artifact import graph_digest
from tessera.verify import verify

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
ALL = sorted(p.name for p in MODELS.glob("*.onnx"))
# The full-size networks with a `_small` twin (the same graph at a smaller input) are checked through
# the twin: the rewrites match structure, and the full sizes only made the reference slower (27 s).
NETWORKS = [n for n in ALL if n.replace(".onnx", "_small.onnx") not in ALL]


def _softmax_then_matmul():
    """softmax(x) @ v written as fission writes it: exp, its row sum, the division, the product."""
    g, b = new_graph({"x": (2, 5, 7), "v": (2, 7, 3)})
    e = b.unary(Prim.EXP, "x")
    s = b.emit(Prim.REDUCE_SUM, [e], {"axes": (2,)})
    p = b.div(e, s)
    g.outputs = [b.matmul(p, "v")]
    return g


def _count(g, *ops):
    return sum(n.op in {o.value for o in ops} for n in g.nodes)


def test_a_sequence_that_pays_only_whole_is_found():
    """Korch's softmax: the sum as a matmul gains nothing alone (one reduction for one matmul), the
    division past the product nothing either; merging the two products then saves one. A cost of
    one per reduction or matmul makes only the three steps together worth it."""
    g = _softmax_then_matmul()
    cost = lambda w: float(_count(w, Prim.MATMUL, Prim.REDUCE_SUM))  # noqa: E731
    found = search(g, cost)
    rules = [a.rule for a in found.applied]
    assert "reduce_sum_as_matmul" in rules and "matmuls_sharing_left" in rules, rules
    assert _count(found.graph, Prim.MATMUL) == 1 and _count(found.graph, Prim.REDUCE_SUM) == 0
    assert found.applied[0].gain_s == pytest.approx(1.0)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 7)).astype(np.float32),
             "v": np.random.default_rng(1).standard_normal((2, 7, 3)).astype(np.float32)}
    want, got = run(g, feeds, exact=True), run(found.graph, feeds, exact=True)
    np.testing.assert_allclose(got[g.outputs[0]], want[g.outputs[0]], rtol=1e-10)


def test_a_measured_search_confirms_the_models_best_guesses():
    """With a model beside the measurement, the beam runs on the model and only the window and its
    two best sequences are measured; the measurement decides."""
    g = _softmax_then_matmul()
    model = lambda w: float(_count(w, Prim.MATMUL, Prim.REDUCE_SUM))  # noqa: E731
    measured: list[int] = []

    def flat(w):  # the "GPU" finds every form equally fast
        measured.append(len(w.nodes))
        return 1.0

    found = search(g, flat, estimate=model)
    assert not [a for a in found.applied if a.rule == "matmuls_sharing_left"]  # more nodes, no faster: refused
    assert found.evaluated == len(measured) <= 3 * found.sites
    assert search(g, model, estimate=model).applied  # where the measurement agrees, it is kept


def test_nothing_is_kept_that_does_not_pay():
    """A flat cost keeps only rewrites that leave fewer nodes (the tie rule), never one that adds."""
    g = fission(load(MODELS / "bert_tiny.onnx").graph).graph
    found = search(g, lambda w: 1.0)
    assert found.sites > 0
    assert len(found.graph.nodes) <= len(g.nodes)
    assert {a.rule for a in found.applied} <= {"fold_constant_layout", "reshape_of_reshape", "transpose_of_transpose",
                                               "broadcast_of_broadcast"}


def test_a_measured_saving_must_beat_the_noise():
    """Measured window costs wobble by a few percent from run to run; with MEASURED_GAIN the search
    keeps no sequence for a wobble, only node-saving ties. The same wobble under the analytical
    threshold is taken for savings."""
    import hashlib

    from tessera.rewrite.search import GAIN, MEASURED_GAIN, TIE, signature

    g = fission(load(MODELS / "bert_tiny.onnx").graph).graph

    def noisy(w):  # 1.0 less up to 2%, fixed per window structure
        return 1.0 - 0.02 * int(hashlib.sha256(signature(w).encode()).hexdigest()[:8], 16) / 16 ** 8

    kept = search(g, noisy, gain=MEASURED_GAIN)
    assert kept.sites > 0 and all(a.gain_s <= TIE for a in kept.applied)  # ties (fewer nodes) at most
    assert len(kept.graph.nodes) <= len(g.nodes)
    assert any(a.gain_s > GAIN * 0.98 for a in search(g, noisy, gain=GAIN).applied)  # noise taken for savings


def test_replay_rebuilds_the_same_graph_and_names_a_step_that_no_longer_matches():
    g = _softmax_then_matmul()
    found = search(g, lambda w: float(_count(w, Prim.MATMUL, Prim.REDUCE_SUM)))
    steps = [a.to_json() for a in found.applied]
    assert graph_digest(replay(g, steps)) == graph_digest(found.graph)
    with pytest.raises(ValueError, match="no longer matches at node 'nowhere'"):
        replay(g, [{"rule": steps[0]["rule"], "roots": ["nowhere"]}])
    with pytest.raises(KeyError, match="not one this tessera has"):
        replay(g, [{"rule": "made_up", "roots": ["x"]}])


def test_the_search_ends_whatever_the_costs_say():
    """Window costs are local, so arbitrary ones (a hash of the window) could price each rewrite and
    its undoing as savings; a node a kept sequence touched is never rewritten again, so the search
    ends on its own, well inside the budget."""
    import hashlib

    from tessera.rewrite.search import signature

    g = fission(load(MODELS / "bert_tiny.onnx").graph).graph
    found = search(g, lambda w: int(hashlib.sha256(signature(w).encode()).hexdigest()[:8], 16) / 16 ** 8,
                   budget_s=120.0)
    assert not found.stopped
    assert len(found.applied) <= len(g.nodes) and len(found.graph.nodes) < 2 * len(g.nodes)


def test_the_budget_stops_the_search():
    found = search(_softmax_then_matmul(), lambda w: 1.0, budget_s=0.0)
    assert found.stopped and not found.applied


def test_no_window_is_priced_after_the_budget():
    # A measured window takes seconds, and one site prices several (the window and its best
    # sequences): the budget is checked before each, so the search overruns by one window at most.
    import time

    starts: list[float] = []

    def slow(window):
        starts.append(time.perf_counter())
        time.sleep(0.1)
        return 1.0

    t0 = time.perf_counter()
    found = search(_softmax_then_matmul(), slow, budget_s=0.15)
    assert found.stopped and len(starts) >= 2
    assert all(t <= t0 + 0.15 + 0.03 for t in starts)  # one window takes 0.1 s


def test_a_window_keeps_the_graph_boundary():
    g = _softmax_then_matmul()
    div = next(n for n in g.nodes if n.op == Prim.DIV.value)
    w = window_graph(g, neighbourhood(g, {div.name}, 1))
    # one hop from the division: the exp and the broadcast of the sum before it, the product after it
    assert [n.op for n in w.nodes] == ["exp", "broadcast", "div", "matmul"]
    exp, total = (next(n for n in g.nodes if n.op == op).outputs[0] for op in ("exp", "reduce_sum"))
    assert w.inputs == ["x", total, "v"]  # the sum comes from outside the window
    assert w.outputs == [exp, *g.outputs]  # the sum outside reads the exp


def test_compile_with_rewrites_records_them_and_the_artifact_replays(tmp_path, capsys):
    # analytical cost: on a GPU machine a measured compile keeps only the rewrites its timings pay for
    out = tmp_path / "a"
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "--rewrites", "on", "-o", str(out),
                 "--cost", "analytical"]) == 0
    said = capsys.readouterr().out
    assert "rewrites:" in said and "kept" in said
    plan = json.loads((out / "plan.json").read_text())
    applied = plan["rewrites"]["applied"]
    assert applied and all(a["gain_s"] >= 0 for a in applied)
    meta = json.loads((out / "artifact.json").read_text())
    assert [r for r in meta["rewrites"] if isinstance(r, dict)] == [{"rule": a["rule"], "roots": a["roots"],
                                                                    "gain_s": a["gain_s"],
                                                                    "window_nodes": a["window_nodes"]}
                                                                   for a in applied]
    assert "Graph rewrites" in (out / "report.html").read_text()
    # The default search (the regrouping rules) finds no site in bert_tiny, and says nothing of it;
    # in MCFuser's G11 it finds one and says what it kept.
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(tmp_path / "b"), "--cost", "analytical"]) == 0
    assert "rewrites:" not in capsys.readouterr().out
    assert main(["compile", str(MODELS / "gemm_g11.onnx"), "-o", str(tmp_path / "c"), "--cost", "analytical"]) == 0
    assert "rewrites: 1 kept (matmul_associative x1) from 1 site(s)" in capsys.readouterr().out
    assert main(["run", str(out), "--check"]) == 0  # loads by replaying the rewrites, then checks


@pytest.mark.slow
@pytest.mark.parametrize("name", NETWORKS)
def test_every_shared_network_stays_correct_with_rewrites(name):
    report = verify(MODELS / name, stage="rewrites")
    assert report.passed, report.as_dict()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["segformer_attn", "efficientvit_attn", "candy_norm_pad"])
def test_korch_blocks_export_and_stay_correct_with_rewrites(tmp_path, name):
    from tessera.zoo import build

    assert verify(build(name, tmp_path), stage="rewrites").passed


def test_the_segformer_block_has_an_sdpa_twin():
    import torch

    from tessera.zoo import make, sdpa_form

    model, (x,) = make("segformer_attn")
    twin = sdpa_form(model)
    assert twin is not None and sdpa_form(make("candy_norm_pad")[0]) is None
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_measured_compile_prices_windows_by_measurement(tmp_path, monkeypatch):
    """With measured cost the windows are timed by the profiler like any candidate (a fake one here),
    and the compiled artifact still matches onnxruntime."""
    import sys

    import torch
    from onnx import helper

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_profiler import FakeProfiler
    from opcheck import graph_model, rand

    import tessera
    from tessera import compiler
    from tessera.compiler import CompileOptions, compile_model, write_artifacts
    from tessera.tolerance import TOLERANCE, rel_l2
    from tessera.verify import run_onnxruntime

    prof = FakeProfiler()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    x, v = rand(2, 5, 7, seed=3), rand(2, 7, 3, seed=4)
    model = graph_model([helper.make_node("Softmax", ["x"], ["p"], axis=-1),
                         helper.make_node("MatMul", ["p", "v"], ["out"])], {"x": x, "v": v}, ["out"])
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), rewrites="on",
                                                 templates="off"))
    assert result.rewrite_search["evaluated"] > 0 and prof.calls > 0
    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", "cpu")
    got = exe(x=torch.from_numpy(x), v=torch.from_numpy(v))
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert rel_l2(got.numpy(), run_onnxruntime(model, {"x": x, "v": v})["out"]) < TOLERANCE["fp32"]


class _SlowerFirstProfiler:
    """Each kernel's n-th measurement takes 1/n us: more schedules tried, a lower best."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def measure(self, jobs, record) -> None:
        for i, j in enumerate(jobs):
            self.seen[j.key.signature] = self.seen.get(j.key.signature, 0) + 1
            record(i, 1e-6 / self.seen[j.key.signature], "")


def test_a_measured_window_is_priced_with_its_kernels_tuned(tmp_path, monkeypatch):
    """The window as it is holds kernels the compile's first plan already tuned; a rewritten
    window's kernels must be priced tuned too, or the comparison favours the window as it is
    (MCFuser's G6 in tf32, session 41). Here every further schedule measured is faster, so the
    tuned price is the best of more measurements than the candidates' alone (schedule tuning off)."""
    import torch

    from tessera.compiler import CompileOptions, window_cost
    from tessera.cost import device
    from tessera.cost.db import TuningDB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    g, b = new_graph({"a": (64, 32), "w": (32, 48)})
    g.outputs = [b.matmul("a", "w")]
    priced = {}
    for tuning in (False, True):
        prof = _SlowerFirstProfiler()
        with TuningDB(tmp_path / f"{tuning}.db") as db:
            price = window_cost(CompileOptions(cost="measured", precision="fp16", schedule_tuning=tuning),
                                "measured", device("h100"), db, prof)(g)
            assert len(db) == sum(prof.seen.values())  # every measurement is a row
        (times,) = prof.seen.values()  # one kernel: the matmul
        assert price == pytest.approx(1e-6 / times)  # the best schedule measured
        priced[tuning] = times
    assert priced[True] > priced[False]  # tuning measured schedules the candidates did not


def test_the_layers_of_a_transformer_share_their_window_prices():
    """A window's price does not depend on its weights' values, so the same window in two layers is
    one evaluation (on a GPU, one measurement); a small constant's value still tells windows apart."""
    from tessera.rewrite.search import signature

    g = fission(load(MODELS / "bert_tiny.onnx").graph).graph
    mats = [n for n in g.nodes if n.op == Prim.MATMUL.value and n.inputs[1] in g.constants]
    last = next(n for n in reversed(mats) if g.types[n.inputs[1]] == g.types[mats[0].inputs[1]])
    w0, w1 = mats[0].inputs[1], last.inputs[1]
    assert w0 != w1 and not np.array_equal(g.constants[w0], g.constants[w1])
    windows = [window_graph(g, neighbourhood(g, {n.name}, 0)) for n in (mats[0], last)]
    assert signature(windows[0]) == signature(windows[1])

    def scaled(k: float):
        h, b = new_graph({"x": (3, 5)})
        h.outputs = [b.mul("x", b.const(np.array(k, np.float32), "k"))]
        return h

    assert signature(scaled(2.0)) != signature(scaled(3.0))


def test_sites_that_share_a_window_are_measured_first_together():
    """Layers that repeat one window form a group that one measurement prices, and groups go by
    their summed estimated saving: three like layers come before a first layer that differs (a
    transformer's first layer holds the embedding), although each saves as much."""
    rng = np.random.default_rng(0)
    shapes = {"x0": (2, 11), "x1": (2, 9), "x2": (2, 9), "x3": (2, 9)}
    g, b = new_graph(shapes)
    outs = []
    for x, (_, k) in shapes.items():  # weights of 72+ elements: their values stay out of the signature
        wa = b.const(rng.standard_normal((k, 8)).astype(np.float32), f"{x}_wa")
        wb = b.const(rng.standard_normal((k, 8)).astype(np.float32), f"{x}_wb")
        outs.append(b.add(b.matmul(x, wa), b.matmul(x, wb)))
    g.outputs = outs
    model = lambda w: float(_count(w, Prim.MATMUL))  # noqa: E731 - merging halves any layer's matmuls
    first_reads: list[str] = []

    def measured(w):
        first_reads.extend(w.inputs[:1])
        return model(w)

    found = search(g, measured, estimate=model, gain=0.03)
    merges = [a for a in found.applied if a.rule == "matmuls_sharing_left"]
    assert len(merges) == 4
    assert first_reads[0] == "x1"  # the group of three was measured first, though layer 0 saves as much
    assert found.evaluated <= 2 * 3  # per window structure: the window and its two best estimates, once


def _softmax_matmul_compile(tmp_path, monkeypatch, prices: list[float], replan_gain: float | None = None):
    """A measured compile (fake GPU) of softmax -> matmul with the rewrites on; `prices` are the
    tuned plans' times in the order they are priced. Returns (result, model, inputs, prices asked, plans made)."""
    import sys

    import torch
    from onnx import helper

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_profiler import FakeProfiler
    from opcheck import graph_model, rand

    from tessera import compiler
    from tessera.compiler import CompileOptions, compile_model

    prof = FakeProfiler()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    if replan_gain is not None:
        monkeypatch.setattr(compiler, "REPLAN_GAIN", replan_gain)
    priced: list[float] = []
    real, real_plan = compiler.plan_seconds, compiler._plan
    plans: list[tuple[str, ...]] = []

    def price(result):
        priced.append(real(result))
        return prices[len(priced) - 1]

    def counted(*args, **kwargs):
        plans.append(tuple(n.op + n.name for n in args[2].nodes))
        return real_plan(*args, **kwargs)
    monkeypatch.setattr(compiler, "plan_seconds", price)
    monkeypatch.setattr(compiler, "_plan", counted)
    x, v = rand(2, 5, 7, seed=3), rand(2, 7, 3, seed=4)
    model = graph_model([helper.make_node("Softmax", ["x"], ["p"], axis=-1),
                         helper.make_node("MatMul", ["p", "v"], ["out"])], {"x": x, "v": v}, ["out"])
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), rewrites="on",
                                                 templates="off"))
    return result, model, {"x": x, "v": v}, priced, plans


def _runs_as_onnxruntime(result, model, feeds, tmp_path) -> None:
    import torch

    import tessera
    from tessera.compiler import write_artifacts
    from tessera.tolerance import TOLERANCE, rel_l2
    from tessera.verify import run_onnxruntime

    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", "cpu")  # rebuilds the graph by replaying what the plan kept
    got = exe(**{k: torch.from_numpy(a) for k, a in feeds.items()})
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert rel_l2(got.numpy(), run_onnxruntime(model, feeds)["out"]) < TOLERANCE["fp32"]


@pytest.mark.parametrize("with_s,without_s", [(1e-5, 2e-5), (2e-5, 1e-5), (1e-5, 1.002e-5)])
def test_a_measured_compile_keeps_rewrites_only_if_the_whole_tuned_plan_is_cheaper(tmp_path, monkeypatch,
                                                                                   with_s, without_s):
    """A window's price is not the whole tuned plan's, and tuning can favour the graph without the
    rewrites (segformer's attention, session 32). A measured compile therefore plans the graph
    without them first (what `--rewrites off` compiles), then, where the rewrites promise enough,
    the graph with them, and keeps them only where that tuned plan is cheaper by more than GAIN;
    otherwise the plan, the artifact's replayed steps and the report are those of the graph without them."""
    from tessera.rewrite.search import GAIN

    result, model, feeds, priced, plans = _softmax_matmul_compile(tmp_path, monkeypatch, [without_s, with_s],
                                                                  replan_gain=0.0)
    search = result.rewrite_search
    assert search["applied"] and len(priced) == 2 and all(p > 0 for p in priced)
    assert len(plans) == 2 and plans[0] != plans[1]  # the graph as it was first, then the rewritten one
    keep = with_s < without_s * (1 - GAIN)
    assert search["kept"] is keep and search["plan_us"] == [round(with_s * 1e6, 2), round(without_s * 1e6, 2)]
    assert search["replanned"] and search["guard_s"] > 0  # the second plan's wall time: what the rewrites add
    steps = [r for r in result.rewrites if isinstance(r, dict)]
    assert (steps == search["applied"]) if keep else steps == []
    page_dir = tmp_path / "art"
    _runs_as_onnxruntime(result, model, feeds, tmp_path)
    page = (page_dir / "report.html").read_text()
    assert ("they are applied" in page) if keep else ("they are dropped" in page)


def test_rewrites_that_promise_little_of_the_plan_are_dropped_without_a_second_plan(tmp_path, monkeypatch, capsys):
    """The second plan measures every kernel the rewrites change (segformer_b0: about as many as a
    cold compile again), so a measured compile makes it only where the windows' savings add up to
    REPLAN_GAIN of the plan without them. Here they cannot: that plan is priced at an hour."""
    result, model, feeds, priced, plans = _softmax_matmul_compile(tmp_path, monkeypatch, [3600.0])
    search = result.rewrite_search
    assert search["applied"] and search["saved_us"] > 0  # the search kept rewrites in its windows...
    assert len(plans) == 1 and len(priced) == 1  # ...but the graph was planned once, as it was
    assert not search["kept"] and not search["replanned"] and search["plan_us"] is None and search["guard_s"] == 0
    assert [r for r in result.rewrites if isinstance(r, dict)] == []
    _runs_as_onnxruntime(result, model, feeds, tmp_path)
    assert "too little of the plan" in (tmp_path / "art" / "report.html").read_text()
    from tessera.cli.main import _print_compile

    _print_compile(result)
    assert "rewrites dropped without planning again" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["on", "regroup"])
@pytest.mark.parametrize("case, regrouped", [("gemm_g11", True), ("gemm_g1", True), ("bert_tiny", False)])
def test_a_gemm_chain_is_regrouped_where_the_other_grouping_prices_cheaper(case, regrouped, mode):
    """MCFuser's G11 does 8x fewer multiply-adds as a @ (b @ d); the analytical model prices the
    window cheaper, so the search keeps the regrouping, with every rule or with the default's
    regrouping rules only, and the compiled plan still checks."""
    from tessera.compiler import CompileOptions, compile_model

    assert CompileOptions.rewrites == "regroup"
    result = compile_model(MODELS / f"{case}.onnx", CompileOptions(cost="analytical", rewrites=mode))
    kept = [a["rule"] for a in result.rewrites if a["rule"] == "matmul_associative"]
    assert bool(kept) == regrouped
    if regrouped:
        first = next(n for n in result.graph.nodes if n.op == Prim.MATMUL.value)
        assert first.inputs == ("b", "d")  # the inner product is now b @ d
        assert verify(MODELS / f"{case}.onnx", stage="rewrites").passed


def test_a_chain_through_two_weights_is_regrouped_and_the_weights_product_folded(tmp_path):
    """x @ w1 @ w2 with w1 16x512 and w2 512x16: x @ (w1 @ w2) does 16x less work, and w1 @ w2 is a
    constant, so the plan keeps one product and the compiled model still checks."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tessera.compiler import CompileOptions, compile_model

    rng = np.random.default_rng(7)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (16, 512)), ("w2", (512, 16)))]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]),
                               helper.make_node("MatMul", ["h", "w2"], ["y"])], "lowrank",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 16])], weights)
    path = tmp_path / "lowrank.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    for mode in ("on", "regroup"):
        result = compile_model(path, CompileOptions(cost="analytical", rewrites=mode))
        assert [a["rule"] for a in result.rewrites] == ["matmul_associative", "fold_constant_matmul"], mode
        assert [n.op for n in result.graph.nodes] == [Prim.MATMUL.value]
    assert compile_model(path, CompileOptions(cost="analytical", rewrites="off")).rewrites == []
    assert verify(path, stage="rewrites").passed


def test_the_default_rewrite_mode_searches_the_regrouping_rules_only():
    """`regroup` (the default) leaves what only the other rules rewrite: a transpose of a transpose
    before a matmul, which `--rewrites on` removes."""
    from tessera.compiler import CompileOptions, compile_model
    from tessera.rewrite.search import REGROUP_RULES, rewrite_rules

    assert list(rewrite_rules("regroup")) == list(REGROUP_RULES)
    assert rewrite_rules("off") == {} and len(rewrite_rules("on")) > len(REGROUP_RULES)
    with pytest.raises(ValueError, match="rewrites must be one of off, regroup, on"):
        rewrite_rules("all")
    from onnx import helper
    from opcheck import graph_model, rand

    model = graph_model([helper.make_node("Tanh", ["x"], ["t"]),
                         helper.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
                         helper.make_node("Transpose", ["u"], ["v"], perm=[1, 0]),
                         helper.make_node("MatMul", ["v", "w"], ["out"])],
                        {"x": rand(24, 40, seed=1), "w": rand(40, 24, seed=2)}, ["out"])
    on = compile_model(model, CompileOptions(cost="analytical", rewrites="on"))
    assert "transpose_of_transpose" in [a["rule"] for a in on.rewrites]
    default = compile_model(model, CompileOptions(cost="analytical"))
    assert default.rewrites == [] and default.rewrite_search["applied"] == []


def test_the_regroup_mode_may_transpose_the_product_it_made_but_opens_no_site_for_it():
    """MCFuser's G6 (tf32) paid only for the regrouping followed by `matmul_transposed` (session 39).
    In the default mode `matmul_transposed` may follow a regrouping inside its window; alone it opens
    no site, so a lone matmul is never priced."""
    from tessera.rewrite.search import follow_rules, rewrite_rules

    g, b = new_graph({"a": (16, 8), "b": (8, 32), "d": (32, 8)})
    g.outputs = [b.matmul(b.matmul("a", "b"), "d")]

    def cost(w) -> float:  # only the regrouped chain with a transpose pays
        regrouped = any(n.op == Prim.MATMUL.value and set(n.inputs) == {"b", "d"} for n in w.nodes)
        return 1.0 if regrouped and _count(w, Prim.TRANSPOSE) else 2.0

    assert list(follow_rules("regroup")) == ["matmul_transposed"] and follow_rules("on") == {}
    assert search(g, cost, rules=rewrite_rules("regroup")).applied == []
    found = search(g, cost, rules=rewrite_rules("regroup"), follow=follow_rules("regroup"))
    assert [a.rule for a in found.applied] == ["matmul_associative", "matmul_transposed"]
    feeds = {t: np.random.default_rng(i).standard_normal(s).astype(np.float32)
             for i, (t, s) in enumerate((("a", (16, 8)), ("b", (8, 32)), ("d", (32, 8))))}
    np.testing.assert_allclose(run(found.graph, feeds, exact=True)[found.graph.outputs[0]],
                               run(g, feeds, exact=True)[g.outputs[0]], rtol=1e-10)
    lone, lb = new_graph({"a": (16, 8), "b": (8, 32)})
    lone.outputs = [lb.matmul("a", "b")]
    assert search(lone, cost, rules=rewrite_rules("regroup"), follow=follow_rules("regroup")).sites == 0
