"""Elementwise work before a broadcast, not after it.

    f(broadcast(x, s))                        = broadcast(f(x), s)          (f unary, casts included)
    g(broadcast(x, s), broadcast(y, s))       = broadcast(g(x, y), s)       (x and y of one shape)
    g(broadcast(x, s), fill(c, s))            = broadcast(g(x, fill(c, shape(x))), s)   (either side)

An elementwise function of repeated elements repeats its results, so it can run on the small
tensor once per distinct element. The broadcast then feeds whatever read the result, and a
kernel recomputes it from index arithmetic.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import BINARY, UNARY, Prim
from tessera.rewrite.rules.base import Match, Rule, View, new_graph, odd_shape


# ---- f(broadcast(x)) -----------------------------------------------------------------------------

def _unary_match(view: View, node: Node) -> Match | None:
    if not node.is_prim or node.prim not in UNARY:
        return None
    bc = view.made_by(node.inputs[0], Prim.BROADCAST)
    if bc is None:
        return None
    return Match("unary_of_broadcast", (node.name,), (bc.name, node.name),
                 {"x": bc.inputs[0], "op": node.op, "attrs": dict(node.attrs), "shape": bc.attrs["shape"]})


def _unary_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    y = b.emit(Prim(m.data["op"]), [m.data["x"]], dict(m.data["attrs"]))
    return [b.emit(Prim.BROADCAST, [y], {"shape": m.data["shape"]})]


def _unary_instance(rng: np.random.Generator) -> Graph:
    full = odd_shape(rng, int(rng.integers(1, 4)), 2)
    small = tuple(d if rng.random() < 0.5 else 1 for d in full)
    g, b = new_graph({"x": small, "y": full})
    wide = b.emit(Prim.BROADCAST, ["x"], {"shape": full})
    op = [Prim.EXP, Prim.TANH, Prim.NEG, Prim.SIGMOID, Prim.ERF, Prim.ABS, Prim.CAST][int(rng.integers(7))]
    attrs = {"dtype": DType.FLOAT16.value} if op is Prim.CAST else {}
    y = b.emit(op, [wide], attrs)
    g.outputs = [b.add(b.cast(y, DType.FLOAT32), "y")]
    return g


UNARY_OF_BROADCAST = Rule("unary_of_broadcast", "f(broadcast(x, s)) = broadcast(f(x), s)",
                          _unary_match, _unary_build, _unary_instance)


# ---- g(broadcast(x), broadcast(y)) ---------------------------------------------------------------

def _binary_match(view: View, node: Node) -> Match | None:
    if not node.is_prim or node.prim not in BINARY:
        return None
    a, c = node.inputs
    ba, bc = view.made_by(a, Prim.BROADCAST), view.made_by(c, Prim.BROADCAST)
    if ba is not None and bc is not None:
        if view.shape(ba.inputs[0]) != view.shape(bc.inputs[0]):
            return None
        return Match("binary_of_broadcasts", (node.name,), (ba.name, bc.name, node.name),
                     {"x": ba.inputs[0], "y": bc.inputs[0], "op": node.op, "shape": ba.attrs["shape"]})
    for bcast, other, side in ((ba, c, 1), (bc, a, 0)):
        fill = view.made_by(other, Prim.FILL)
        if bcast is not None and fill is not None:
            return Match("binary_of_broadcasts", (node.name,), (bcast.name, fill.name, node.name),
                         {"x": bcast.inputs[0], "fill": dict(fill.attrs), "side": side, "op": node.op,
                          "shape": bcast.attrs["shape"]})
    return None


def _binary_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    x = m.data["x"]
    if "fill" in m.data:
        f = m.data["fill"]
        y = b.emit(Prim.FILL, [], {**f, "shape": view.shape(x)})
        args = [x, y] if m.data["side"] == 1 else [y, x]
    else:
        args = [x, m.data["y"]]
    return [b.emit(Prim.BROADCAST, [b.emit(Prim(m.data["op"]), args)], {"shape": m.data["shape"]})]


def _binary_instance(rng: np.random.Generator) -> Graph:
    full = odd_shape(rng, int(rng.integers(1, 4)), 2)
    small = tuple(d if rng.random() < 0.5 else 1 for d in full)
    g, b = new_graph({"x": small, "y": small, "z": full})
    wx = b.emit(Prim.BROADCAST, ["x"], {"shape": full})
    op = [Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.MAX, Prim.MIN][int(rng.integers(6))]
    if rng.random() < 0.5:
        other = b.emit(Prim.BROADCAST, ["y"], {"shape": full})
    else:
        other = b.fill(float(rng.uniform(0.5, 2.0)), full, DType.FLOAT32)
    args = [wx, other] if rng.random() < 0.5 else [other, wx]
    g.outputs = [b.add(b.emit(op, args), "z")]
    return g


BINARY_OF_BROADCASTS = Rule("binary_of_broadcasts", "g(broadcast(x, s), broadcast(y, s)) = broadcast(g(x, y), s)",
                            _binary_match, _binary_build, _binary_instance)

RULES = (UNARY_OF_BROADCAST, BINARY_OF_BROADCASTS)
