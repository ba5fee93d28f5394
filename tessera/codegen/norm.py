"""A norm inside the GEMM template of the projection it feeds: its row statistics and its row factor.

A LayerNorm or RMSNorm before a matmul reaches the template as operand prologue: reductions along the
rows of the left operand (mean, variance, mean square) and elementwise work on their results. Two
forms compute them without writing the normalized operand:

- **Before the K loop** (`prewalk_statistic`, any statistic the prologue reads per row): a loop of
  its own over the reduced axes, hoisted before the K loop (`Emitter.hoisted`). It reads the rows
  again, from L2, once per statistic and per column of tiles.
- **In the K loop** (`RowFactor`, a statistic whose only use is a factor of each row: RMSNorm's
  x * rstd * gamma). A row factor leaves the sum over K: (sum_k x[m, k] r[m] w[k, n]) = r[m] (sum_k
  x[m, k] w[k, n]). So the operand is loaded without it, the statistic accumulates in the same walk
  from the same tiles, and the accumulator is scaled once at the end: no pass of its own. As with
  the deferred softmax division (`rewrite/deferred.py`), one rounding moves: a float16 operand is
  rounded before the factor, not after. Unnormalized, that operand could leave float16's range where
  the normalized one does not (a residual stream's outliers times a large gamma). So a float16
  operand is first scaled by a power of two (exact) that keeps it within range for any float16
  input: the bound comes from the path's structure (`_bound`: stored float16 values, sums,
  differences and products with constants), and the accumulator takes the power back with the
  factor. Where no bound is found, the statistic takes its loop before the walk.
"""
from __future__ import annotations

import math
from math import prod
from typing import Sequence

import numpy as np

from tessera.codegen import index as ix
from tessera.codegen.index import Ix
from tessera.codegen.kernels import COMBINE, REDUCE_FN, reduction_identity, row_result
from tessera.codegen.tile import Tile, pow2
from tessera.codegen.triton_ops import Unsupported, Val
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import BINARY, REDUCTIONS, UNARY, Prim

ROWS = frozenset({"b", "m"})  # the loop tags of one value per row of the tile


def prewalk_statistic(t: Tile, graph: Graph, node: Node, index: Sequence[Ix], mask: frozenset[str],
                      block_k: int) -> Val:
    """Reduction `node` at `index` (one row of the tile), computed by a loop of its own over the
    reduced axes before the K loop, the loops of other statistics it reads before it."""
    em = t.em
    rows = frozenset().union(*(i.deps for i in index))
    if not rows <= ROWS:
        raise Unsupported(f"{node.name}: a reduction in a GEMM template's prologue must give one value "
                          f"per row of the tile")
    key = (node.outputs[0], tuple(i.expr for i in index))
    if key in em.rows:
        return em.rows[key]
    x = node.inputs[0]
    shape = graph.types[x].shape
    axes = node.attrs["axes"]
    numel = prod(shape[d] for d in axes)
    block = min(pow2(numel), max(block_k, 64))
    ident, acc_type = reduction_identity(node.op, graph.types[x].dtype)
    with em.hoisted(0):
        acc = em.fresh("stat")
        em.stmt(f"{acc} = tl.full([{'BLOCK_M' if 'm' in rows else 1}, {block}], {ident}, {acc_type})")
        tag = em.fresh("r")
        em.push(f"for {tag} in range(0, {numel}, {block}):  # {node.name}", tag)
        dep = frozenset({tag})
        r = Ix(em.emit(f"{tag} + tl.arange(0, {block})[None, :]", dep, "rr"), None, numel, dep)
        kept = frozenset(c for c in mask if em.cond_deps[c] <= rows)
        if numel % block:
            kept |= {em.cond(f"{r.expr} < {numel}", dep)}
        _accumulate(em, graph, node, acc, _walk_coords(index, shape, axes, r), kept)
        em.pop()
        res = em.emit(row_result(graph, node, acc), rows, "row")
    em.rows[key] = Val(res, graph.types[node.outputs[0]].dtype, rows)
    return em.rows[key]


