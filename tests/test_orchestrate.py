"""Orchestration: the convexity theorem, the cycle trap, solver optimality, valid plans."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from tessera.cost import AnalyticalCost, device
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import DType, Graph, GraphKind, Prim, TensorType
from tessera.ir.builder import PrimBuilder
from tessera.orchestrate import build_ograph, orchestrate
from tessera.orchestrate.blp import Problem, execution_order, solve
from tessera.orchestrate.candidates import Candidate, CandidateRules, StructuralLegality, enumerate_candidates
from tessera.orchestrate.graphview import OGraph, bits
from tessera.orchestrate.partition import partition
from tessera.orchestrate.states import state_differences

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def random_dag(n: int, seed: int) -> OGraph:
    """n elementwise primitives, each reading one or two earlier values (or the input)."""
    rng = random.Random(seed)
    g = Graph("dag", GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType((4,), DType.FLOAT32)})
    b = PrimBuilder(g)
    vals = ["x"]
    for _ in range(n):
        ins = rng.sample(vals, min(len(vals), rng.choice([1, 2])))
        vals.append(b.unary(Prim.EXP, ins[0]) if len(ins) == 1 else b.add(ins[0], ins[1]))
    consumed = {i for node in g.nodes for i in node.inputs}
    g.outputs = [v for v in vals[1:] if v not in consumed]
    return build_ograph(g)


def convex_subsets(og: OGraph) -> set[int]:
    return {m for m in range(1, 1 << og.n) if og.is_convex(m)}


def connected(og: OGraph, mask: int) -> bool:
    start = mask & -mask
    seen, frontier = start, start
    while frontier:
        nxt = 0
        for i in bits(frontier):
            nxt |= (og.preds[i] | og.succs[i] | og.siblings[i]) & mask
        frontier = nxt & ~seen
        seen |= nxt
    return seen == mask


@pytest.mark.parametrize("seed", range(12))
def test_convex_sets_are_state_differences(seed):
    og = random_dag(7 + seed % 3, seed)
    assert state_differences(og, og.all) == convex_subsets(og)


@pytest.mark.parametrize("seed", range(12))
def test_candidates_are_the_connected_convex_sets(seed):
    og = random_dag(7 + seed % 3, seed)
    rules = CandidateRules(max_nodes=og.n)
    found = {c.nodes for c in enumerate_candidates(og, og.all, rules, StructuralLegality())}
    assert found == {m for m in convex_subsets(og) if connected(og, m)}
    assert all(og.is_convex(m) for m in found)


def test_size_bound_prunes():
    og = random_dag(9, 3)
    found = {c.nodes for c in enumerate_candidates(og, og.all, CandidateRules(max_nodes=3), StructuralLegality())}
    assert found == {m for m in convex_subsets(og) if connected(og, m) and m.bit_count() <= 3}


def _brute_force(p: Problem) -> float:
    """The cheapest executable selection that writes every required node."""
    best = float("inf")
    n = len(p.candidates)
    for r in range(1, n + 1):
        for sel in itertools.combinations(range(n), r):
            written = 0
            for c in sel:
                written |= p.candidates[c].outputs
            if p.required & ~written:
                continue
            if execution_order(p, sel)[1]:
                continue
            best = min(best, sum(p.costs[c] for c in sel))
    return best


def cycle_trap() -> tuple[Problem, int, int]:
    """DESIGN.md's case: A = {p_a, a1}, B = {p_b, b1}, edges p_b -> a1 and p_a -> b1."""
    g = Graph("trap", GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType((8,), DType.FLOAT32)})
    b = PrimBuilder(g)
    pa, pb = b.unary(Prim.EXP, "x"), b.unary(Prim.NEG, "x")
    a1, b1 = b.add(pb, "x"), b.add(pa, "x")
    g.outputs = [a1, b1]
    og = build_ograph(g)
    i = {name: og.index[name] for name in (pa, pb, a1, b1)}
    A = (1 << i[pa]) | (1 << i[a1])
    B = (1 << i[pb]) | (1 << i[b1])
    cands = [Candidate(A, A, og.inputs_of(A)), Candidate(B, B, og.inputs_of(B))]
    cands += [Candidate(1 << k, 1 << k, og.inputs_of(1 << k)) for k in range(og.n)]
    costs = [1.0, 1.0] + [0.8] * og.n  # the cyclic pair is cheapest (2.0 < 4 x 0.8)
    return Problem(og.all, cands, costs, og.graph_outputs), 0, 1


