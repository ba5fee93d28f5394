"""Automatic partitioning of the orchestrated graph into subgraphs.

The binary program is solved per subgraph, so each must stay small: its
execution-state count stays under a bound. The graph is cut along its
topological order; a cut at position p separates nodes [.., p) from [p, ..),
and every tensor that crosses it must be written to memory. The cuts are chosen
together (`Partitioner`, a dynamic program over their positions) to forbid the
fewest fusions: a residual-block boundary crosses one tensor. No cut points are
ever given by hand.

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
    mixtral estimate 13% and 11% cheaper (docs/orchestration.md); on the H200, llama's plan ran no
    faster (session 53, before the partition by dynamic programming). Not the default."""
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


def fusable_nodes(og: OGraph) -> int:
    """Nodes that can share a kernel with their producers (not linear, not opaque)."""
    return sum(1 << i for i, n in enumerate(og.nodes)
               if Prim(n.op).category not in (Category.LINEAR, Category.OPAQUE))


def linear_nodes(og: OGraph) -> int:
    return sum(1 << i for i, n in enumerate(og.nodes) if Prim(n.op).category is Category.LINEAR)


def window_starts(og: OGraph, max_states: int) -> list[int]:
    """starts[p] for p in [0, n]: the first q with states([q, p)) <= max_states (at most p - 1: a
    one-node window is allowed whatever the bound). The window's states are kept as a set and slid
    along the order, so no count starts from scratch: node p is maximal in [q, p + 1), so the states
    that hold it are those of [q, p) that hold its producers there, each with p added; node q is
    minimal, so the states of [q + 1, p) are those of [q, p) that hold q, less q."""
    states, q, starts = {0}, 0, [0]
    for p in range(og.n):
        bit, need = 1 << p, og.preds[p] & _mask(q, p)
        states |= {s | bit for s in states if s & need == need}
        while len(states) > max_states and q < p:
            states = {s & ~(1 << q) for s in states if s >> q & 1}
            q += 1
        starts.append(q)
    return starts


class Partitioner:
    """Cuts the graph into consecutive windows of at most `max_states` states each, the cuts chosen
    together by dynamic programming over their positions: fewest fusions forbidden, then fewest edges
    into linear primitives cut, then fewest bytes crossing, then fewest windows (larger windows leave
    the solver more to choose). A cut's price counts the edges from its own window's producers to any
    later node (earlier producers crossed an earlier cut already), so the sum over the cuts counts each
    forbidden edge once. A fusion is a producer -> consumer edge: a tensor read by three fusable nodes
    across the cut (a residual sum read by the layernorm's two steps and the next residual add)
    forbids three, where the residual stream alone forbids one. Edges into linear primitives count
    apart: a library call reads its inputs from memory in any plan, but a template may compute them
    in its operand prologue (a GEMM chain reads attention's head split in place).

    `forbid(lo, hi)` rules out every window that holds nodes [lo, hi): the orchestrator calls it for a
    window with too many candidates (a larger window has all of its candidates), and partitions again.

    The greedy partition this replaced (session 53) grew each window to the bound, then cut in its
    later half, and halved a window with too many candidates near its middle: at 2000 states it cut
    each of the zoo's llama layers twice (this cuts each once, with the default options), and at
    4000, with GEMM templates priced, its halving left 29 subgraphs for 12 layers."""

    def __init__(self, og: OGraph, max_states: int) -> None:
        self.og, self.max_states = og, max_states
        self.starts = window_starts(og, max_states)
        self.fusable, self.linear = fusable_nodes(og), linear_nodes(og)
        self.forbidden: set[tuple[int, int]] = set()
        self._states: dict[tuple[int, int], int] = {}  # a window's state count, kept across passes

    def forbid(self, lo: int, hi: int) -> None:
        if hi - lo < 2:
            raise ValueError("a one-node window cannot be ruled out")
        self.forbidden.add((lo, hi))

    def bounds(self) -> list[tuple[int, int]]:
        og, n = self.og, self.og.n
        first = list(self.starts)
        for lo, hi in self.forbidden:  # a window ending at p >= hi must start after lo
            for p in range(hi, n + 1):
                if first[p] > lo:
                    break  # (starts only grow with p)
                first[p] = lo + 1
        # best[p]: (price of the windows ending at p, where the last one starts)
        best: list[tuple[tuple[int, int, int, int], int]] = [((0, 0, 0, 0), 0)]
        for p in range(1, n + 1):
            after = _mask(p, n)
            fused = into_linear = nbytes = 0
            choice: tuple[tuple[int, int, int, int], int] | None = None
            for q in range(p - 1, first[p] - 1, -1):  # the last window is [q, p)
                crossing = og.succs[q] & after
                if crossing & self.fusable:
                    fused += (crossing & self.fusable).bit_count()
                    nbytes += og.out_bytes[q]
                into_linear += (crossing & self.linear).bit_count()
                (f, li, b, w), _ = best[q]
                key = (f + fused, li + into_linear, b + nbytes, w + 1)
                if choice is None or key < choice[0]:  # ties go to the later start: a smaller last window
                    choice = (key, q)
            assert choice is not None
            best.append(choice)
        out, p = [], n
        while p > 0:
            q = best[p][1]
            out.append((q, p))
            p = q
        return out[::-1]

    def subgraphs(self) -> tuple[list[Subgraph], list[Cut]]:
        return subgraphs_from_bounds(self.og, self.bounds(), self.max_states, self._states)


def partition(og: OGraph, max_states: int) -> tuple[list[Subgraph], list[Cut]]:
    """Split `og` into consecutive subgraphs of at most `max_states` states each (`Partitioner`)."""
    return Partitioner(og, max_states).subgraphs()


def subgraphs_from_bounds(og: OGraph, bounds: list[tuple[int, int]], max_states: int,
                          counted: dict[tuple[int, int], int] | None = None) -> tuple[list[Subgraph], list[Cut]]:
    """The subgraphs and cuts of consecutive windows. `counted` keeps each window's state count for
    the next call: after a window is ruled out, the passes that follow keep most windows as they were."""
    counted = {} if counted is None else counted
    subs, cuts = [], []
    for k, (lo, hi) in enumerate(bounds):
        members = _mask(lo, hi)
        later = _mask(hi, og.n)
        must = 0
        for i in bits(members):
            if og.succs[i] & later:
                must |= 1 << i
        if (lo, hi) not in counted:
            counted[lo, hi] = count_states(og, members, max_states)
        subs.append(Subgraph(k, lo, hi, counted[lo, hi], members, must))
        if hi < og.n:
            cuts.append(cut_at(og, hi))
    return subs, cuts
