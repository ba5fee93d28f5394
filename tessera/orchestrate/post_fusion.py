"""Post-scheduling fusion of an operand prologue into a GEMM-chain kernel (Hidet's post-scheduling
fusion, applied to the solved plan).

The binary program chooses kernels within each subgraph of the partition. Where attention's
operands are computed by elementwise and layout work of their own (Llama's rotary embedding: q and
k multiplied by cos and sin, their halves negated and swapped), the region from the QKV projection
to the second product holds too many states or candidates for one subgraph, so a cut falls between
the rotary kernels and the chain and forbids the fusion. The chain template can compute that work
where it loads its operand tiles (`codegen/chain.py` reads operands through their prologue).

So after the solve, a chain kernel takes in a kernel of the plan that only feeds it: every value
that kernel writes is read by the chain alone, and none is a graph output. The merged kernel must
be a legal, convex candidate, and is kept only where the cost model prices it below the two it
replaces (measured, under a measured compile). Repeated until nothing more joins: the kernel that
rotates k, once taken in, leaves the one that slices q, k and v from the projection feeding the
chain alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tessera.orchestrate.candidates import Candidate, KernelLegality, prologue_op
from tessera.orchestrate.graphview import OGraph, bits
from tessera.orchestrate.partition import linear_nodes

Chosen = tuple[int, Candidate, float]  # (subgraph, kernel, cost in seconds), in execution order


@dataclass(frozen=True)
class Absorbed:
    """One fusion made: the prologue kernel's primitives, into the chain kernel it fed."""

    prologue: tuple[str, ...]
    chain_first: str  # the chain kernel's first primitive (kernel ids are assigned after this pass)
    before_s: float  # the two kernels' cost
    after_s: float  # the merged kernel's

    def as_dict(self) -> dict[str, object]:
        return {"prologue": list(self.prologue), "chain": self.chain_first,
                "before_us": round(self.before_s * 1e6, 3), "after_us": round(self.after_s * 1e6, 3)}


def _prologue_only(og: OGraph, mask: int) -> bool:
    return all(prologue_op(og.nodes[i].op) for i in bits(mask))


def _feeds_only(og: OGraph, chosen: list[Chosen], p: int, c: int) -> bool:
    """Kernel `p` writes only values that kernel `c` alone reads, none a graph output, and no other
    kernel computes any of its primitives. (Every node is in some kernel, so a reader of p's values
    outside p and c is another kernel's: it reads them from memory or computes them again.)"""
    pk = chosen[p][1]
    if pk.outputs & og.graph_outputs:
        return False
    for k, (_, other, _) in enumerate(chosen):
        if k in (p, c):
            continue
        if other.nodes & pk.nodes or other.inputs & pk.outputs:
            return False
    return True


def _mergeable(og: OGraph, chosen: list[Chosen], legality: KernelLegality,
               linear: int) -> list[tuple[int, int, Candidate]]:
    """(chain kernel, kernel that only feeds it, the two as one candidate) for every such legal pair
    (`linear`: the graph's linear nodes)."""
    out = []
    for c, (_, chain, _) in enumerate(chosen):
        if (chain.nodes & linear).bit_count() != 2:
            continue
        for p, (_, pro, _) in enumerate(chosen):
            if p == c or not chain.inputs & pro.outputs or not _prologue_only(og, pro.nodes) \
                    or not _feeds_only(og, chosen, p, c):
                continue
            merged = chain.nodes | pro.nodes
            if og.is_convex(merged) and legality.check(og, merged) is None:
                out.append((c, p, Candidate(merged, chain.outputs, og.inputs_of(merged))))
    return out


def absorb_prologues(og: OGraph, chosen: list[Chosen], cost: Callable[[Candidate], float],
                     legality: KernelLegality) -> tuple[list[Chosen], list[Absorbed]]:
    """`chosen` with each GEMM-chain kernel grown by the kernels that only feed it, where that is
    legal and priced cheaper; and the fusions made. Each round prices its merges in one batch (a
    measured cost times them together), takes every one that pays, at most one per chain, and the
    next round looks again: a kernel that fed a chain and another kernel absorbed in this round
    only feeds the chain now."""
    chosen = list(chosen)
    made: list[Absorbed] = []
    linear = linear_nodes(og)
    while True:
        pairs = _mergeable(og, chosen, legality, linear)
        prepare = getattr(cost, "prepare", None)
        if pairs and prepare is not None:
            prepare([cand for _, _, cand in pairs])
        merges: dict[int, tuple[int, Candidate, float]] = {}
        busy: set[int] = set()
        for c, p, cand in pairs:
            if c in busy or p in busy:
                continue
            after = cost(cand)
            if after < chosen[c][2] + chosen[p][2]:
                merges[c] = (p, cand, after)
                busy |= {c, p}
        if not merges:
            return chosen, made
        gone = {p for p, _, _ in merges.values()}
        grown: list[Chosen] = []
        for k, (sub, kern, s) in enumerate(chosen):
            if k in gone:
                continue  # it runs before the chain it joins (it feeds it), which takes its place below
            if k in merges:
                p, cand, after = merges[k]
                pro = chosen[p][1]
                made.append(Absorbed(tuple(og.nodes[i].name for i in bits(pro.nodes)),
                                     og.nodes[(kern.nodes & -kern.nodes).bit_length() - 1].name,
                                     s + chosen[p][2], after))
                grown.append((sub, cand, after))
            else:
                grown.append((sub, kern, s))
        chosen = grown