def test_cycle_trap_is_rejected():
    p, a, b = cycle_trap()
    order, stuck = execution_order(p, [a, b])
    assert sorted(stuck) == [a, b] and not order  # Korch's constraints alone would accept this
    chosen, order, stats = solve(p, warm=list(range(2, len(p.candidates))))
    assert not execution_order(p, chosen)[1]
    assert stats.cycle_cuts >= 1 and stats.optimal
    assert stats.objective == pytest.approx(_brute_force(p))
    assert stats.objective > 2.0  # the cheap cyclic selection was excluded


def random_instance(seed: int) -> tuple[Problem, list[int] | None]:
    """A small program with random costs, and a warm start (all single-node kernels) if it is one."""
    og = random_dag(5, 100 + seed)
    cands = enumerate_candidates(og, og.all, CandidateRules(max_nodes=3, output_subset_limit=1), StructuralLegality())
    if len(cands) > 16:
        cands = cands[:16] + [c for c in cands[16:] if c.size == 1]
    rng = random.Random(seed)
    costs = [rng.uniform(0.5, 1.0) * (1 + 0.2 * c.size) for c in cands]
    p = Problem(og.all, cands, costs, og.graph_outputs)
    singles = [k for k, c in enumerate(cands) if c.size == 1 and c.outputs == c.nodes]
    warm = singles if not execution_order(p, singles)[1] and len(singles) == og.n else None
    return p, warm


@pytest.mark.parametrize("seed", range(8))
def test_solver_matches_brute_force(seed):
    p, warm = random_instance(seed)
    _, _, stats = solve(p, warm=warm)
    assert stats.optimal
    assert stats.objective == pytest.approx(_brute_force(p))


def _plan(name: str, **kw):
    pg = fission(load(MODELS / name).graph).graph
    og = build_ograph(pg)
    return og, orchestrate(og, AnalyticalCost(og, device("h100")), **kw)


def _check_plan(og: OGraph, plan) -> None:
    g = og.graph
    available = set(g.inputs) | set(g.constants)
    for k in plan.kernels:  # in execution order, every read is already in memory
        missing = [t for t in k.inputs if t not in available]
        assert not missing, f"{k.name} reads {missing} before they are written"
        available |= set(k.outputs)
    assert set(g.outputs) <= available
    computed = {p for k in plan.kernels for p in k.prims}
    assert computed == {n.name for n in og.nodes}


@pytest.mark.parametrize("name", ["attn_s7.onnx", "gemm_g2.onnx", "bert_tiny.onnx", "candy_small.onnx",
                                  "efficientvit_b0_small.onnx"])
def test_model_plans_are_valid_and_beat_greedy(name):
    og, opt = _plan(name)
    _check_plan(og, opt)
    assert all(s.solver["optimal"] for s in opt.subgraphs)
    og2, greedy = _plan(name, strategy="greedy")
    _check_plan(og2, greedy)
    assert opt.estimated_total_s <= greedy.estimated_total_s + 1e-12
    assert opt.greedy_total_s == pytest.approx(greedy.greedy_total_s)


def test_partition_respects_the_state_bound():
    pg = fission(load(MODELS / "bert_tiny.onnx").graph).graph
    og = build_ograph(pg)
    subs, cuts = partition(og, 60)
    assert len(subs) > 2 and len(cuts) == len(subs) - 1
    assert all(s.states <= 60 for s in subs)
    assert sum(s.members for s in subs) == og.all  # disjoint and complete
    for cut in cuts:
        assert cut.tensors and cut.lost_fusions
    plan = orchestrate(og, AnalyticalCost(og, device("h100")), max_states=60)
    _check_plan(og, plan)
    assert [s.states for s in plan.subgraphs] == [s.states for s in subs]


