"""A chain of two products grouped the other way, where that does fewer multiply-adds; a right-
grouped chain computed transposed, so that it is a GEMM chain.

    (a @ b) @ d  =  a @ (b @ d)                      (a: M x K, b: K x N, d: N x L, the same batch axes)
    a @ (b @ d)  =  transpose((dᵀ @ bᵀ) @ aᵀ)        (ᵀ swaps the last two axes)

Matrix products are associative. (a @ b) @ d costs M·N·(K+L) multiply-adds and a @ (b @ d) costs
K·L·(M+N); the rule proposes only the cheaper grouping, in either direction, and the search keeps it
where the window orchestrates cheaper. MCFuser's GEMM chains G8-G12 do 5-8 times less work the other
way (two cuBLAS calls: 0.49-0.91 of the first grouping's time on the H100 in fp16, session 37); where
the inner product's operands are weights, the new inner product folds at compile time.

A GEMM chain kernel (`codegen/chain.py`) needs the intermediate as the second product's left operand;
in a @ (b @ d) it is the right one, so the pair runs as two GEMMs. Transposed, (AB)ᵀ = BᵀAᵀ twice,
the intermediate (b @ d)ᵀ = dᵀ @ bᵀ is on the left: one chain kernel, whose programs each compute the
intermediate's rows their output tile needs (a recomputation across output row blocks), read the
three operands transposed in place and store the result at transposed indices. On the H100 such a
kernel (`scripts/recompute_chain_probe.py`, session 38) ran G7-G9 at 0.67-0.74 of eager's two calls in
fp16 against 0.69-0.77 for the two GEMMs; the search keeps it where it orchestrates cheaper.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import Match, Rule, View, is_float, new_graph, odd_shape
from tessera.rewrite.rules.transposed_matmul import swap_last


def _sizes(view: View, a: str, b: str, d: str) -> tuple[int, int, int, int] | None:
    """(M, K, N, L) of a @ b @ d, or None unless all three are matrices with the same batch axes."""
    sa, sb, sd = view.shape(a), view.shape(b), view.shape(d)
    if not (len(sa) == len(sb) == len(sd) >= 2) or not (sa[:-2] == sb[:-2] == sd[:-2]):
        return None
    return sa[-2], sa[-1], sb[-1], sd[-1]


def _match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.outputs[0]):
        return None
    left, right = node.inputs
    for inner_right, operand in ((True, left), (False, right)):
        # inner_right: (a @ b) @ d -> a @ (b @ d); else a @ (b @ d) -> (a @ b) @ d
        inner = view.made_by(operand, Prim.MATMUL)
        if inner is None or not view.private(operand):
            continue
        a, b, d = (*inner.inputs, right) if inner_right else (left, *inner.inputs)
        sizes = _sizes(view, a, b, d)
        if sizes is None:
            continue
        m, k, n, l_ = sizes
        now, other = m * n * (k + l_), k * l_ * (m + n)  # multiply-adds of (a @ b) @ d, a @ (b @ d)
        if (other < now) if inner_right else (now < other):
            return Match("matmul_associative", (node.name,), (node.name, inner.name),
                         {"a": a, "b": b, "d": d, "inner_right": inner_right})
    return None


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    a, w, d = m.data["a"], m.data["b"], m.data["d"]
    if m.data["inner_right"]:
        return [b.matmul(a, b.matmul(w, d))]
    return [b.matmul(b.matmul(a, w), d)]


def _instance(rng: np.random.Generator) -> Graph:
    """Either grouping, with sizes that make the other one cheaper (big outer sizes, small inner
    ones, or the reverse)."""
    batch = odd_shape(rng, int(rng.integers(0, 2)), 1)
    big, small = (lambda: int(rng.choice([7, 11, 13]))), (lambda: int(rng.choice([1, 2, 3])))
    left_first = bool(rng.integers(0, 2))
    if left_first:  # (a @ b) @ d with M, N big and K, L small
        m, k, n, l_ = big(), small(), big(), small()
    else:  # a @ (b @ d) with K, L big and M, N small
        m, k, n, l_ = small(), big(), small(), big()
    g, b = new_graph({"a": (*batch, m, k), "b": (*batch, k, n), "d": (*batch, n, l_)})
    a = b.unary(Prim.TANH, "a")  # the chain reads a computed tensor, as in a model
    g.outputs = [b.matmul(b.matmul(a, "b"), "d") if left_first else b.matmul(a, b.matmul("b", "d"))]
    return g


MATMUL_ASSOCIATIVE = Rule("matmul_associative", "(a @ b) @ d = a @ (b @ d)", _match, _build, _instance)


def _chain_match(view: View, node: Node) -> Match | None:
    if node.op != Prim.MATMUL.value or not is_float(view, node.outputs[0]):
        return None
    a, right = node.inputs
    inner = view.made_by(right, Prim.MATMUL)
    if inner is None or not view.private(right) or _sizes(view, a, *inner.inputs) is None:
        return None
    return Match("matmul_chain_transposed", (node.name,), (node.name, inner.name),
                 {"a": a, "b": inner.inputs[0], "d": inner.inputs[1]})


def _chain_build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    perm = swap_last(b.rank(m.data["a"]))
    dt, bt, at = (b.transpose(m.data[k], perm) for k in ("d", "b", "a"))
    return [b.transpose(b.matmul(b.matmul(dt, bt), at), perm)]


def _chain_instance(rng: np.random.Generator) -> Graph:
    batch = odd_shape(rng, int(rng.integers(0, 2)), 1)
    m, k, n, l_ = odd_shape(rng, 4, 1)
    g, b = new_graph({"a": (*batch, m, k), "b": (*batch, k, n), "d": (*batch, n, l_)})
    g.outputs = [b.matmul(b.unary(Prim.TANH, "a"), b.matmul("b", "d"))]
    return g


MATMUL_CHAIN_TRANSPOSED = Rule("matmul_chain_transposed", "a @ (b @ d) = transpose((dᵀ @ bᵀ) @ aᵀ)",
                               _chain_match, _chain_build, _chain_instance)

RULES = (MATMUL_ASSOCIATIVE, MATMUL_CHAIN_TRANSPOSED)
