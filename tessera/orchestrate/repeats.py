"""Subgraphs that repeat one another: a transformer's layers enumerate their candidates once.

Enumeration (`candidates.enumerate_candidates`) and the greedy plan read a subgraph's members, their
wiring, the tensors they read from outside (a producer before the subgraph, a free prologue, a
constant or a graph input), which of them later subgraphs or the graph's outputs read, and the
code generator's verdict on each node set, which depends on the same things. `structure_key`
describes all of that relative to the subgraph's first node, so two subgraphs with one key have
the same candidates, each node set moved by the distance between them (`shifted`). BERT's twelve
layers are then enumerated once; its other eleven subgraphs take a copy.

The key is the members' kernel signature (`ir.signature`: ops, attributes, types, wiring, a
one-element constant's value, with their free prologue, as the code generator sees them), plus
what a signature leaves out and enumeration reads: where each tensor from outside comes from (an
orchestrated node before the subgraph, by distance; a constant; a graph input), and which members
later subgraphs or the graph's outputs read.
"""
from __future__ import annotations

import hashlib

from tessera.ir.signature import kernel_signature
from tessera.orchestrate.candidates import Candidate
from tessera.orchestrate.graphview import OGraph, prologue_of
from tessera.orchestrate.partition import Subgraph


def structure_key(og: OGraph, sub: Subgraph, producer: dict[str, tuple[int, int]]) -> str:
    """What subgraph `sub`'s candidates depend on, relative to its first node (see the module
    docstring). `producer`: tensor -> (orchestrated node, output slot), for every orchestrated node."""
    g = og.graph
    members = og.nodes[sub.lo:sub.hi]
    pro = prologue_of(og, members)
    made = {o for n in [*pro, *members] for o in n.outputs if o}
    outside = []
    for n in [*pro, *members]:
        for t in n.inputs:
            if not t or t in made:
                continue
            where = producer.get(t)
            outside.append(f"{where[0] - sub.lo}.{where[1]}" if where is not None
                           else "c" if t in g.constants else "i")
    read = [f"{(sub.must_output >> i) & 1}{(og.graph_outputs >> i) & 1}" for i in range(sub.lo, sub.hi)]
    outs = [o for n in members for o in n.outputs if o]
    return hashlib.sha1("|".join([kernel_signature(g, members, pro, outs), ",".join(outside), "".join(read)])
                        .encode()).hexdigest()


def producers(og: OGraph) -> dict[str, tuple[int, int]]:
    """Tensor -> (the orchestrated node that writes it, which of its outputs)."""
    return {o: (i, k) for i, n in enumerate(og.nodes) for k, o in enumerate(n.outputs) if o}


def shifted(cands: list[Candidate], by: int) -> list[Candidate]:
    """The candidates of a subgraph `by` nodes later (earlier, where negative) with the same key."""
    def move(mask: int) -> int:
        return mask << by if by >= 0 else mask >> -by
    return [Candidate(move(c.nodes), move(c.outputs), move(c.inputs)) for c in cands]