def _walk_coords(index: Sequence[Ix], shape: Sequence[int], axes: Sequence[int], r: Ix) -> list[Ix]:
    """The reduced tensor's coordinates: the row's, with walk index `r` spread over the reduced axes."""
    coords = list(index)
    for d, c in zip(axes, ix.unravel(r, [shape[d] for d in axes])):
        coords[d] = c
    return coords


def _accumulate(em, graph: Graph, node: Node, acc: str, coords: list[Ix], mask: frozenset[str],
                rows: str | None = None) -> None:
    """acc = node's reduction of acc and its input's values at `coords` (a [rows, block] tile). With
    `rows` (the tile's row count: "BLOCK_M" or "1"), each step's tile is reduced to one value per row
    first, so acc is [rows, 1]."""
    v = em.value(node.inputs[0], coords, mask)
    m = em.mask_expr(mask)
    ident = reduction_identity(node.op, graph.types[node.inputs[0]].dtype)[0]
    x = v.expr
    if rows:  # the whole step's tile (a value constant along K counts once for each of its lanes)
        x = f"tl.full([{rows}, BLOCK_K], {x}, tl.float32)" if v.is_literal else f"tl.broadcast_to({x}, [{rows}, BLOCK_K])"
    term = f"tl.where({m}, {x}, {ident})" if m else x
    if rows:
        term = f"{REDUCE_FN[node.op]}({term}, 1)[:, None]"
    em.stmt(f"{acc} = {COMBINE[node.op].format(acc=acc, v=term)}")


