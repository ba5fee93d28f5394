"""A sum along the last axis is a product with a column of ones, and back.

    reduce_sum(x, last axis)  = x @ broadcast(ones[K, 1])        (x: [..., M, K]; the sum kept as [..., M, 1])
    x @ ones[..., K, N]       = broadcast(reduce_sum(x, last axis), [..., M, N])

Korch's first step on softmax: once the row sum is a matmul, a matmul that reads the same rows can
absorb it (`merge_matmul.py`), so the normalization's reduction rides inside a linear kernel.
The reverse turns a product with ones back into a reduction, where the reduction kernel is the
cheaper one. Both hold for any float x (the same terms summed; only the order of additions may
differ).
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node, scalar_constant
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, is_float, new_graph, odd_shape


# ---- reduce_sum -> matmul ------------------------------------------------------------------------

def _rs_match(view: View, node: Node) -> Match | None:
    if node.op != Prim.REDUCE_SUM.value or not is_float(view, node.inputs[0]):
        return None
    shape = view.shape(node.inputs[0])
    axes = tuple(a % len(shape) for a in node.attrs["axes"]) if shape else ()
    if axes != (len(shape) - 1,) or shape[-1] < 2:
        return None
    return Match("reduce_sum_as_matmul", (node.name,), (node.name,), {"x": node.inputs[0]})


def _rs_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    x = m.data["x"]
    shape = view.shape(x)
    k, dt = shape[-1], b.dtype(x)
    if len(shape) == 1:
        ones = b.const(np.ones((k, 1), dtype=dt.to_numpy()), "ones", dt)
        return [b.reshape(b.matmul(b.reshape(x, (1, k)), ones), (1,))]
    # x keeps its batch dims, so a matmul that reads x too can take the ones as one more column
    ones = b.const(np.ones((*(1,) * (len(shape) - 2), k, 1), dtype=dt.to_numpy()), "ones", dt)
    return [b.matmul(x, b.broadcast_to(ones, (*shape[:-2], k, 1)))]


def _rs_instance(rng: np.random.Generator) -> Graph:
    shape = odd_shape(rng, int(rng.integers(1, 4)), 2)
    g, b = new_graph({"x": shape})
    s = b.emit(Prim.REDUCE_SUM, [b.unary(Prim.EXP, "x")], {"axes": (len(shape) - 1,)})
    g.outputs = [b.div(b.unary(Prim.EXP, "x"), s)]  # softmax's normalization reads the sum
    return g


REDUCE_SUM_AS_MATMUL = Rule("reduce_sum_as_matmul", "reduce_sum(x, -1) = x @ ones[K, 1]",
                            _rs_match, _rs_build, _rs_instance)


# ---- matmul with ones -> reduce_sum --------------------------------------------------------------

def _mo_match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.inputs[0]):
        return None
    x, w = node.inputs
    if scalar_constant(view.graph, view.producers, w) != 1.0:
        return None
    return Match("matmul_by_ones_as_reduce_sum", (node.name,), (node.name,), {"x": x})


def _mo_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    x = m.data["x"]
    out = view.shape(view.nodes[m.roots[0]].outputs[0])
    s = b.reduce(Prim.REDUCE_SUM, x, [b.rank(x) - 1])
    return [b.broadcast_to(s, out)]


def _mo_instance(rng: np.random.Generator) -> Graph:
    rank = int(rng.integers(2, 4))
    shape = odd_shape(rng, rank, 2)
    n = int(rng.choice([1, 3, 4]))
    g, b = new_graph({"x": shape})
    ones = b.const(np.ones((*shape[:-2], shape[-1], n), dtype=np.float32), "ones")
    g.outputs = [b.matmul(b.unary(Prim.TANH, "x"), ones)]
    return g


MATMUL_BY_ONES_AS_REDUCE_SUM = Rule("matmul_by_ones_as_reduce_sum", "x @ ones[K, N] = broadcast(reduce_sum(x, -1))",
                                    _mo_match, _mo_build, _mo_instance)

RULES = (REDUCE_SUM_AS_MATMUL, MATMUL_BY_ONES_AS_REDUCE_SUM)