def test_attention_kernel_count():
    # softmax(QK^T/sqrt(d))V on attn_s7 becomes 3 kernels: QK^T (the library reads K^T as a
    # transposed view, no copy kernel), the scale and the whole softmax in one, and the second matmul.
    og, plan = _plan("attn_s7.onnx")
    assert [len(k.prims) for k in plan.kernels] == [2, 8, 1], [k.prims for k in plan.kernels]
    assert [[og.graph.node(p).op for p in k.prims][-1] for k in plan.kernels] == ["matmul", "div", "matmul"]
    assert og.graph.node(plan.kernels[0].prims[0]).op == "transpose"


def redundancy_model():
    """t = exp(x) feeds a row sum and a column max, which need separate reduction loops."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Exp", ["x"], ["t"], name="exp"),
             helper.make_node("ReduceSum", ["t", "ax1"], ["rows"], name="row_sum", keepdims=1),
             helper.make_node("ReduceMax", ["t", "ax0"], ["cols"], name="col_max", keepdims=1)]
    inits = [helper.make_tensor("ax1", TensorProto.INT64, [1], [1]), helper.make_tensor("ax0", TensorProto.INT64, [1], [0])]
    g = helper.make_graph(nodes, "redundant", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 1024])],
                          [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [512, 1]),
                           helper.make_tensor_value_info("cols", TensorProto.FLOAT, [1, 1024])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_optimal_plan_recomputes_exp():
    # Writing t (2 MB) and reading it twice costs more than reading x (2 MB) in each
    # of the two reduction kernels, so the optimal plan computes exp in both.
    pg = fission(load(redundancy_model()).graph).graph
    og = build_ograph(pg)
    cost = AnalyticalCost(og, device("h100"))
    plan = orchestrate(og, cost)
    _check_plan(og, plan)
    assert len(plan.kernels) == 2
    assert all(k.recomputed == ["exp/exp"] for k in plan.kernels)
    greedy = orchestrate(og, cost, strategy="greedy")
    assert len(greedy.kernels) == 2 and not any(k.recomputed for k in greedy.kernels)
    assert plan.estimated_total_s < greedy.estimated_total_s


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_time_limit_returns_a_plan_marked_not_optimal(solver):
    pg = fission(load(MODELS / "segformer_b0_small.onnx").graph).graph
    og = build_ograph(pg)
    plan = orchestrate(og, AnalyticalCost(og, device("h100")), solver=solver, time_limit=0.01)
    _check_plan(og, plan)
    statuses = {s.solver["status"] for s in plan.subgraphs}
    assert statuses & {"time_limit", "greedy"}, statuses
    for s in plan.subgraphs:
        assert s.solver["optimal"] == (s.solver["status"] == "optimal")
        assert s.optimal_s <= s.greedy_s + 1e-12  # never worse than the warm start


@pytest.mark.parametrize("seed", range(6))
def test_greedy_cycle_walk_bound_changes_no_verdict(seed: int) -> None:
    """The greedy merge's cycle walk stops where no node can lead back (`greedy._reach`): for random
    groupings of random DAGs (groups of nearby and of far-apart nodes) and every pair of groups,
    the bounded walk answers as the walk over every node does, cycles found included."""
    from tessera.orchestrate.greedy import _closes_cycle, _reach

    og = random_dag(36, seed)
    rng = random.Random(seed)
    owner = [min(i // 3 + rng.choice([0, 0, 0, 5]), 14) for i in range(og.n)]  # mostly local, some far
    groups = [sum(1 << i for i in range(og.n) if owner[i] == k) for k in range(15)]
    groups = [g for g in groups if g]
    group = {i: g for g in groups for i in bits(g)}
    spans = {g: ((g & -g).bit_length() - 1, g.bit_length() - 1) for g in groups if g.bit_count() > 1}
    verdicts = []
    for gu, gv in itertools.combinations(groups, 2):
        merged = gu | gv
        bounded = _closes_cycle(og, merged, group, _reach(merged, spans))
        assert bounded == _closes_cycle(og, merged, group)
        verdicts.append(bounded)
    assert any(verdicts) and not all(verdicts)


def _residual_layers(n: int, seed: int = 0):
    """n residual layers of one shape, own weights: x = x + relu(layernorm-ish(x) @ a) @ b."""
    from onnx import helper
    from opcheck import Const, graph_model, rand

    nodes, feeds, x = [], {"x": rand(16, 32, seed=seed)}, "x"
    for i in range(n):
        nodes += [helper.make_node("ReduceMean", [x], [f"m{i}"], axes=[-1]), helper.make_node("Sub", [x, f"m{i}"], [f"c{i}"]),
                  helper.make_node("MatMul", [f"c{i}", f"a{i}"], [f"h{i}"]), helper.make_node("Relu", [f"h{i}"], [f"r{i}"]),
                  helper.make_node("MatMul", [f"r{i}", f"b{i}"], [f"o{i}"]), helper.make_node("Add", [f"o{i}", x], [f"y{i}"])]
        feeds |= {f"a{i}": Const(rand(32, 48, seed=seed + 10 + i)), f"b{i}": Const(rand(48, 32, seed=seed + 20 + i))}
        x = f"y{i}"
    return fission(load(graph_model(nodes, feeds, [x], opset=13)).graph).graph


def test_repeated_layers_enumerate_once_and_get_the_same_candidates():
    """A subgraph whose structure key repeats an earlier one's takes that one's candidates, moved by
    the distance between them: exactly what enumerating it gives. The first layer reads the graph
    input and the last writes the graph output, so their keys differ from the middle layers'."""
    from tessera.orchestrate.orchestrator import _candidates
    from tessera.orchestrate.repeats import producers, shifted, structure_key

    og = build_ograph(_residual_layers(5))
    subs, _ = partition(og, 8)
    assert len(subs) >= 4
    rules, legality = CandidateRules(max_linear=2), StructuralLegality(prologues=True, chains=True)
    producer = producers(og)
    keys = [structure_key(og, s, producer) for s in subs]
    first: dict[str, int] = {}
    repeats = 0
    for k, (s, key) in enumerate(zip(subs, keys)):
        fresh = _candidates(og, s, "optimal", rules, legality)
        if key in first:
            j = first[key]
            moved = shifted(_candidates(og, subs[j], "optimal", rules, legality)[0], s.lo - subs[j].lo)
            assert {(c.nodes, c.outputs, c.inputs) for c in moved} == {(c.nodes, c.outputs, c.inputs) for c in fresh[0]}
            repeats += 1
        else:
            first[key] = k
    assert repeats >= 2 and keys[0] != keys[1] and keys[-1] != keys[-2]


