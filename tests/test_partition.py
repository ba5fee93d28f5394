"""The partition: the sliding window of execution states, and the cuts chosen together (exact)."""
from __future__ import annotations

import itertools
import random

import pytest

from tessera.ir import DType, Graph, GraphKind, Prim, TensorType
from tessera.ir.builder import PrimBuilder
from tessera.orchestrate import build_ograph
from tessera.orchestrate.graphview import OGraph
from tessera.orchestrate.partition import (Partitioner, _mask, fusable_nodes, linear_nodes, partition,
                                           window_starts)
from tessera.orchestrate.states import count_states


def mixed_dag(n: int, seed: int) -> OGraph:
    """n primitives on 8x8 values, each an exp, an add or a matmul with a weight, reading one or two
    earlier values (or the input)."""
    rng = random.Random(seed)
    g = Graph("mixed", GraphKind.PRIMITIVE, inputs=["x", "w"],
              types={t: TensorType((8, 8), DType.FLOAT32) for t in ("x", "w")})
    b = PrimBuilder(g)
    vals = ["x"]
    for _ in range(n):
        kind = rng.choice(["exp", "add", "add", "matmul"])
        if kind == "exp":
            vals.append(b.unary(Prim.EXP, rng.choice(vals)))
        elif kind == "matmul":
            vals.append(b.matmul(rng.choice(vals), "w"))
        else:
            x, y = rng.sample(vals, 2) if len(vals) > 1 else (vals[0], vals[0])
            vals.append(b.add(x, y))
    consumed = {i for node in g.nodes for i in node.inputs}
    g.outputs = [v for v in vals[1:] if v not in consumed]
    return build_ograph(g)


def price(og: OGraph, bounds: list[tuple[int, int]]) -> tuple[int, int, int, int]:
    """What the partition minimises, counted edge by edge: (fusions forbidden, edges into linear
    primitives cut, bytes of the producers whose fusable readers lie in a later window, windows)."""
    window = {i: k for k, (lo, hi) in enumerate(bounds) for i in range(lo, hi)}
    fusable, linear = fusable_nodes(og), linear_nodes(og)
    fused = into_linear = nbytes = 0
    for i in range(og.n):
        later = [j for j in range(og.n) if og.succs[i] >> j & 1 and window[j] != window[i]]
        fused += sum(fusable >> j & 1 for j in later)
        into_linear += sum(linear >> j & 1 for j in later)
        nbytes += og.out_bytes[i] if any(fusable >> j & 1 for j in later) else 0
    return fused, into_linear, nbytes, len(bounds)


@pytest.mark.parametrize("seed", range(8))
def test_window_starts_match_counting_from_scratch(seed: int) -> None:
    og = mixed_dag(14, seed)
    for bound in (3, 6, 12, 40):
        starts = window_starts(og, bound)
        for p in range(1, og.n + 1):
            want = next(q for q in range(p) if q == p - 1 or count_states(og, _mask(q, p), bound) <= bound)
            assert starts[p] == want, (bound, p)


@pytest.mark.parametrize("seed", range(8))
def test_cuts_chosen_together_are_optimal(seed: int) -> None:
    """Against every set of cut positions (2^(n-1) of them): the partition's price is the least
    among those whose windows keep the bound, and its windows keep it."""
    og = mixed_dag(11, seed)
    for bound in (4, 8, 20):
        parts = Partitioner(og, bound)
        got = parts.bounds()
        assert got[0][0] == 0 and got[-1][1] == og.n
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert all(hi - lo == 1 or count_states(og, _mask(lo, hi), bound) <= bound for lo, hi in got)
        best = None
        for r in range(og.n):
            for cuts in itertools.combinations(range(1, og.n), r):
                edges = [0, *cuts, og.n]
                bounds = list(zip(edges, edges[1:]))
                if all(hi - lo == 1 or count_states(og, _mask(lo, hi), bound) <= bound for lo, hi in bounds):
                    key = price(og, bounds)
                    best = key if best is None or key < best else best
        assert price(og, got) == best, (bound, got)


@pytest.mark.parametrize("seed", range(4))
def test_a_forbidden_window_is_never_inside_a_window_again(seed: int) -> None:
    og = mixed_dag(16, seed)
    parts = Partitioner(og, 30)
    for _ in range(6):
        bounds = parts.bounds()
        widest = max(bounds, key=lambda b: b[1] - b[0])
        if widest[1] - widest[0] < 2:
            break
        parts.forbid(*widest)
        for lo, hi in parts.bounds():
            for flo, fhi in parts.forbidden:
                assert not (lo <= flo and fhi <= hi), ((lo, hi), (flo, fhi))
    with pytest.raises(ValueError):
        parts.forbid(3, 4)