class RowFactor:
    """A row factor of a GEMM template's left operand moved onto the accumulator.

    `find` looks for it: a product `x * broadcast(r)` with r one value per row (size 1 on its last
    axis) computed from the kernel's reductions by elementwise work alone, whose result reaches the
    matmul's left operand through products, float casts and reshapes, each read by the next alone.
    `intercept` (the emitter's, for that product) loads x alone and notes where r is read; `walk`,
    inside the K loop, accumulates r's reductions from the same tiles; `apply`, after it, scales the
    accumulator by r."""

    def __init__(self, graph: Graph, producer: dict[str, Node], mul: Node, factor: str, other: str,
                 statistics: list[Node], shift: int = 0) -> None:
        self.graph, self.mul, self.factor, self.other = graph, mul, factor, other
        self.statistics = statistics  # the reductions r is computed from
        self.shift = shift  # the operand is scaled by 2**-shift, the accumulator by 2**shift
        self.producer = producer  # the kernel's nodes (its free prologue too) by what they write
        self.at: tuple[list[Ix], frozenset[str]] | None = None  # r's row index, and the operand's mask
        self.given: tuple[tuple[str, ...], frozenset[str], Val] | None = None  # what `intercept` returned, where
        self.accs: dict[str, str] = {}  # reduction name -> its accumulator

    @classmethod
    def find(cls, graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node) -> "RowFactor | None":
        producer = {o: n for n in nodes for o in n.outputs}
        readers: dict[str, int] = {}
        for n in nodes:
            for i in n.inputs:
                readers[i] = readers.get(i, 0) + 1
        k = graph.types[root.inputs[0]].shape[-1]
        t = root.inputs[0]
        if _reaches(producer, root.inputs[1], t):
            return None  # B is computed from A (x @ x^T): the factor would leave both operands
        path: list[tuple[Node, str]] = []  # the products on the way, each with its other operand
        while True:
            n = producer.get(t)
            if n is None or (t != root.inputs[0] and (readers.get(t, 0) != 1 or t in outputs or t in graph.outputs)):
                return None
            if n.op == Prim.MUL.value:
                a, b = n.inputs
                for other, f in ((a, b), (b, a)):
                    r = _row_factor(graph, producer, readers, f)
                    stats = None if r is None else _statistics(graph, producer, r, k)
                    if stats is not None:
                        shift = _shift(graph, producer, other, path, graph.types[root.inputs[0]].dtype)
                        return None if shift is None else cls(graph, producer, n, r, other, stats, shift)
                computed = [x for x in (a, b) if x in producer and producer[x].op != Prim.BROADCAST.value]
                if len(computed) != 1:
                    return None  # two computed factors: which one carries the row factor is not followed
                path.append((n, b if computed[0] == a else a))
                t = computed[0]
            elif n.op == Prim.RESHAPE.value or (n.op == Prim.CAST.value and graph.types[t].dtype.is_float
                                                and graph.types[n.inputs[0]].dtype.is_float):
                t = n.inputs[0]
            else:
                return None

    def intercept(self, em, index: Sequence[Ix], mask: frozenset[str]) -> Val:
        """The product at `index` without its row factor (the first place it is read; elsewhere whole)."""
        exprs = tuple(i.expr for i in index)
        if self.given is not None and self.given[:2] == (exprs, mask):
            return self.given[2]
        bc = self.producer[self.mul.inputs[1] if self.other == self.mul.inputs[0] else self.mul.inputs[0]]
        ins, out = self.graph.types[bc.inputs[0]].shape, self.graph.types[bc.outputs[0]].shape
        rows = [Ix.of(0) if n == 1 and m != 1 else i for i, n, m in zip(index, ins, out)]
        if self.at is not None or not _deps(rows) <= ROWS:
            del em.intercepts[self.mul.outputs[0]]
            return em.value(self.mul.outputs[0], index, mask)
        self.at = (rows, mask)
        v = em.value(self.other, index, mask)
        if self.shift:
            v = Val(em.emit(f"{v.expr} * {2.0 ** -self.shift!r}", v.deps), v.dtype, v.deps)
        self.given = (exprs, mask, v)
        return v

    def walk(self, t: Tile, rk: Ix) -> None:
        """Inside the K loop at index `rk`: each reduction r reads, accumulated from this step's tiles."""
        if self.at is None:
            return
        em, g = t.em, self.graph
        rows, mask = self.at
        for node in self.statistics:
            shape = g.types[node.inputs[0]].shape
            ident, acc_type = reduction_identity(node.op, g.types[node.inputs[0]].dtype)
            acc = self.accs[node.name] = em.fresh("stat")
            # One value per row, reduced at each step: a [BLOCK_M, BLOCK_K] float32 sum kept across the
            # walk would hold as many registers again as the accumulators (64 a thread at 64 x 128 on 4 warps)
            per = "BLOCK_M" if "m" in _deps(rows) else "1"
            with em.hoisted(0):
                em.stmt(f"{acc} = tl.full([{per}, 1], {ident}, {acc_type})")
            _accumulate(em, g, node, acc, _walk_coords(rows, shape, node.attrs["axes"], rk), mask, per)

    def apply(self, t: Tile, accs: Sequence[str] = ("acc",)) -> None:
        """After the K loop: the reductions' rows, r from them, and each accumulator scaled by r."""
        if self.at is None:
            return
        em, g = t.em, self.graph
        rows, _ = self.at
        exprs = tuple(i.expr for i in rows)
        for node in self.statistics:
            res = em.emit(row_result(g, node, self.accs[node.name]), _deps(rows), "row")
            em.rows[(node.outputs[0], exprs)] = Val(res, g.types[node.outputs[0]].dtype, _deps(rows))
        r = em.value(self.factor, rows, frozenset(c for c in t.mmask))
        scale = f" * {2.0 ** self.shift!r}" if self.shift else ""
        for acc in accs:
            em.stmt(f"{acc} = {acc} * {r.expr}{scale}  # the row factor {self.factor} of {self.mul.name}, deferred")


def _deps(index: Sequence[Ix]) -> frozenset[str]:
    return frozenset().union(*(i.deps for i in index))


def _reaches(producer: dict[str, Node], t: str, target: str) -> bool:
    """Is `target` among the kernel's tensors that `t` is computed from (or `t` itself)?"""
    todo, seen = [t], set()
    while todo:
        u = todo.pop()
        if u == target:
            return True
        if u in seen or u not in producer:
            continue
        seen.add(u)
        todo.extend(producer[u].inputs)
    return False


