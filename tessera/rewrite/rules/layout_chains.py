"""Chains of layout primitives that collapse into one (or none).

    transpose(transpose(x, p), q) = transpose(x, [p[q[0]], p[q[1]], ...])    (x itself if that is the identity)
    reshape(reshape(x, s1), s2)   = reshape(x, s2)                           (x itself if s2 is x's shape)
    broadcast(broadcast(x, s1), s2) = broadcast(x, s2)

Each holds for any operand: a transpose moves elements, the composition moves them once; a reshape
keeps the row-major order; a broadcast repeats size-1 dims, and a dim that was 1 in x stays a
repeat of the same element. The inner node stays where something else reads it.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, new_graph, odd_shape


def _inner(view: View, node: Node, op: Prim) -> Node | None:
    """The node of the same `op` that writes `node`'s first input, when `node` is an `op` too."""
    if node.op != op.value:
        return None
    return view.made_by(node.inputs[0], op)


# ---- transpose(transpose(x)) ---------------------------------------------------------------------

def _tt_match(view: View, node: Node) -> Match | None:
    inner = _inner(view, node, Prim.TRANSPOSE)
    if inner is None:
        return None
    p, q = inner.attrs["perm"], node.attrs["perm"]
    return Match("transpose_of_transpose", (node.name,), (inner.name, node.name),
                 {"x": inner.inputs[0], "perm": tuple(p[i] for i in q)})


def _tt_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    return [b.transpose(m.data["x"], m.data["perm"])]


def _tt_instance(rng: np.random.Generator) -> Graph:
    rank = int(rng.integers(2, 5))
    g, b = new_graph({"x": odd_shape(rng, rank, 2)})
    first = tuple(int(i) for i in rng.permutation(rank))
    y = b.emit(Prim.TRANSPOSE, ["x"], {"perm": first})
    # sometimes the inverse, so the pair cancels
    perm = tuple(int(i) for i in (np.argsort(first) if rng.random() < 0.3 else rng.permutation(rank)))
    z = b.emit(Prim.TRANSPOSE, [y], {"perm": perm})
    g.outputs = [b.mul(z, z)]  # a reader after it, so the result may be x itself
    return g


TRANSPOSE_OF_TRANSPOSE = Rule("transpose_of_transpose", "transpose(transpose(x, p), q) = transpose(x, p[q])",
                              _tt_match, _tt_build, _tt_instance)


# ---- reshape(reshape(x)), broadcast(broadcast(x)): the outer shape is all that counts ------------

def _outer_shape_match(op: Prim, rule: str):
    def match(view: View, node: Node) -> Match | None:
        inner = _inner(view, node, op)
        if inner is None:
            return None
        return Match(rule, (node.name,), (inner.name, node.name), {"x": inner.inputs[0], "shape": node.attrs["shape"]})
    return match


def _rr_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    return [b.reshape(m.data["x"], m.data["shape"])]  # x itself where the shape is x's


def _rr_instance(rng: np.random.Generator) -> Graph:
    dims = list(odd_shape(rng, int(rng.integers(2, 5)), 2))
    g, b = new_graph({"x": tuple(dims)})
    mid = b.emit(Prim.RESHAPE, ["x"], {"shape": (int(np.prod(dims[:2])), *dims[2:])})
    last = tuple(rng.permutation(dims)) if rng.random() < 0.7 else tuple(dims)
    z = b.emit(Prim.RESHAPE, [mid], {"shape": last})
    g.outputs = [b.add(z, z)]
    return g


RESHAPE_OF_RESHAPE = Rule("reshape_of_reshape", "reshape(reshape(x, s1), s2) = reshape(x, s2)",
                          _outer_shape_match(Prim.RESHAPE, "reshape_of_reshape"), _rr_build, _rr_instance)


def _bb_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    return [b.emit(Prim.BROADCAST, [m.data["x"]], {"shape": m.data["shape"]})]


def _bb_instance(rng: np.random.Generator) -> Graph:
    full = odd_shape(rng, int(rng.integers(2, 5)), 2)
    mid = tuple(d if rng.random() < 0.5 else 1 for d in full)
    small = tuple(d if rng.random() < 0.5 else 1 for d in mid)
    g, b = new_graph({"x": small, "y": full})
    z = b.emit(Prim.BROADCAST, [b.emit(Prim.BROADCAST, ["x"], {"shape": mid})], {"shape": full})
    g.outputs = [b.emit(Prim.ADD, [z, "y"])]
    return g


BROADCAST_OF_BROADCAST = Rule("broadcast_of_broadcast", "broadcast(broadcast(x, s1), s2) = broadcast(x, s2)",
                              _outer_shape_match(Prim.BROADCAST, "broadcast_of_broadcast"), _bb_build, _bb_instance)

RULES = (TRANSPOSE_OF_TRANSPOSE, RESHAPE_OF_RESHAPE, BROADCAST_OF_BROADCAST)