@pytest.mark.parametrize("seed", range(3))
def test_state_counts_kept_across_passes_are_each_windows_own(seed: int) -> None:
    og = mixed_dag(16, seed)
    parts = Partitioner(og, 30)
    for _ in range(4):
        subs, _ = parts.subgraphs()
        for sub in subs:  # a count kept from an earlier pass is the window's, not its predecessor's
            assert sub.states == count_states(og, _mask(sub.lo, sub.hi), 30), (sub.lo, sub.hi)
        widest = max(subs, key=lambda s: s.hi - s.lo)
        if widest.hi - widest.lo < 2:
            break
        parts.forbid(widest.lo, widest.hi)


def test_a_cut_goes_where_it_forbids_fewest_fusions():
    # r = x + y is read by three nodes (a layernorm's two steps and the next residual add); a cut
    # right after it forbids three fusions, one after the block that reads it forbids one, though
    # both cross one tensor. An edge into a matmul counts apart (a template may fuse it): the cut
    # before the matmul (one fusion, one linear edge) beats the one after it (two fusions).
    g = Graph("res", GraphKind.PRIMITIVE, inputs=["x", "y", "w"],
              types={t: TensorType((8, 8), DType.FLOAT32) for t in ("x", "y", "w")})
    b = PrimBuilder(g)
    r = b.add("x", "y")  # 0
    m1 = b.unary(Prim.EXP, r)  # 1: reads r
    m2 = b.unary(Prim.NEG, r)  # 2: reads r
    h = b.add(m1, m2)  # 3
    p = b.matmul(h, "w")  # 4: a linear reader of h
    out = b.add(p, r)  # 5: reads r again
    g.outputs = [out]
    og = build_ograph(g)
    whole = count_states(og, og.all, 1 << 10)
    assert Partitioner(og, whole).bounds() == [(0, 6)]  # no cut where none is needed
    assert Partitioner(og, whole - 1).bounds() == [(0, 4), (4, 6)]
    subs, cuts = partition(og, whole - 1)
    assert [c.position for c in cuts] == [4] and len(cuts[0].lost_fusions) == 2  # h -> matmul, r -> add


def test_a_stack_of_layers_is_cut_before_each_product():
    """Residual layers whose state counts allow one layer a window, not two. The residual sum is read
    by four nodes (three branches and the next residual add), so a cut right after it forbids four
    fusions; a cut before the layer's matmul forbids the residual edge and the matmul's input (which
    a library call reads from memory anyway). The cuts go there, one a layer."""
    g = Graph("layers", GraphKind.PRIMITIVE, inputs=["x", "w"],
              types={t: TensorType((8, 8), DType.FLOAT32) for t in ("x", "w")})
    b = PrimBuilder(g)
    x = "x"
    for _ in range(4):
        a, c, d = b.unary(Prim.EXP, x), b.unary(Prim.NEG, x), b.unary(Prim.ABS, x)  # three branches
        s = b.add(b.add(a, c), d)
        x = b.add(b.matmul(s, "w"), x)  # the residual stream
    g.outputs = [x]
    og = build_ograph(g)
    layer = og.n // 4  # exp neg abs add add matmul add
    matmuls = [i for i, n in enumerate(og.nodes) if n.op == "matmul"]
    assert matmuls == [k * layer + 5 for k in range(4)]
    one = count_states(og, _mask(0, layer), 1 << 12)
    assert count_states(og, _mask(0, 2 * layer), 1 << 12) > one
    edges = [0, *matmuls, og.n]
    assert Partitioner(og, one).bounds() == list(zip(edges, edges[1:]))


@pytest.mark.parametrize("seed", range(4))
def test_windows_with_too_many_candidates_are_partitioned_again(seed: int) -> None:
    """With a small candidate cap, the orchestrator rules out the middle of each window that holds
    too many and partitions again: every final subgraph keeps the cap, was given exactly the
    candidates that enumerating it gives, and the windows still cover the graph in order."""
    from tessera.orchestrate.candidates import CandidateRules, StructuralLegality
    from tessera.orchestrate.orchestrator import _all_candidates, _candidates

    og = mixed_dag(40, seed)
    rules, legality = CandidateRules(max_candidates=60), StructuralLegality()
    parts = Partitioner(og, 1 << 12)
    by_states = len(parts.bounds())
    subs, cuts, found, origin = _all_candidates(og, parts, "optimal", rules, legality)
    assert len(subs) > by_states and len(cuts) == len(subs) - 1 and parts.forbidden
    assert subs[0].lo == 0 and subs[-1].hi == og.n and all(a.hi == b.lo for a, b in zip(subs, subs[1:]))
    for sub, given in zip(subs, found):
        own = _candidates(og, sub, "optimal", rules, legality)
        assert [{(c.nodes, c.outputs, c.inputs) for c in x} for x in given] == \
            [{(c.nodes, c.outputs, c.inputs) for c in x} for x in own]
        assert not any(sub.lo <= lo and hi <= sub.hi for lo, hi in parts.forbidden)
