"""The first product of a GEMM chain split over K: slices multiplied apart, their partials summed.

    x @ w  =  reduce_sum_s( transpose(reshape(x, [.., M, S, K/S]))  @  reshape(w, [.., S, K/S, N]) )

(x: [.., M, K], w: [.., K, N]; the transpose brings the slice axis S before M.) A product whose
output is small (few tiles) and whose K is long walks K on few programs: in MCFuser's regrouped
chains `a @ (b @ d)`, X = b @ d is 128 x 128 with K 512-1024, and on the H100 four K steps on 8
programs took 2.39 µs where one step on 32 took 1.76 (`scripts/floor_probe.py`, session 39). Split,
the S slices run side by side as a batched product, and the sum is a reduction over S elements,
which a GEMM template computes where it loads its operand (`Emitter.unrolled_reduce`): the next
product of the chain sums the partials as it reads them, with no kernel or counter for the sum.

Only a product read by matmuls alone is split (its sum then joins their operand), with S the most
slices (2, 4 or 8) that keep 128 of K each and the product's 64 x 32 tiles times S within 132
programs (one H100 wave). Summing in another order rounds differently, so the equation holds to
rounding; the search keeps it where the window orchestrates cheaper (`--rewrites on`).
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, is_float, new_graph, odd_shape

SLICES = (8, 4, 2)
MIN_SLICE = 128  # K elements per slice, at least
WAVE = 132  # programs of 64 x 32 tiles times slices, at most (the H100's SMs)


def slices(m: int, k: int, n: int) -> int:
    """How many slices of K a product [M, K] @ [K, N] is split in (1: not split)."""
    tiles = -(-m // 64) * -(-n // 32)
    return next((s for s in SLICES if k % s == 0 and k // s >= MIN_SLICE and tiles * s <= WAVE), 1)


def _match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.outputs[0]):
        return None
    x, w = node.inputs
    sx, sw = view.shape(x), view.shape(w)
    if len(sx) < 2 or len(sx) != len(sw) or sx[:-2] != sw[:-2]:
        return None
    readers = view.consumers.get(node.outputs[0], [])
    if not readers or node.outputs[0] in view.graph.outputs or any(r.op != Prim.MATMUL.value for r in readers):
        return None
    s = slices(sx[-2], sx[-1], sw[-1])
    if s == 1:
        return None
    return Match("matmul_split_k", (node.name,), (node.name,), {"x": x, "w": w, "s": s})


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    x, w, s = m.data["x"], m.data["w"], m.data["s"]
    *batch, rows, k = view.shape(x)
    cols = view.shape(w)[-1]
    nb = len(batch)
    xs = b.transpose(b.reshape(x, (*batch, rows, s, k // s)), (*range(nb), nb + 1, nb, nb + 2))
    ws = b.reshape(w, (*batch, s, k // s, cols))
    return [b.reduce(Prim.REDUCE_SUM, b.matmul(xs, ws), [nb], keepdims=False)]


def _instance(rng: np.random.Generator) -> Graph:
    """A chain whose first product is split in 2, 4 or 8: small M and N, K of 256-1024."""
    batch = odd_shape(rng, int(rng.integers(0, 2)), 1)
    m, n, l_ = odd_shape(rng, 3, 1)
    k = int(rng.choice([256, 512, 1024]))
    g, b = new_graph({"a": (*batch, m, n), "x": (*batch, n, k), "w": (*batch, k, l_)})
    g.outputs = [b.matmul(b.unary(Prim.TANH, "a"), b.matmul("x", "w"))]
    return g


# The analytical estimate has no operand prologues, so it prices the sum as a kernel of its own and
# the slices' operands as copies: the search measures the split's best sequence whatever it estimates.
MATMUL_SPLIT_K = Rule("matmul_split_k", "x @ w = sum_s transpose(reshape(x))[s] @ reshape(w)[s]",
                      _match, _build, _instance, estimate_blind=True)

RULES = (MATMUL_SPLIT_K,)
