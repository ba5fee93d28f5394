"""The greedy baseline: rule-based fusion as TVM and TorchInductor do it.

Every linear or opaque primitive is a kernel of its own (a library call); in a
float16/bfloat16 graph, with the bias add of its own Gemm or Conv
(`candidates.bias_groups`), as the library call adds it.
Memory-bound primitives are fused along producer -> consumer edges, in
topological order, whenever the merged group stays convex, legal and within
the size bound. Every value read outside its group is written once: no
redundant computation, no fission-specific tricks. The same candidate rules,
legality and cost model as the optimal strategy apply, so the two compare
like for like.
"""
from __future__ import annotations

from tessera.ir.prims import Category, Prim
from tessera.orchestrate.candidates import Candidate, CandidateRules, KernelLegality, bias_groups
from tessera.orchestrate.graphview import OGraph, bits


def greedy_groups(og: OGraph, members: int, rules: CandidateRules, legality: KernelLegality) -> list[int]:
    """Node sets of the greedy kernels inside `members`."""
    group = {i: 1 << i for i in bits(members)}
    spans: dict[int, tuple[int, int]] = {}  # first and last node of each group of several nodes
    alone = {i for i in bits(members)
             if Prim(og.nodes[i].op).category in (Category.LINEAR, Category.OPAQUE)}
    for g in bias_groups(og, members, legality):
        group.update((i, g) for i in bits(g))
        alone.update(bits(g))
        spans[g] = ((g & -g).bit_length() - 1, g.bit_length() - 1)
    for v in bits(members):
        for u in bits(og.preds[v] & members):
            gu, gv = group[u], group[v]
            if gu == gv or u in alone or v in alone:
                continue
            merged = gu | gv
            if merged.bit_count() > rules.max_nodes or not og.is_convex(merged):
                continue
            if _closes_cycle(og, merged, group, _reach(merged, spans)):
                continue
            if legality.check(og, merged) is not None:
                continue
            for i in bits(merged):
                group[i] = merged
            spans.pop(gu, None)
            spans.pop(gv, None)
            spans[merged] = ((merged & -merged).bit_length() - 1, merged.bit_length() - 1)
    return sorted(set(group.values()))


def _reach(merged: int, spans: dict[int, tuple[int, int]]) -> int:
    """The nodes through which kernel `merged` could depend on itself. Edges run forward in node
    order, so a walk can only come back below where it is inside a group that spans both places:
    past the last node T of `merged` and of every group starting at or before T (grown to a
    fixed point), no node leads back (the whole-graph greedy walked to the graph's end before)."""
    last = merged.bit_length() - 1
    for lo, hi in sorted(spans.values()):
        if lo > last:
            break
        last = max(last, hi)
    return (1 << (last + 1)) - 1


def _closes_cycle(og: OGraph, merged: int, group: dict[int, int], within: int = -1) -> bool:
    """Whether kernel `merged` would depend on itself through other kernels.

    Each group being convex is not enough: group A may read group B while B reads A (an fp16
    input cast fused into one group and read by both; found by the fuzzer, tests/test_fuzz.py).
    Walks the kernels reachable from `merged`'s consumers among the nodes of `within` (all by
    default; `_reach` says which nodes can matter).
    """
    seen = 0  # kernels already walked, other than `merged`
    todo = 0
    for i in bits(merged):
        todo |= og.succs[i]
    todo &= ~merged & within
    while todo:
        low = todo & -todo
        todo ^= low
        g = group.get(low.bit_length() - 1, low)
        if g & merged:
            return True
        if g & seen:
            continue
        seen |= g
        for j in bits(g):
            todo |= og.succs[j] & ~seen & within
    return False


def greedy_candidates(og: OGraph, members: int, rules: CandidateRules, legality: KernelLegality) -> list[Candidate]:
    """The greedy kernels as candidates, each writing every value read outside it."""
    return [Candidate(g, og.consumers_outside(g), og.inputs_of(g)) for g in greedy_groups(og, members, rules, legality)]
