"""Execution states: the downward-closed node sets of a subgraph.

A state is a set of nodes that can have run: with every node, all its
producers inside the subgraph (producers outside it are available already).
Korch's candidate kernels are the differences S' \\ S of two comparable states;
`tests/test_orchestrate_candidates.py` checks that these are exactly the convex
subsets, which is what `candidates.py` enumerates directly.
"""
from __future__ import annotations

from tessera.orchestrate.graphview import OGraph, bits


def ready(og: OGraph, members: int, state: int) -> int:
    """Nodes of `members` not in `state` whose producers in `members` all are."""
    out = 0
    for i in bits(members & ~state):
        if not (og.preds[i] & members & ~state):
            out |= 1 << i
    return out


def _explore(og: OGraph, members: int, cap: int) -> tuple[set[int], bool]:
    """States reached by depth-first search from the empty state (a memo of
    visited bitsets), stopping once more than `cap` are found; and whether it stopped.
    Each state carries its ready set: adding node i can only make i's consumers ready, so a
    child's set is its parent's less i plus those (scanning every member per state took half of
    GPT-2's orchestration)."""
    seen = {0}
    stack = [(0, ready(og, members, 0))]
    while stack:
        s, r = stack.pop()
        for i in bits(r):
            t = s | (1 << i)
            if t in seen:
                continue
            seen.add(t)
            if len(seen) > cap:
                return seen, True
            nr = r & ~(1 << i)
            for j in bits(og.succs[i] & members & ~t):
                if not (og.preds[j] & members & ~t):
                    nr |= 1 << j
            stack.append((t, nr))
    return seen, False


def count_states(og: OGraph, members: int, cap: int) -> int:
    """The number of execution states of subgraph `members`, counting up to `cap + 1`."""
    return len(_explore(og, members, cap)[0])


def enumerate_states(og: OGraph, members: int, cap: int = 1 << 20) -> set[int]:
    """Every execution state of subgraph `members` (raises past `cap`)."""
    seen, stopped = _explore(og, members, cap)
    if stopped:
        raise ValueError(f"more than {cap} states")
    return seen


def state_differences(og: OGraph, members: int) -> set[int]:
    """All non-empty S' \\ S for states S ⊂ S' (quadratic: for tests on small graphs)."""
    states = enumerate_states(og, members)
    return {b & ~a for a in states for b in states if a != b and a & b == a}
