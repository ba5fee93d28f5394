"""Automatic partitioning of the orchestrated graph into subgraphs.

The binary program is solved per subgraph, so each must stay small: its
execution-state count stays under a bound. The graph is cut along its
topological order; a cut at position p separates nodes [.., p) from [p, ..),
and every tensor that crosses it must be written to memory. Cuts go where few
tensors cross (narrow cuts: a residual-block boundary crosses one tensor), and
each subgraph grows as large as the state bound allows. No cut points are ever
given by hand.

Each cut records the fusions it forbids: the producer -> consumer edges across it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tessera.errors import TesseraError
from tessera.ir.prims import Category, Prim
from tessera.orchestrate.graphview import OGraph, bits
from tessera.orchestrate.states import count_states


def default_max_states() -> int:
    """The state bound per subgraph: 2000, or $TESSERA_MAX_STATES (for an A/B on a GPU machine, where
    `scripts/bench_suite.py` takes no option for it). At 4000 the CPU compiles of the zoo's llama and of
    mixtral estimate 13% and 7% cheaper, one subgraph a decoder layer instead of two cut through the
    rotary and key/value paths; canine's estimate rose 0.8% (another partition); eleven other models
    were unchanged (docs/orchestration.md). Not the default until a GPU measures it."""
    raw = os.environ.get("TESSERA_MAX_STATES", "2000")
    if not raw.isdigit() or int(raw) < 1:
        raise TesseraError(f"TESSERA_MAX_STATES={raw!r}: the state bound must be a positive integer")
    return int(raw)


@dataclass(frozen=True)
class Cut:
    position: int  # first node of the later side
    tensors: tuple[str, ...]  # tensors that cross, so must be materialized
    bytes: int
    lost_fusions: tuple[tuple[str, str], ...]  # (producer, consumer) node names


@dataclass
class Subgraph:
    index: int
    lo: int
    hi: int  # nodes [lo, hi) of the topological order
    states: int  # execution states (the count stops past the bound)
    members: int = 0
    # Nodes whose value later subgraphs read: they must be written by this one.
    must_output: int = 0
    notes: list[str] = field(default_factory=list)


def _mask(lo: int, hi: int) -> int:
    return ((1 << hi) - 1) & ~((1 << lo) - 1)


def cut_at(og: OGraph, p: int) -> Cut:
    """What crosses the cut before position p."""
    before, after = _mask(0, p), _mask(p, og.n)
    tensors, nbytes, lost = [], 0, []
    for i in bits(before):
        consumers = og.succs[i] & after
        if consumers:
            tensors.extend(o for o in og.nodes[i].outputs if o)
            nbytes += og.out_bytes[i]
            lost.extend((og.nodes[i].name, og.nodes[j].name) for j in bits(consumers))
    return Cut(p, tuple(tensors), nbytes, tuple(lost))


def _crossing_count(og: OGraph, lo: int, p: int, fusable: int, linear_nodes: int) -> tuple[int, int, int]:
    """(fusions, fusions into linear primitives, bytes) that a cut at position p forbids, counting
    producers from `lo` on (earlier ones cross an earlier cut anyway). A fusion is a producer ->
    consumer edge: a tensor read by three fusable nodes across the cut (a residual sum read by the
    layernorm's two steps and the next residual add) forbids three, where the residual stream
    alone forbids one. Edges into linear primitives count apart: a library call reads its inputs
    from memory in any plan, but a template may compute them in its operand prologue (a GEMM chain
    reads attention's head split in place), so such a cut is second best."""
    after = _mask(p, og.n)
    count = linear = nbytes = 0
    for i in range(lo, p):
        fused = (og.succs[i] & after & fusable).bit_count()
        if fused:
            count += fused
            nbytes += og.out_bytes[i]
        linear += (og.succs[i] & after & linear_nodes).bit_count()
    return count, linear, nbytes


def fusable_nodes(og: OGraph) -> int:
    """Nodes that can share a kernel with their producers (not linear, not opaque)."""
    return sum(1 << i for i, n in enumerate(og.nodes)
               if Prim(n.op).category not in (Category.LINEAR, Category.OPAQUE))


def _longest_under_bound(og: OGraph, lo: int, max_states: int) -> int:
    """The largest hi with states([lo, hi)) <= max_states (state counts grow with hi)."""
    if count_states(og, _mask(lo, og.n), max_states) <= max_states:
        return og.n
    good, bad = lo + 1, og.n
    while bad - good > 1:
        mid = (good + bad) // 2
        if count_states(og, _mask(lo, mid), max_states) <= max_states:
            good = mid
        else:
            bad = mid
    return good


def best_cut(og: OGraph, lo: int, hi: int) -> int:
    """The cut position in the later half of (lo, hi] that forbids the fewest
    fusions (then bytes); ties go to the later position, for larger subgraphs."""
    best, best_key = hi, None
    fusable = fusable_nodes(og)
    linear_nodes = sum(1 << i for i, n in enumerate(og.nodes) if Prim(n.op).category is Category.LINEAR)
    for p in range(max(lo + 1, lo + (hi - lo) // 2), hi + 1):
        if p == og.n:
            return p
        count, linear, nbytes = _crossing_count(og, lo, p, fusable, linear_nodes)
        key = (count, linear, nbytes, -p)
        if best_key is None or key < best_key:
            best, best_key = p, key
    return best


def partition(og: OGraph, max_states: int) -> tuple[list[Subgraph], list[Cut]]:
    """Split `og` into consecutive subgraphs of at most `max_states` states each."""
    bounds = []
    lo = 0
    while lo < og.n:
        hi = _longest_under_bound(og, lo, max_states)
        p = og.n if hi == og.n else best_cut(og, lo, hi)
        bounds.append((lo, p))
        lo = p
    return subgraphs_from_bounds(og, bounds, max_states)


def split_subgraph(og: OGraph, subs: list[Subgraph], k: int, max_states: int) -> tuple[list[Subgraph], list[Cut]]:
    """Cut subgraph k in two (at its best cut near the middle); used when it has too many candidates."""
    bounds = [(s.lo, s.hi) for s in subs]
    lo, hi = bounds[k]
    if hi - lo < 2:
        raise ValueError("a one-node subgraph cannot be split")
    mid = (lo + hi) // 2
    p = best_cut(og, lo, mid) if mid > lo + 1 else mid
    p = min(max(p, lo + 1), hi - 1)
    bounds[k:k + 1] = [(lo, p), (p, hi)]
    return subgraphs_from_bounds(og, bounds, max_states)


def subgraphs_from_bounds(og: OGraph, bounds: list[tuple[int, int]], max_states: int) -> tuple[list[Subgraph], list[Cut]]:
    subs, cuts = [], []
    for k, (lo, hi) in enumerate(bounds):
        members = _mask(lo, hi)
        later = _mask(hi, og.n)
        must = 0
        for i in bits(members):
            if og.succs[i] & later:
                must |= 1 << i
        subs.append(Subgraph(k, lo, hi, count_states(og, members, max_states), members, must))
        if hi < og.n:
            cuts.append(cut_at(og, hi))
    return subs, cuts