def test_a_repeat_changes_nothing_in_the_plan(monkeypatch):
    og = build_ograph(_residual_layers(5, seed=3))
    cost = AnalyticalCost(og, device("h100"))
    plan = orchestrate(og, cost, max_states=8)
    calls = iter(range(10 ** 6))
    monkeypatch.setattr("tessera.orchestrate.orchestrator.structure_key", lambda *a: str(next(calls)))  # never a repeat
    alone = orchestrate(og, cost, max_states=8)
    assert [(k.prims, k.outputs) for k in plan.kernels] == [(k.prims, k.outputs) for k in alone.kernels]
    assert plan.estimated_total_s == alone.estimated_total_s
    moved = [s for s in plan.subgraphs if "candidates_of" in s.solver]  # plan.json and the report say so
    assert moved and all(s.solver["candidates_of"] < s.index for s in moved)
    assert not any("candidates_of" in s.solver for s in alone.subgraphs)
    # a repeat with the same costs and outputs to write takes its twin's answer, not a solve
    reused = [s for s in plan.subgraphs if "solution_of" in s.solver]
    assert reused and all(s.solver["solution_of"] == s.solver["candidates_of"] for s in reused)
    assert all(s.solver["seconds"] == 0.0 for s in reused)
    assert not any("solution_of" in s.solver for s in alone.subgraphs)
