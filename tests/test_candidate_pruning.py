"""Candidates that stop just short of a free node (`candidates.stops_short`): a lone reshape after a
kernel's value, or the element-by-element tail after a slice of a linear kernel's product. They are
dropped where the one-node-larger kernel is legal, and the plans stay as cheap."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tessera.cost import AnalyticalCost, device
from tessera.ir import DType, Graph, GraphKind, Prim, TensorType
from tessera.ir.builder import PrimBuilder
from tessera.orchestrate import build_ograph, orchestrate
from tessera.orchestrate import candidates as cands
from tessera.orchestrate.candidates import CandidateRules, StructuralLegality, enumerate_candidates
from tessera.orchestrate.graphview import OGraph, bits


def reshape_dag(n: int, seed: int) -> OGraph:
    """n steps over (64,) values: an exp, an add of two values, or a round trip through (8, 8) as two
    reshapes (each read once, so a kernel stopping before one stops short)."""
    rng = random.Random(seed)
    g = Graph("dag", GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType((64,), DType.FLOAT32)})
    b = PrimBuilder(g)
    vals = ["x"]
    for _ in range(n):
        kind = rng.choice(["exp", "add", "reshape"])
        v = rng.choice(vals)
        if kind == "exp":
            vals.append(b.unary(Prim.EXP, v))
        elif kind == "add":
            vals.append(b.add(v, rng.choice(vals)))
        else:
            vals.append(b.reshape(b.reshape(v, (8, 8)), (64,)))
    consumed = {i for node in g.nodes for i in node.inputs}
    g.outputs = [v for v in vals[1:] if v not in consumed]
    return build_ograph(g)


def every_read_is_written(og: OGraph, found) -> bool:
    written = 0
    for c in found:
        written |= c.outputs
    return all(not c.inputs & og.all & ~written for c in found)


@pytest.mark.parametrize("seed", range(8))
def test_dropping_kernels_that_stop_before_a_reshape_leaves_plans_as_cheap(seed, monkeypatch):
    og = reshape_dag(9, seed)
    rules = CandidateRules(max_nodes=4)
    found = enumerate_candidates(og, og.all, rules, StructuralLegality())
    assert every_read_is_written(og, found)
    pruned = orchestrate(og, AnalyticalCost(og, device("h100")), rules=rules)
    monkeypatch.setattr(cands, "stops_short", lambda *a: 0)
    everything = enumerate_candidates(og, og.all, rules, StructuralLegality())
    assert len(found) < len(everything) or not any(n.op == "reshape" for n in og.nodes)
    full = orchestrate(og, AnalyticalCost(og, device("h100")), rules=rules)
    # the analytical price of a kernel barely moves with a reshape inside it (0.002% in one seed)
    assert pruned.estimated_total_s == pytest.approx(full.estimated_total_s, rel=1e-3)


def split_projection() -> tuple[OGraph, dict[str, int]]:
    """x @ w split in three slices, each with a tanh and a reshape after it, then a transpose each
    (what a merged Q, K and V projection looks like)."""
    g = Graph("qkv", GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType((32, 16), DType.FLOAT32)})
    b = PrimBuilder(g)
    w = b.const(np.ones((16, 48), np.float32), "w")
    m = b.matmul("x", w)
    outs = []
    for k in range(3):
        s = b.slice_axis(m, 1, 16 * k, 16)
        outs.append(b.transpose(b.reshape(b.unary(Prim.TANH, s), (32, 2, 8)), (1, 0, 2)))
    g.outputs = outs
    og = build_ograph(g)
    return og, {n.op + str(sum(1 for j in range(i) if og.nodes[j].op == n.op)): i for i, n in enumerate(og.nodes)}


def test_a_split_products_slice_tails_join_its_kernel_whole():
    og, at = split_projection()
    found = {c.nodes for c in enumerate_candidates(og, og.all, CandidateRules(), StructuralLegality())}
    mm = 1 << at["matmul0"]
    tail = [sum(1 << at[f"{op}{k}"] for op in ("slice", "tanh", "reshape")) for k in range(3)]
    with_root = [m for m in found if m & mm]
    # the kernel writes any subset of the three slices, each with its whole tail ...
    assert {mm | sum(t for t, keep in zip(tail, pick) if keep) for pick in np.ndindex(2, 2, 2)} <= set(with_root)
    # ... and never a slice without the tanh after it, or a tanh without its reshape
    for m in with_root:
        for k in range(3):
            inside = [(m >> at[f"{op}{k}"]) & 1 for op in ("slice", "tanh", "reshape")]
            assert inside in ([0, 0, 0], [1, 1, 1]), [og.nodes[i].name for i in bits(m)]
    # a memory-bound kernel may still stop before the tanh (the slice is a copy of its own), not
    # before the reshape, the tanh's only reader
    assert 1 << at["slice0"] in found and (1 << at["slice0"]) | (1 << at["tanh0"]) not in found
    assert (1 << at["tanh0"]) | (1 << at["reshape0"]) in found


def test_no_kernel_reads_what_no_kernel_writes_any_more():
    """exp -> reshape -> exp at two nodes a kernel: the lone exp that stops before the reshape is
    gone, so the kernels that read its value through the reshape must go too (or the plan has no
    writer for it)."""
    g = Graph("chain", GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType((64,), DType.FLOAT32)})
    b = PrimBuilder(g)
    g.outputs = [b.unary(Prim.EXP, b.reshape(b.unary(Prim.EXP, "x"), (8, 8)))]
    og = build_ograph(g)
    rules = CandidateRules(max_nodes=2)
    found = enumerate_candidates(og, og.all, rules, StructuralLegality())
    assert {c.nodes for c in found} == {0b011, 0b100}  # exp+reshape, then the second exp alone
    assert every_read_is_written(og, found)
    plan = orchestrate(og, AnalyticalCost(og, device("h100")), rules=rules)
    assert [len(k.prims) for k in plan.kernels] == [2, 1]


def embedding_sum(k: int, linear: bool = False) -> OGraph:
    """k lookups of one index vector in k constant tables, concatenated, then an exp and a row sum
    (CANINE's hashed embeddings before their LayerNorm); `linear`: then a product with a weight instead."""
    g = Graph("emb", GraphKind.PRIMITIVE, inputs=["ids"], types={"ids": TensorType((16,), DType.INT64)})
    b = PrimBuilder(g)
    rng = np.random.default_rng(0)
    looked = [b.gather(b.const(rng.standard_normal((50, 8)).astype(np.float32), f"table{i}"), "ids", 0)
              for i in range(k)]
    cat = b.concat(looked, 1)
    if linear:
        g.outputs = [b.matmul(cat, b.const(np.ones((8 * k, 4), np.float32), "w"))]
    else:
        g.outputs = [b.reduce(Prim.REDUCE_SUM, b.unary(Prim.EXP, cat), [1])]
    return build_ograph(g)


def test_a_memory_bound_kernel_takes_in_the_lookups_it_reads():
    og = embedding_sum(5)
    gathers = sum(1 << i for i, n in enumerate(og.nodes) if n.op == Prim.GATHER.value)
    rules = CandidateRules()
    found = enumerate_candidates(og, og.all, rules, StructuralLegality())
    # a kernel past the concatenation computes every lookup itself; none reads a lookup's stored value
    assert not [c for c in found if c.inputs & gathers]
    plan = orchestrate(og, AnalyticalCost(og, device("h100")), rules=rules)
    assert len(plan.kernels) == 1
    # without the rule: every subset of the five lookups left out, for the same plan cost
    everything = []
    try:
        saved, cands.starts_short = cands.starts_short, lambda *a: 0
        everything = enumerate_candidates(og, og.all, rules, StructuralLegality())
        full = orchestrate(og, AnalyticalCost(og, device("h100")), rules=rules)
    finally:
        cands.starts_short = saved
    assert len([c for c in everything if c.inputs & gathers]) >= 2 ** 5 - 1 > 0
    assert plan.estimated_total_s == pytest.approx(full.estimated_total_s, rel=1e-3)


def test_a_linear_kernel_keeps_reading_a_stored_lookup():
    # a template would gather its operand once per output tile: a kernel holding a product never
    # starts short of a lookup, while the concatenation alone does
    og = embedding_sum(2, linear=True)
    at = {n.op: i for i, n in enumerate(og.nodes)}
    gathers = sum(1 << i for i, n in enumerate(og.nodes) if n.op == Prim.GATHER.value)
    linear = 1 << at[Prim.MATMUL.value]
    assert cands.starts_short(og, 1 << at[Prim.CONCAT.value], og.all, linear) == gathers
    assert cands.starts_short(og, (1 << at[Prim.CONCAT.value]) | linear, og.all, linear) == 0
