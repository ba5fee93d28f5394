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

The NaN guard that exported scaled-dot-product attention puts after its softmax (GPT-2 through
torch's ONNX export: P = where(isnan(P), 0, P), so a fully masked row gives zeros) moves along:

    matmul(where(isnan(E / r), 0, E / r), V)
        ->  where(isnan(0 / r), 0, matmul(where(isnan(E), 0, E), V) / r)

when E = exp(x) and r = sum(E) along the last axis (the softmax itself): for r finite and
non-zero, E / r is NaN exactly where E is, and where r is 0 (every E of the row 0) or NaN, every
probability of the row is NaN, so the row is zeros on both sides. The guard on E is homogeneous
(where(isnan(aE), 0, aE) = a where(isnan(E), 0, E) for a > 0), so the chain kernel still merges
the row max online. Exact for finite values (inputs whose exp overflows to inf are not).

Reshapes between the normalization and the matmul that keep the last axis only regroup rows
(fission folds a batch whose right operand is shared into M: multi-query attention, q [1, H, M, D]
against k [1, 1, L, D], is one [H*M, D] @ [D, L] product, the softmax runs on [1, H, M, L], and its
probabilities are reshaped back to [H*M, L]), so the rule moves through them too: the product
reads reshape(E), and the row factor is regrouped the same way ([1, H, M, 1] -> [H*M, 1]).
"""
from __future__ import annotations

from typing import Callable

from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType, scalar_constant
from tessera.ir.prims import Prim
from tessera.rewrite.node_edit import NodeEdit

DEFERRED = "deferred_normalization"  # the rule's name in an artifact's record of rewrites


def defer_normalization(graph: Graph) -> tuple[Graph, int]:
    """`graph` with every matmul of a row-normalized left operand rewritten to normalize its result
    (a new graph), and how many were rewritten. The normalized operand (and every reshape between
    it and the matmul) must be read by the next node alone and be no graph output, so no value
    disappears."""
    ed = NodeEdit(graph)
    g, producers, consumers, replaced = ed.g, ed.producers, ed.consumers, ed.replaced
    private, node, tensor = ed.private, ed.node, ed.tensor

    for mm in g.nodes:
        if mm.op != Prim.MATMUL.value:
            continue
        p = mm.inputs[0]
        q = _rows_source(g, producers, private, p)
        regrouped = q != p
        guard = _nan_guard(g, producers, consumers, q) if not regrouped and private(q) else None
        if guard is not None:
            q = guard.inputs[2]
        scale = producers.get(q)
        if scale is None or scale.op not in (Prim.DIV.value, Prim.MUL.value) or (guard is None and not private(q)):
            continue
        found = _row_factor(g, producers, scale, q)
        if found is None:
            continue
        e, r = found
        if guard is not None and not _softmax_parts(g, producers, e, r):
            continue
        out = mm.outputs[0]
        ot, qt, rt = g.types[out], g.types[q], g.types[r]
        if any(a not in (1, b) for a, b in zip(rt.shape[:-1], qt.shape[:-1])):
            continue
        src = tuple(dict.fromkeys(mm.source + scale.source))
        new: list[Node] = []
        if regrouped:  # through reshapes: the product reads E regrouped as P, the factor is regrouped as its rows
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
        scaled = out if guard is None else tensor(f"{out}/unguarded", ot)
        if guard is not None:  # zero E's NaNs before the product
            zero = producers[guard.inputs[1]].inputs[0]  # the guard's zero, before its broadcast
            nan_e = tensor(f"{e}/isnan", TensorType(g.types[e].shape, DType.BOOL))
            ez = tensor(f"{e}/nan_zeroed", g.types[e])
            new += [node(f"{mm.name}/guard_isnan", Prim.ISNAN.value, (e,), nan_e, {}, guard.source),
                    node(f"{mm.name}/guard", Prim.WHERE.value, (nan_e, guard.inputs[1], e), ez, {}, guard.source)]
            e = ez
        replaced[mm.name] = new + [
            Node(mm.name, mm.op, (e, mm.inputs[1]), (raw,), dict(mm.attrs), mm.domain, mm.source),
            node(f"{mm.name}/row_factor", Prim.BROADCAST.value, (r,), wide, {"shape": ot.shape}, scale.source),
            node(f"{mm.name}/deferred_{scale.op}", scale.op, (raw, wide), scaled, {}, src),
        ]
        if guard is not None:  # the rows the guard zeroes whole: 0 / r is NaN (r 0 or NaN)
            zr = tensor(f"{zero}/rows", TensorType(rt.shape, g.types[zero].dtype))
            probe = tensor(f"{r}/guard_probe", rt)
            bad = tensor(f"{r}/guard_rows", TensorType(rt.shape, DType.BOOL))
            bad_o = tensor(f"{r}/guard_rows_over_{out}", TensorType(ot.shape, DType.BOOL))
            zo = tensor(f"{zero}/over_{out}", TensorType(ot.shape, g.types[zero].dtype))
            replaced[mm.name] += [
                node(f"{mm.name}/guard_zero_rows", Prim.BROADCAST.value, (zero,), zr, {"shape": rt.shape},
                     guard.source),
                node(f"{mm.name}/guard_probe", scale.op, (zr, r), probe, {}, guard.source),
                node(f"{mm.name}/guard_rows", Prim.ISNAN.value, (probe,), bad, {}, guard.source),
                node(f"{mm.name}/guard_rows_wide", Prim.BROADCAST.value, (bad,), bad_o, {"shape": ot.shape},
                     guard.source),
                node(f"{mm.name}/guard_zero_wide", Prim.BROADCAST.value, (zero,), zo, {"shape": ot.shape},
                     guard.source),
                node(f"{mm.name}/guarded", Prim.WHERE.value, (bad_o, zo, scaled), out, {}, guard.source)]
    return ed.finish()


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


def _nan_guard(g: Graph, producers: dict[str, Node], consumers: dict[str, list[Node]], q: str) -> Node | None:
    """The node computing q = where(isnan(x), 0, x) with x read by that isnan and where alone (the
    0 a broadcast of one constant zero of x's rank); else None."""
    w = producers.get(q)
    if w is None or w.op != Prim.WHERE.value:
        return None
    cond, z, x = w.inputs
    test = producers.get(cond)
    if test is None or test.op != Prim.ISNAN.value or test.inputs[0] != x or x in g.outputs or cond in g.outputs:
        return None
    if {n.name for n in consumers.get(x, [])} != {test.name, w.name} or len(consumers.get(cond, [])) != 1:
        return None
    bz = producers.get(z)
    if bz is None or bz.op != Prim.BROADCAST.value or g.types[bz.inputs[0]].rank != g.types[x].rank \
            or g.types[bz.inputs[0]].numel != 1:  # one value: broadcast again to the rows and the result
        return None
    return w if scalar_constant(g, producers, bz.inputs[0]) == 0.0 else None


def _softmax_parts(g: Graph, producers: dict[str, Node], e: str, r: str) -> bool:
    """Is E an exp and r its sum along the last axis (kept)? Then r is 0 only where every E of its
    row is, which the guarded rule needs."""
    ex, s = producers.get(e), producers.get(r)
    last = g.types[e].rank - 1
    return (ex is not None and ex.op == Prim.EXP.value and s is not None and s.op == Prim.REDUCE_SUM.value
            and s.inputs[0] == e and tuple(a % g.types[e].rank for a in s.attrs.get("axes", ())) == (last,))


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
