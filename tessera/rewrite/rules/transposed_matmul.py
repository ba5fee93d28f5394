"""A product computed transposed: the operands swap places, so M and N swap.

    a @ b  =  transpose(transpose(b) @ transpose(a))        (each transpose swaps the last two axes)

(AB)^T = B^T A^T. Korch's EfficientViT case: a product whose left operand is 1024 times longer
than wide runs faster with the long side as N; the transposes then ride in the kernels around it
(a transpose is a change of strides to a kernel that loads or stores the tensor).
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, is_float, new_graph, odd_shape


def swap_last(rank: int) -> tuple[int, ...]:
    return (*range(rank - 2), rank - 1, rank - 2)


def _match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.inputs[0]) or view.graph.types[node.inputs[0]].rank < 2:
        return None
    return Match("matmul_transposed", (node.name,), (node.name,), {"a": node.inputs[0], "b": node.inputs[1]})


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    a, w = m.data["a"], m.data["b"]
    perm = swap_last(b.rank(a))
    return [b.transpose(b.matmul(b.transpose(w, perm), b.transpose(a, perm)), perm)]


def _instance(rng: np.random.Generator) -> Graph:
    batch = odd_shape(rng, int(rng.integers(0, 2)), 1)
    m, k, n = odd_shape(rng, 3, 1)
    g, b = new_graph({"a": (*batch, m, k), "w": (*batch, k, n)})
    g.outputs = [b.matmul(b.unary(Prim.TANH, "a"), "w")]
    return g


MATMUL_TRANSPOSED = Rule("matmul_transposed", "a @ b = transpose(transpose(b) @ transpose(a))",
                         _match, _build, _instance)

RULES = (MATMUL_TRANSPOSED,)