def _row_factor(graph: Graph, producer: dict[str, Node], readers: dict[str, int], f: str) -> str | None:
    """r when `f` = broadcast(r), read once, with r of size 1 on a last axis that `f` widens."""
    bc = producer.get(f)
    if bc is None or bc.op != Prim.BROADCAST.value or readers.get(f, 0) != 1:
        return None
    r = bc.inputs[0]
    rs, fs = graph.types[r].shape, graph.types[f].shape
    return r if len(rs) == len(fs) and rs[-1] == 1 and fs[-1] > 1 and r in producer else None


def _statistics(graph: Graph, producer: dict[str, Node], r: str, k: int) -> list[Node] | None:
    """The reductions row factor `r` is computed from, by elementwise work on r's shape (constants
    and broadcast scalars beside), each over K elements (the K loop's walk); None if r is not."""
    shape = graph.types[r].shape
    found: dict[str, Node] = {}
    todo, seen = [r], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        n = producer.get(t)
        if n is None:
            if t not in graph.constants:
                return None  # read from memory: not this kernel's statistic
            continue
        p = Prim(n.op)
        if p in REDUCTIONS:
            if graph.types[t].shape != shape or prod(graph.types[n.inputs[0]].shape[d] for d in n.attrs["axes"]) != k:
                return None
            found[n.name] = n
        elif p is Prim.BROADCAST and graph.types[n.inputs[0]].numel == 1:
            todo.extend(n.inputs)
        elif (p in UNARY or p in BINARY or p is Prim.FILL) and graph.types[t].shape == shape:
            todo.extend(n.inputs)
        elif p is Prim.RESHAPE and graph.types[t].numel == 1:
            todo.extend(n.inputs)
        else:
            return None
    return list(found.values()) if found else None


FP16_MAX = 65504.0


def _shift(graph: Graph, producer: dict[str, Node], other: str, path: list[tuple[Node, str]],
           dtype: DType) -> int | None:
    """The power of two that keeps a float16 operand without its row factor in range: 0 for other
    types; None where `_bound` finds no bound."""
    if dtype is not DType.FLOAT16:
        return 0
    bound = _bound(graph, producer, other, 0)
    for _, f in path:
        fb = _bound(graph, producer, f, 0)
        if bound is None or fb is None:
            return None
        bound *= fb
    if bound is None or not math.isfinite(bound):
        return None
    return max(0, math.ceil(math.log2(bound / FP16_MAX))) if bound > 0 else 0


def _bound(graph: Graph, producer: dict[str, Node], t: str, depth: int) -> float | None:
    """A bound on |t| for any float16 inputs, from its computation: a stored float16 value (a
    residual stream) is within float16's range; constants are what they are; sums, differences,
    products, casts, layout and a row sum's mean follow. None where the structure gives none."""
    if t in graph.constants:
        v = np.asarray(graph.constants[t], dtype=np.float64)
        return float(np.abs(v).max()) if v.size else 0.0
    n = producer.get(t)
    if n is None:
        return FP16_MAX if graph.types[t].dtype is DType.FLOAT16 else None
    if depth > 32:
        return None
    p = Prim(n.op)
    if p is Prim.FILL:
        return abs(float(n.attrs["value"]))
    ins = [_bound(graph, producer, i, depth + 1) for i in n.inputs]
    if any(b is None for b in ins):
        return None
    if p in (Prim.RESHAPE, Prim.BROADCAST, Prim.TRANSPOSE, Prim.SLICE, Prim.NEG) or \
            (p is Prim.CAST and graph.types[t].dtype.is_float):
        return ins[0]
    if p in (Prim.ADD, Prim.SUB):
        return ins[0] + ins[1]
    if p is Prim.MUL:
        return ins[0] * ins[1]
    if p is Prim.REDUCE_SUM:
        return ins[0] * prod(graph.types[n.inputs[0]].shape[d] for d in n.attrs["axes"])
    return None
