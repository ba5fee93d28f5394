"""A layout primitive of constants is computed once, at compile time.

    transpose / reshape / slice / pad / concat (constants)  =  the constant it computes

A weight transposed for a matmul, sliced, or split then concatenated is the same tensor on every
call, so the plan stores it in the order its kernel reads it. Only primitives that move elements
(no arithmetic, so no rounding moves) and that store at most twice what they read (a broadcast
would store its repeats) are folded.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, GraphKind, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, new_graph, odd_shape

_FOLDABLE = {Prim.TRANSPOSE.value, Prim.RESHAPE.value, Prim.SLICE.value, Prim.PAD.value, Prim.CONCAT.value}


def _match(view: View, node: Node) -> Match | None:
    if node.op not in _FOLDABLE or not all(i in view.graph.constants for i in node.inputs if i):
        return None
    read = sum(view.graph.types[i].numel for i in node.inputs if i)
    if view.graph.types[node.outputs[0]].numel > 2 * read:
        return None
    return Match("fold_constant_layout", (node.name,), (node.name,))


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    from tessera.ir.interp import run

    node = view.nodes[m.roots[0]]
    g = view.graph
    one = Graph("fold", GraphKind.PRIMITIVE, outputs=[node.outputs[0]], nodes=[node],
                types={t: g.types[t] for t in (*node.inputs, node.outputs[0]) if t},
                constants={t: g.constants[t] for t in node.inputs if t})
    value = run(one, {})[node.outputs[0]]
    return [b.const(value, "folded", g.types[node.outputs[0]].dtype)]


def _instance(rng: np.random.Generator) -> Graph:
    k, n = odd_shape(rng, 2, 2)
    g, b = new_graph({"x": (int(rng.choice([1, 3])), k)})
    w = b.const(rng.standard_normal((n, k)).astype(np.float32), "w")
    kind = int(rng.integers(3))
    if kind == 0:
        wt = b.emit(Prim.TRANSPOSE, [w], {"perm": (1, 0)})
    elif kind == 1:
        wt = b.emit(Prim.TRANSPOSE, [b.emit(Prim.CONCAT, [w, w], {"axis": 0})], {"perm": (1, 0)})
    else:
        wt = b.emit(Prim.PAD, [b.emit(Prim.TRANSPOSE, [w], {"perm": (1, 0)})], {"pads": (0, 1, 0, 0),
                                                                              "mode": "constant", "value": 0.0})
    g.outputs = [b.matmul("x", b.slice_axis(wt, 1, 0, n))]
    return g


FOLD_CONSTANT_LAYOUT = Rule("fold_constant_layout", "layout(constants) = its value", _match, _build, _instance)

RULES = (FOLD_CONSTANT_LAYOUT,)
