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
"""
from __future__ import annotations

from tessera.ir.graph import Graph, Node, TensorType, unique_name
from tessera.ir.prims import Prim

DEFERRED = "deferred_normalization"  # the rule's name in an artifact's record of rewrites


def defer_normalization(graph: Graph) -> tuple[Graph, int]:
    """`graph` with every matmul of a row-normalized left operand rewritten to normalize its result
    (a new graph), and how many were rewritten. The normalized operand must be read by that
    matmul alone and be no graph output, so no value disappears."""
    g = graph.clone()
    producers = g.producers()
    consumers = g.consumers()
    names = {n.name for n in g.nodes}
    replaced: dict[str, list[Node]] = {}  # matmul name -> its replacement nodes
    for mm in g.nodes:
        if mm.op != Prim.MATMUL.value:
            continue
        p = mm.inputs[0]
        scale = producers.get(p)
        if scale is None or scale.op not in (Prim.DIV.value, Prim.MUL.value) or p in g.outputs \
                or len(consumers.get(p, [])) != 1:
            continue
        found = _row_factor(g, producers, scale, p)
        if found is None:
            continue
        e, r = found
        out = mm.outputs[0]
        ot = g.types[out]
        rt = g.types[r]
        if rt.rank != ot.rank or any(a not in (1, b) for a, b in zip(rt.shape[:-1], ot.shape[:-1])):
            continue
        raw = unique_name(f"{out}/undivided", g.types)
        g.types[raw] = ot
        wide = unique_name(f"{r}/over_{out}", g.types)
        g.types[wide] = TensorType(ot.shape, rt.dtype)
        bname = unique_name(f"{mm.name}/row_factor", names)
        names.add(bname)
        sname = unique_name(f"{mm.name}/deferred_{scale.op}", names)
        names.add(sname)
        src = tuple(dict.fromkeys(mm.source + scale.source))
        replaced[mm.name] = [
            Node(mm.name, mm.op, (e, mm.inputs[1]), (raw,), dict(mm.attrs), mm.domain, mm.source),
            Node(bname, Prim.BROADCAST.value, (r,), (wide,), {"shape": ot.shape}, "", scale.source),
            Node(sname, scale.op, (raw, wide), (out,), {}, "", src),
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
