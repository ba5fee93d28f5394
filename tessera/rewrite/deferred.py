"""Deferred row normalization: divide a matmul's result instead of its left operand.

    matmul(E / r, V)  ->  matmul(E, V) / r        (r: one value per row of E, broadcast along it)

Row i of matmul(P, V) is sum_l P[i, l] V[l, :], so a factor constant along l (the contraction
axis) leaves the sum: (sum_l E[i, l] V[l, :]) / r[i]. Softmax followed by a matmul (attention)
is exactly E / broadcast(sum(E)), so after this rule the normalization runs on the [M, N]
result rather than on the [M, L] probabilities, and the chain E -> matmul no longer waits on
the row sum: a fused chain kernel (`codegen/chain.py`) accumulates the sum and the product in
the same pass over L. The rule is exact in real arithmetic; in floating point it moves one
rounding (the quotient is rounded once per output instead of once per probability).

Multiplication by a broadcast row factor (E * broadcast(1/s)) is the same rule.

Reshapes between the normalization and the matmul that keep the last axis only regroup rows
(fission folds a batch whose right operand is shared into M: multi-query attention, q [1, H, M, D]
against k [1, 1, L, D], is one [H*M, D] @ [D, L] product, the softmax runs on [1, H, M, L], and its
probabilities are reshaped back to [H*M, L]), so the rule moves through them too: the product
reads reshape(E), and the row factor is regrouped the same way ([1, H, M, 1] -> [H*M, 1]).
"""
from __future__ import annotations

from typing import Callable

from tessera.ir.graph import Graph, Node, TensorType, unique_name
from tessera.ir.prims import Prim

DEFERRED = "deferred_normalization"  # the rule's name in an artifact's record of rewrites


def defer_normalization(graph: Graph) -> tuple[Graph, int]:
    """`graph` with every matmul of a row-normalized left operand rewritten to normalize its result
    (a new graph), and how many were rewritten. The normalized operand (and every reshape between
    it and the matmul) must be read by the next node alone and be no graph output, so no value
    disappears."""
    g = graph.clone()
    producers = g.producers()
    consumers = g.consumers()
    names = {n.name for n in g.nodes}
    replaced: dict[str, list[Node]] = {}  # matmul name -> its replacement nodes

    def private(t: str) -> bool:
        return t not in g.outputs and len(consumers.get(t, [])) == 1

    def node(base: str, op: str, inputs: tuple[str, ...], out: str, attrs: dict, source: tuple) -> Node:
        name = unique_name(base, names)
        names.add(name)
        return Node(name, op, inputs, (out,), attrs, "", source)

    def tensor(base: str, ty: TensorType) -> str:
        name = unique_name(base, g.types)
        g.types[name] = ty
        return name

    for mm in g.nodes:
        if mm.op != Prim.MATMUL.value:
            continue
        p = mm.inputs[0]
        q = _rows_source(g, producers, private, p)
        scale = producers.get(q)
        if scale is None or scale.op not in (Prim.DIV.value, Prim.MUL.value) or not private(q):
            continue
        found = _row_factor(g, producers, scale, q)
        if found is None:
            continue
        e, r = found
        out = mm.outputs[0]
        ot, qt, rt = g.types[out], g.types[q], g.types[r]
        if any(a not in (1, b) for a, b in zip(rt.shape[:-1], qt.shape[:-1])):
            continue
        src = tuple(dict.fromkeys(mm.source + scale.source))
        new: list[Node] = []
        if q != p:  # through reshapes: the product reads E regrouped as P, the factor is regrouped as its rows
            ep = tensor(f"{p}/undivided", TensorType(g.types[p].shape, g.types[e].dtype))
            new.append(node(f"{mm.name}/rows", Prim.RESHAPE.value, (e,), ep, {"shape": g.types[p].shape},
                            scale.source))
            e = ep
            rows = (*qt.shape[:-1], 1)
            if rt.shape != rows:
                rb = tensor(f"{r}/rows", TensorType(rows, rt.dtype))
                new.append(node(f"{mm.name}/row_factor_rows", Prim.BROADCAST.value, (r,), rb, {"shape": rows},
                                scale.source))
                r = rb
            orows = (*ot.shape[:-1], 1)
            rr = tensor(f"{r}/over_{out}_rows", TensorType(orows, rt.dtype))
            new.append(node(f"{mm.name}/row_factor_reshape", Prim.RESHAPE.value, (r,), rr, {"shape": orows},
                            scale.source))
            r = rr
        raw = tensor(f"{out}/undivided", ot)
        wide = tensor(f"{r}/over_{out}", TensorType(ot.shape, rt.dtype))
        replaced[mm.name] = new + [
            Node(mm.name, mm.op, (e, mm.inputs[1]), (raw,), dict(mm.attrs), mm.domain, mm.source),
            node(f"{mm.name}/row_factor", Prim.BROADCAST.value, (r,), wide, {"shape": ot.shape}, scale.source),
            node(f"{mm.name}/deferred_{scale.op}", scale.op, (raw, wide), out, {}, src),
        ]
    if not replaced:
        return graph, 0
    nodes: list[Node] = []
    for n in g.nodes:
        nodes.extend(replaced.get(n.name, [n]))
    g.nodes = nodes
    g.sort()
    g.remove_dead()
    return g, len(replaced)


def _rows_source(g: Graph, producers: dict[str, Node], private: Callable[[str], bool], p: str) -> str:
    """The tensor `p` regroups the rows of: back through reshapes that keep the last axis, each
    output read by the next node alone (`p` itself when no such reshape produces it)."""
    t = p
    while True:
        n = producers.get(t)
        if n is None or n.op != Prim.RESHAPE.value or not private(t):
            return t
        x = n.inputs[0]
        if g.types[x].rank < 2 or g.types[x].shape[-1] != g.types[t].shape[-1]:
            return t
        t = x


def _row_factor(g: Graph, producers: dict[str, Node], scale: Node, p: str) -> tuple[str, str] | None:
    """(E, r) when `scale` computes P = E / broadcast(r) (or E * broadcast(r), either side) with r
    constant along P's last axis, P's shape E's; else None."""
    a, b = scale.inputs
    sides = [(a, b)] if scale.op == Prim.DIV.value else [(a, b), (b, a)]
    pt = g.types[p]
    for e, f in sides:
        bc = producers.get(f)
        if bc is None or bc.op != Prim.BROADCAST.value or g.types[e].shape != pt.shape:
            continue
        r = bc.inputs[0]
        rs = g.types[r].shape
        if len(rs) == pt.rank and rs[-1] == 1 and pt.shape[-1] > 1 and g.types[r].dtype == pt.dtype:
            return e, r
    return None
