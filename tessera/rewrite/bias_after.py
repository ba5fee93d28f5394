"""A row-constant addend of a matmul's left operand, added after the product instead.

    matmul(E + broadcast(b), W)  ->  matmul(E, W) + broadcast(b @ W)      (b constant along the rows, W constant)

Each row of the left operand gets the same vector b, so each row of the product gets b @ W, a
constant folded here (in float64, then stored in the graph's float type). A LayerNorm before a projection
ends in such an add (its beta); without it, what reaches the product is (x - mean) * rstd * gamma,
and rstd, a factor of each row, can leave the sum over K: a GEMM template then accumulates the
variance in its K loop and scales the accumulator once (`codegen/norm.py`), instead of a pass of
its own over the rows. The add after the product is the template's epilogue (or the library call's
bias). Exact in real arithmetic; in floating point b @ W is rounded once to the plan's type
instead of each operand element to the operand's.

Reshapes between the add and the product that keep the last axis only regroup rows, so the rule
moves through them (as `rewrite/deferred.py` does)."""
from __future__ import annotations

import numpy as np

from tessera.ir.graph import Graph, Node, TensorType
from tessera.ir.prims import Prim
from tessera.rewrite.deferred import _rows_source
from tessera.rewrite.node_edit import NodeEdit

BIAS_AFTER = "bias_after_matmul"  # the rule's name in an artifact's record of rewrites


def move_bias_after_matmul(graph: Graph) -> tuple[Graph, int]:
    """`graph` with every matmul whose left operand is E + broadcast(b), b constant along its rows
    and the right operand a constant matrix, rewritten to add b @ W to the product (a new graph),
    and how many were rewritten. The sum (and each reshape between it and the matmul) must be read
    by the next node alone and be no graph output."""
    ed = NodeEdit(graph)
    g, producers, replaced = ed.g, ed.producers, ed.replaced
    private, node, tensor = ed.private, ed.node, ed.tensor

    for mm in g.nodes:
        w = mm.inputs[1] if mm.op == Prim.MATMUL.value else None
        if w is None or w not in g.constants or g.types[w].rank != 2 or not g.types[w].dtype.is_float:
            continue
        p = mm.inputs[0]
        q = _rows_source(g, producers, private, p)
        add = producers.get(q)
        if add is None or add.op != Prim.ADD.value or not private(q):
            continue
        found = _row_constant(g, producers, add)
        if found is None:
            continue
        e, b = found
        out = mm.outputs[0]
        ot = g.types[out]
        wv = g.constants[w].astype(np.float64)
        row = (1,) * (ot.rank - 1) + (ot.shape[-1],)
        c = tensor(f"{w}/bias_after", TensorType(row, g.types[w].dtype))
        g.constants[c] = (b.astype(np.float64) @ wv).astype(g.types[w].dtype.to_numpy()).reshape(row)
        # (stored in the plan's type like any weight: a float32 one, `Graph.wide_constants`, went into
        # the library call's bias as it was, which torch refuses beside float16 operands; fuzz seed 5607)
        new: list[Node] = []
        if q != p:  # through reshapes: the product reads E regrouped as the old operand was
            ep = tensor(f"{p}/without_bias", TensorType(g.types[p].shape, g.types[e].dtype))
            new.append(node(f"{mm.name}/rows", Prim.RESHAPE.value, (e,), ep, {"shape": g.types[p].shape}, add.source))
            e = ep
        raw = tensor(f"{out}/without_bias", ot)
        wide = tensor(f"{c}/over_{out}", TensorType(ot.shape, g.types[c].dtype))
        replaced[mm.name] = new + [
            Node(mm.name, mm.op, (e, w), (raw,), dict(mm.attrs), mm.domain, mm.source),
            node(f"{mm.name}/bias_after_wide", Prim.BROADCAST.value, (c,), wide, {"shape": ot.shape}, add.source),
            node(f"{mm.name}/bias_after", Prim.ADD.value, (raw, wide), out, {}, tuple(dict.fromkeys(mm.source + add.source))),
        ]
    return ed.finish()


def _row_constant(g: Graph, producers: dict[str, Node], add: Node) -> tuple[str, np.ndarray] | None:
    """(E, b) when `add` computes E + broadcast(b) (either side), b a constant whose only non-unit
    dim is the last (the same vector for every row), of E's float type; else None."""
    for e, f in (add.inputs, add.inputs[::-1]):
        bc = producers.get(f)
        if bc is None or bc.op != Prim.BROADCAST.value or g.types[e].shape != g.types[f].shape:
            continue
        v = _constant_value(g, producers, bc.inputs[0])
        bt = g.types[bc.inputs[0]]
        if v is None or bt.dtype != g.types[e].dtype or any(n != 1 for n in bt.shape[:-1]) \
                or bt.shape[-1] != g.types[e].shape[-1]:
            continue
        return e, v.reshape(-1)
    return None


def _constant_value(g: Graph, producers: dict[str, Node], t: str) -> np.ndarray | None:
    """The value of `t` where it is a constant or a reshape of one; else None."""
    while t not in g.constants:
        n = producers.get(t)
        if n is None or n.op != Prim.RESHAPE.value:
            return None
        t = n.inputs[0]
    return np.asarray(g.constants[t])
