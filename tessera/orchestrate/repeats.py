"""Subgraphs that repeat one another: a transformer's layers enumerate their candidates once.

Enumeration (`candidates.enumerate_candidates`) and the greedy plan read a subgraph's members, their
wiring, the tensors they read from outside (a producer before the subgraph, a free prologue, a
constant or a graph input), which of them later subgraphs or the graph's outputs read, and the
code generator's verdict on each node set, which depends on the same things. `structure_key`
describes all of that relative to the subgraph's first node, so two subgraphs with one key have
the same candidates, each node set moved by the distance between them (`shifted`). BERT's twelve
layers are then enumerated once; its other eleven subgraphs take a copy.

What the key holds, per member in order: its op, attributes and output types, whether later
subgraphs or the graph's outputs read it, and for each input where it comes from: a member (by
place), an orchestrated node before the subgraph (by distance, with the tensor's type), a free
node (by its own description, recursively), or a tensor from outside the orchestrated nodes (by
first appearance, its type, whether it is a constant, a one-element constant's value, and its
tf32 rounding): as `cost.measured.kernel_signature` tells kernels apart, since the code generator
reads no more of a constant than its one value.
"""
from __future__ import annotations

import hashlib

from tessera.orchestrate.candidates import Candidate
from tessera.orchestrate.graphview import OGraph
from tessera.orchestrate.partition import Subgraph


def structure_key(og: OGraph, sub: Subgraph, producer: dict[str, tuple[int, int]]) -> str:
    """What subgraph `sub`'s candidates depend on, relative to its first node (see the module
    docstring). `producer`: tensor -> (orchestrated node, output slot), for every orchestrated node."""
    g = og.graph
    free_by_output = {o: f for i in range(sub.lo, sub.hi) for f in og.free[og.nodes[i].name] for o in f.outputs if o}
    ids: dict[str, str] = {}  # tensors from outside and free nodes' outputs, by first appearance

    def tensor(t: str) -> str:
        if not t:
            return "-"
        where = producer.get(t)
        if where is not None:
            p, slot = where
            return f"n{p - sub.lo}.{slot}" if p >= sub.lo else f"b{p - sub.lo}.{slot}:{g.types[t]}"
        if t not in ids:
            f = free_by_output.get(t)
            if f is not None:
                ids[t] = f"f{len(ids)}"
                ids[t] += f"={f.op}({','.join(tensor(x) for x in f.inputs)}){_attrs(f)}:{g.types[t]}"
            else:
                const = "c" if t in g.constants else "i"
                ids[t] = (f"x{len(ids)}:{g.types[t]}:{const}={g.scalar_constant(t)!r}"
                          f"{'~tf32' if t in g.tf32_rounded else ''}")
        return ids[t].split("=")[0].split(":")[0]

    parts = []
    for i in range(sub.lo, sub.hi):
        n = og.nodes[i]
        ins = ",".join(tensor(t) for t in n.inputs)
        outs = ",".join(f"{g.types[o]}{'~tf32' if o in g.tf32_rounded else ''}" if o else "-" for o in n.outputs)
        read = f"{(sub.must_output >> i) & 1}{(og.graph_outputs >> i) & 1}"
        parts.append(f"{n.op}({ins})->{outs}{_attrs(n)}|{read}")
    parts.append("tensors:" + ";".join(ids.values()))
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()


def _attrs(n: object) -> str:
    return repr(sorted((k, repr(v)) for k, v in n.attrs.items()))  # type: ignore[attr-defined]


def producers(og: OGraph) -> dict[str, tuple[int, int]]:
    """Tensor -> (the orchestrated node that writes it, which of its outputs)."""
    return {o: (i, k) for i, n in enumerate(og.nodes) for k, o in enumerate(n.outputs) if o}


def shifted(cands: list[Candidate], by: int) -> list[Candidate]:
    """The candidates of a subgraph `by` nodes later (earlier, where negative) with the same key."""
    def move(mask: int) -> int:
        return mask << by if by >= 0 else mask >> -by
    return [Candidate(move(c.nodes), move(c.outputs), move(c.inputs)) for c in cands]
