"""A scale that is constant along the contracted axis moves across a matmul (TASO's rule).

    (a * broadcast(r)) @ w  = (a @ w) * broadcast(r)     r: one value per row of a   ([..., M, 1])
    a @ (w * broadcast(c))  = (a @ w) * broadcast(c)     c: one value per column of w ([..., 1, N])
    (a * c) @ w = (a @ w) * c = a @ (w * c)              c: one scalar (a fill)

and the same with division by the factor. Row i of a @ w is sum_k a[i, k] w[k, :]; a factor that
does not depend on k leaves the sum. `scale_after_matmul` moves the scale to the product (softmax's
division then waits for the product, not the product for the division: Korch's second step);
`scale_before_matmul` moves it back onto the smaller operand. Exact in real arithmetic; in floating
point one rounding moves.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, is_float, new_graph, odd_shape

_SCALES = (Prim.MUL.value, Prim.DIV.value)


def _factor(view: View, scale: Node, x: str, axis: int) -> dict | None:
    """How `scale` (x * f, f * x or x / f) scales x, if f is constant along `axis` of x (-1 or -2):
    {"x": the unscaled operand, "r": the small factor, "fill": attrs of a scalar fill, "op"}."""
    a, f = scale.inputs
    sides = [(a, f)] if scale.op == Prim.DIV.value else [(a, f), (f, a)]
    for e, fac in sides:
        if view.shape(e) != view.shape(x):
            continue
        p = view.producers.get(fac)
        if p is not None and p.op == Prim.FILL.value:
            return {"x": e, "fill": dict(p.attrs), "op": scale.op, "node": p.name}
        if p is not None and p.op == Prim.BROADCAST.value:
            r = p.inputs[0]
            rs = view.shape(r)
            if len(rs) == len(view.shape(x)) and rs[axis] == 1 and view.shape(x)[axis] > 1:
                return {"x": e, "r": r, "op": scale.op, "node": p.name}
    return None


def _scaled(b: PrimBuilder, found: dict, y: str) -> str:
    """y scaled as `found` says: the factor broadcast (or filled) to y's shape."""
    shape = b.shape(y)
    if "fill" in found:
        f = b.emit(Prim.FILL, [], {**found["fill"], "shape": shape})
    else:
        f = b.broadcast_to(found["r"], shape)
    return b.emit(Prim(found["op"]), [y, f])


# ---- scale, then matmul -> matmul, then scale ----------------------------------------------------

def _after_match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.inputs[0]):
        return None
    for side, axis in ((0, -1), (1, -2)):
        s = node.inputs[side]
        scale = view.producers.get(s)
        if scale is None or scale.op not in _SCALES or not view.private(s):
            continue
        found = _factor(view, scale, s, axis)
        if found is not None:
            return Match("scale_after_matmul", (node.name,), (scale.name, node.name),
                         {**found, "side": side, "other": node.inputs[1 - side]})
    return None


def _after_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    d = m.data
    args = [d["x"], d["other"]] if d["side"] == 0 else [d["other"], d["x"]]
    return [_scaled(b, d, b.matmul(*args))]


def _operands(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    batch = odd_shape(rng, int(rng.integers(0, 2)), 1)
    m, k, n = odd_shape(rng, 3, 2)
    return (*batch, m, k), (*batch, k, n), batch


def _factor_for(b: PrimBuilder, rng: np.random.Generator, x: str, axis: int) -> str:
    """A factor for x constant along `axis`: a broadcast input or a scalar fill."""
    shape = b.shape(x)
    if rng.random() < 0.25:
        return b.fill(float(rng.uniform(0.5, 2.0)), shape, b.dtype(x))
    small = list(shape)
    small[axis] = 1
    if small and rng.random() < 0.5:
        small[0] = 1
    name = f"r{len(b.graph.inputs)}"
    from tessera.ir.graph import TensorType

    b.graph.inputs.append(name)
    b.graph.types[name] = TensorType(tuple(small), b.dtype(x))
    b.fresh(name)
    return b.emit(Prim.BROADCAST, [name], {"shape": shape})


def _after_instance(rng: np.random.Generator) -> Graph:
    ashape, wshape, _ = _operands(rng)
    g, b = new_graph({"a": ashape, "w": wshape})
    side = int(rng.integers(2))
    x = ["a", "w"][side]
    f = _factor_for(b, rng, x, -1 if side == 0 else -2)
    op = Prim.DIV if rng.random() < 0.5 else Prim.MUL
    s = b.emit(op, [x, f])
    g.outputs = [b.matmul(s, "w") if side == 0 else b.matmul("a", s)]
    return g


SCALE_AFTER_MATMUL = Rule("scale_after_matmul", "(a * r) @ w = (a @ w) * r, r constant along the contraction",
                          _after_match, _after_build, _after_instance)


# ---- matmul, then scale -> scale the smaller operand, then matmul --------------------------------

def _before_match(view: View, node: Node) -> Match | None:
    if node.op not in _SCALES:
        return None
    for y in node.inputs:
        mm = view.producers.get(y)
        if mm is None or mm.op != Prim.MATMUL.value or not view.private(y) or not is_float(view, y):
            continue
        a, w = mm.inputs
        rows = _factor(view, node, y, -1)  # one value per row: onto a
        cols = _factor(view, node, y, -2)  # one value per column: onto w
        if rows is not None and rows["x"] == y:
            onto = 0 if "r" in rows or np.prod(view.shape(a)) <= np.prod(view.shape(w)) else 1
            return Match("scale_before_matmul", (node.name,), (mm.name, node.name), {**rows, "a": a, "w": w,
                                                                                     "onto": onto})
        if cols is not None and cols["x"] == y:
            return Match("scale_before_matmul", (node.name,), (mm.name, node.name), {**cols, "a": a, "w": w,
                                                                                     "onto": 1})
    return None


def _before_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    d = m.data
    a, w = d["a"], d["w"]
    if d["onto"] == 0:
        a = _scaled(b, d, a)
    else:
        w = _scaled(b, d, w)
    return [b.matmul(a, w)]


def _before_instance(rng: np.random.Generator) -> Graph:
    ashape, wshape, _ = _operands(rng)
    g, b = new_graph({"a": ashape, "w": wshape})
    y = b.matmul(b.unary(Prim.TANH, "a"), "w")
    f = _factor_for(b, rng, y, -1 if rng.random() < 0.5 else -2)
    op = Prim.DIV if rng.random() < 0.5 else Prim.MUL
    g.outputs = [b.emit(op, [y, f] if op is Prim.DIV or rng.random() < 0.5 else [f, y])]
    return g


SCALE_BEFORE_MATMUL = Rule("scale_before_matmul", "(a @ w) * r = (a * r) @ w, r constant along the contraction",
                           _before_match, _before_build, _before_instance)

RULES = (SCALE_AFTER_MATMUL, SCALE_BEFORE_MATMUL)
