"""Two matmuls that read the same left operand become one, over their right operands side by side.

    x @ w1, x @ w2  =  slices of x @ concat(w1, w2, axis=-1)     (w1, w2: [..., K, N1], [..., K, N2])

Column j of x @ w depends on column j of w alone, so the concatenated product holds both products
in its columns. The QKV projections of an attention layer merge this way; so does an attention's
P @ V with the row sum P @ ones that `reduce_sum_as_matmul` makes of its softmax (Korch's pad and
split: the ones become one more column of V). Constant right operands are concatenated once, at
compile time. Neither right operand may depend on the other product, or the merge would need its
own result.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, is_float, new_graph, odd_shape


def depends_on(view: View, t: str, node: Node) -> bool:
    """Does tensor `t` depend on `node`'s output (through any chain of producers)?"""
    todo, seen = [t], set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        p = view.producers.get(u)
        if p is None:
            continue
        if p.name == node.name:
            return True
        todo.extend(i for i in p.inputs if i)
    return False


def _match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.inputs[0]):
        return None
    x, w1 = node.inputs
    s1 = view.shape(w1)
    for other in view.consumers.get(x, []):
        if other.name == node.name or other.op != Prim.MATMUL.value or other.inputs[0] != x:
            continue
        w2 = other.inputs[1]
        s2 = view.shape(w2)
        if len(s2) != len(s1) or s2[:-1] != s1[:-1] or view.graph.types[w2].dtype != view.graph.types[w1].dtype:
            continue
        if depends_on(view, w2, node) or depends_on(view, w1, other):
            continue
        return Match("matmuls_sharing_left", (node.name, other.name), (node.name, other.name),
                     {"x": x, "w": (w1, w2)})
    return None


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    x, (w1, w2) = m.data["x"], m.data["w"]
    n1, n2 = view.shape(w1)[-1], view.shape(w2)[-1]
    c1, c2 = b.value(w1), b.value(w2)
    if c1 is not None and c2 is not None:  # weights: concatenated once, here
        wc = b.const(np.concatenate([c1, c2], axis=-1), "merged_weight", b.dtype(w1))
    else:
        wc = b.concat([w1, w2], axis=len(view.shape(w1)) - 1)
    y = b.matmul(x, wc)
    return [b.slice_axis(y, b.rank(y) - 1, 0, n1), b.slice_axis(y, b.rank(y) - 1, n1, n2)]


def _instance(rng: np.random.Generator) -> Graph:
    batch = odd_shape(rng, int(rng.integers(0, 2)), 1)
    m, k, n1, n2 = odd_shape(rng, 4, 1)
    g, b = new_graph({"x": (*batch, m, k), "v": (*batch, k, n1)})
    x = b.unary(Prim.EXP, "x")
    if rng.random() < 0.5:  # a weight beside an activation, or two weights
        w2 = b.const(rng.standard_normal((*batch, k, n2)).astype(np.float32), "w2")
    else:
        w2 = b.broadcast_to(b.const(np.ones((*(1,) * len(batch), k, 1), dtype=np.float32), "ones"), (*batch, k, 1))
    w1 = "v" if rng.random() < 0.5 else b.const(rng.standard_normal((*batch, k, n1)).astype(np.float32), "w1")
    p1, p2 = b.matmul(x, w1), b.matmul(x, w2)
    g.outputs = [p1, b.add(p2, p2)]
    return g


MATMULS_SHARING_LEFT = Rule("matmuls_sharing_left", "x @ w1, x @ w2 = slices of x @ concat(w1, w2)",
                            _match, _build, _instance)

RULES = (MATMULS_SHARING_LEFT,)

