"""A primitive of constants is computed once, at compile time.

    transpose / reshape / slice / pad / concat (constants)  =  the constant it computes
    w1 @ w2 (constants)                                      =  the constant it computes

A weight transposed for a matmul, sliced, or split then concatenated is the same tensor on every
call, so the plan stores it in the order its kernel reads it. Those layout primitives move
elements (no arithmetic, so no rounding moves). A product of two weights (what `matmul_associative`
leaves of a chain x @ w1 @ w2) is computed in float64 and rounded once, which is no less exact than
the kernel it replaces. Only primitives that store at most twice what they read are folded (a
broadcast would store its repeats, an outer product its whole table).
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, GraphKind, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, new_graph, odd_shape

_FOLDABLE = {Prim.TRANSPOSE.value, Prim.RESHAPE.value, Prim.SLICE.value, Prim.PAD.value, Prim.CONCAT.value}


def _foldable(view: View, node: Node, ops: set[str]) -> bool:
    """`node` is one of `ops`, reads only constants, and stores at most twice what it reads."""
    if node.op not in ops or not all(i in view.graph.constants for i in node.inputs if i):
        return False
    read = sum(view.graph.types[i].numel for i in node.inputs if i)
    return view.graph.types[node.outputs[0]].numel <= 2 * read


def _match(view: View, node: Node) -> Match | None:
    return Match("fold_constant_layout", (node.name,), (node.name,)) if _foldable(view, node, _FOLDABLE) else None


def _match_matmul(view: View, node: Node) -> Match | None:
    if not _foldable(view, node, {Prim.MATMUL.value}) or not view.graph.types[node.outputs[0]].dtype.is_float:
        return None
    return Match("fold_constant_matmul", (node.name,), (node.name,))


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    from tessera.ir.interp import run

    node = view.nodes[m.roots[0]]
    g = view.graph
    one = Graph("fold", GraphKind.PRIMITIVE, outputs=[node.outputs[0]], nodes=[node],
                types={t: g.types[t] for t in (*node.inputs, node.outputs[0]) if t},
                constants={t: g.constants[t] for t in node.inputs if t})
    # float64, rounded once by `const` to the tensor's type: a product's one rounding, a layout's none
    value = run(one, {}, exact=True)[node.outputs[0]]
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


def _instance_matmul(rng: np.random.Generator) -> Graph:
    k, r, n = odd_shape(rng, 3, 1)
    g, b = new_graph({"x": (int(rng.choice([1, 3])), k)})
    w1 = b.const(rng.standard_normal((k, r)).astype(np.float32), "w1")
    w2 = b.const(rng.standard_normal((r, n)).astype(np.float32), "w2")
    big = b.const(rng.standard_normal((k, 2 * k)).astype(np.float32), "big")
    outer = b.const(rng.standard_normal((2 * k, 1)).astype(np.float32), "outer")
    # w1 @ w2 folds where it stores at most twice what it reads; big @ outer always does
    g.outputs = [b.matmul("x", b.matmul(w1, w2)), b.matmul("x", b.matmul(big, outer))]
    return g


FOLD_CONSTANT_LAYOUT = Rule("fold_constant_layout", "layout(constants) = its value", _match, _build, _instance)
FOLD_CONSTANT_MATMUL = Rule("fold_constant_matmul", "w1 @ w2 (constants) = its value", _match_matmul, _build,
                            _instance_matmul, rounding=2.0 ** -24)

RULES = (FOLD_CONSTANT_LAYOUT, FOLD_CONSTANT_MATMUL)
