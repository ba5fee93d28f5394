"""GEMM-chain template: linear -> memory-bound -> linear as one generated Triton kernel (MCFuser, Bolt).

Form. The kernel computes S = A @ B ([..., M, K] @ [..., K, L]), a middle of elementwise,
broadcast and row-reduction primitives from S to P ([..., M, L], the same shape), then
O = P @ V ([..., M, L] @ [..., L, N]) and an epilogue on O. A program owns BLOCK_M rows and
BLOCK_N output columns of one batch entry. It walks L in BLOCK_L chunks: each chunk of S is a
`tl.dot` over K (one step when BLOCK_K covers K: the A row tile is then loaded once, before the
walk), the middle runs on it in registers through the shared emitter (S is a known value at the
chunk's indices), and the chunk of P is multiplied into the output accumulator. S and P never
reach memory: that round trip, and the launches around it, are what fusing the chain saves.

Row reductions. A reduction of the middle (softmax's max and sum) needs its whole row before
the values that read it, so the walk over L repeats, one pass per level of reductions that
read reductions (recomputing the S chunks: K-step work traded for memory traffic, as a looped
row reduction does in `codegen/kernels.py`). One exception merges two passes: a level-1 max
m that the next level reads only through exp(x - m), with every accumulation of that level a
sum of values proportional to exp(-m) (a row sum, the product P @ V). Such sums may use any
running value of m and be rescaled by exp(m_old - m_new) when it grows, which is exact, so
max and sums share one pass (the online softmax). The rewrite that puts attention in that
form is a rule over primitives (`rewrite/deferred.py`: the division by the row sum moved after
the product); the generator only checks the proportionality, for any chain.

Rows whose every value is -inf (a fully masked row) keep the running max at 0 for the shift,
so exp gives 0 rather than NaN, as long as any value of the row is finite.

Row views. The middle may regroup S's rows through reshapes that keep its last axis (a row
view: [*R', L] with prod(R') = batch * M): fission folds the batch of a product whose right
operand is shared by every batch entry into M (multi-query attention: q [1, H, M, D] against
k [1, 1, L, D] is one [H*M, D] @ [D, L] product), and the softmax between the products runs on
[1, H, M, L]. A reduction over a view's last axis is a reduction over S's rows: the walk reads
its input at the view's coordinates of the chunk and registers its result at the view's
coordinates of the program's rows, and the index maps undo the regrouping where the middle
reads S or the row values (`index.reshape_index` keeps the provenance of split coordinates).

Shared operands. An operand broadcast along the batch (grouped-query attention: K and V of
[1, Hkv, L, D] repeated to H heads, by a BROADCAST that fission or an Expand spells out) is part
of the operand's prologue, so the emitter reads it in place: the broadcast is only index
arithmetic (query head `pid_b` reads K/V head `pid_b // G`, G = H / Hkv), and the shared K and V
are never copied.

Outputs are the second product and its epilogue, one value per element of O.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from math import prod
from typing import Sequence

from tessera.codegen import index as ix
from tessera.codegen.index import Ix
from tessera.codegen.kernels import COMBINE, REDUCE_IDENT, REDUCE_OPS, row_result
from tessera.codegen.kernels import ChainSchedule, KernelBody, KernelSource, Launch, sanitize
from tessera.codegen.tile import (GRID_Y_MAX, MIN_BLOCK, TF32_ROUND, Tile, cdiv, check_outputs, dot_math, dot_operand,
                                  sum_slices,
                                  jit_function, pow2, store_outputs)
from tessera.codegen.triton_ops import Unsupported, Val, module_source
from tessera.ir.graph import Graph, Node, scalar_constant
from tessera.ir.prims import Category, Prim

CHAIN_CONSTS = ("BLOCK_M", "BLOCK_N", "BLOCK_L", "BLOCK_K")
# Primitives that only re-index (a broadcast of the row max, a cast between storage types).
_PASS = {Prim.BROADCAST.value, Prim.RESHAPE.value, Prim.CAST.value}


@dataclass(frozen=True)
class ChainProblem:
    """A chain's two matmuls and their extents: S = A @ B is [batch, M, L] over K, O = P @ V is
    [batch, M, N] over L."""

    first: Node
    second: Node
    batch: int
    m: int
    k: int
    l: int
    n: int
    middle: tuple[Node, ...]  # computed from S but not from O (the first product excluded)


def _reach(nodes: Sequence[Node], src: str) -> set[str]:
    """Tensors of `nodes` computed from `src` (itself included)."""
    reach = {src}
    grew = True
    while grew:
        grew = False
        for n in nodes:
            if n.outputs[0] not in reach and any(t in reach for t in n.inputs):
                reach.update(n.outputs)
                grew = True
    return reach


def chain_roots(nodes: Sequence[Node]) -> tuple[Node, Node] | None:
    """(first, second): a kernel's two matmuls where the second's left operand is computed from the
    first's result; None for any other kernel."""
    mats = [n for n in nodes if n.op == Prim.MATMUL.value]
    if len(mats) != 2 or any(Prim(n.op).category is Category.LINEAR and n not in mats for n in nodes):
        return None
    for first, second in (mats, mats[::-1]):
        if second.inputs[0] in _reach(nodes, first.outputs[0]):
            return first, second
    return None


def _row_view(shape: Sequence[int], s: Sequence[int]) -> bool:
    """Is `shape` a row view of S's shape `s` (its rows regrouped, the same last axis)?"""
    return len(shape) >= 1 and shape[-1] == s[-1] and prod(shape[:-1]) == prod(s[:-1])


def chain_problem(graph: Graph, nodes: Sequence[Node]) -> ChainProblem:
    """The chain of a kernel; raises `Unsupported` (with the reason) when the kernel has no chain form."""
    roots = chain_roots(nodes)
    if roots is None:
        raise Unsupported("a GEMM chain needs two matmuls, the second's left operand computed from the first")
    first, second = roots
    s, p, v, o = first.outputs[0], second.inputs[0], second.inputs[1], second.outputs[0]
    ts, tp, to = graph.types[s], graph.types[p], graph.types[o]
    from_s = _reach(nodes, s)
    if v in from_s:
        raise Unsupported(f"{second.name}: its right operand is computed from {first.name}")
    if tp.shape != ts.shape or to.shape[:-2] != ts.shape[:-2]:
        raise Unsupported(f"{second.name}: its left operand {tp} or result {to} is not shaped as {first.name}'s "
                          f"result {ts}")
    ranks = {graph.types[t].rank for t in (*first.inputs, v)}
    if ranks != {ts.rank}:
        raise Unsupported("a GEMM chain's operands have the rank of its products (no implied batch broadcast)")
    after = _reach(nodes, o)
    # The middle: what S computes before O exists (P, and the row values the epilogue reads, such as a
    # softmax's deferred row sum). A value of S that reached no output would be dead: check_outputs
    # stops outputs that are not computed from O.
    middle = tuple(n for n in nodes if n is not first and n.outputs[0] in from_s and n.outputs[0] not in after)
    for n in middle:
        if n.op in REDUCE_OPS:
            xt = graph.types[n.inputs[0]]
            if not xt.dtype.is_float:  # the chain accumulates its row values in float32
                raise Unsupported(f"{n.name}: an integer reduction between a chain's products")
            if not _row_view(xt.shape, ts.shape) or tuple(n.attrs["axes"]) != (xt.rank - 1,) \
                    or graph.types[n.outputs[0]].rank != xt.rank:
                raise Unsupported(f"{n.name}: a chain's reductions run over the rows of {first.name}'s result "
                                  f"(its last axis, keeping dims; its rows may be regrouped)")
        elif Prim(n.op).category is not Category.ELEMENTWISE and n.op not in (Prim.BROADCAST.value,
                                                                              Prim.RESHAPE.value):
            raise Unsupported(f"{n.name}: {n.op} cannot sit between a chain's products")
    for n in nodes:
        if n.op in REDUCE_OPS and n not in middle:
            raise Unsupported(f"{n.name}: a chain's reductions are in its middle, over the first product's rows")
    *batch, m, l = ts.shape
    return ChainProblem(first, second, prod(batch), m, graph.types[first.inputs[0]].shape[-1], l, to.shape[-1],
                        middle)


# The tiling menu (MCFuser's tiling expressions, cut to a problem). Rows and intermediate columns
# per program step; K is either walked whole (flat: A's row tile loaded once) or in steps (deep);
# N is either one tile (flat) or split over programs that each recompute S (deep).
BLOCKS_M = (16, 32, 64, 128)
BLOCKS_L = (16, 32, 64, 128)
DEEP_K = (32, 64, 128)
MAX_FLAT = 256  # the widest K or N held as one tile
WARPS = (4, 8)
STAGES = (1, 2, 3)
# Programs sharing one tile's walk over L (a middle without row reductions only): few output tiles
# leave most SMs idle, and each program of a flat tiling re-reads all of B and V.
SPLITS_L = (1, 2, 4, 8, 16)
REGISTERS_PER_THREAD = 255
REGISTER_SHARE = 0.75  # of a thread's registers for live tiles (the rest: addresses, temporaries)


@dataclass(frozen=True)
class ChainSpace:
    """A chain's schedule space: every tiling the menu spans, and what the pruning rules keep."""

    size: int  # before pruning
    kept: tuple[ChainSchedule, ...]
    rejected: dict[str, int]  # pruning rule -> schedules it removed


# Schedules that Triton 3.6 compiles into kernels that fault on Hopper (an illegal memory access, now
# and then or every time, launched directly or in a CUDA graph), with no out-of-bounds address in them: the
# interpreter runs the same sources within bounds and right (`scripts/fault_check.py`). Of every
# chain timing kept in scripts/results (H100 and H200, sessions 13-61), 165 of the 168 faults were
# schedules whose output block is 32 columns wide with 64 rows or more per warp group (4 warps per
# group), so that each group's second product is a wgmma of N = 32: 165 faults in 3898 timings of
# such schedules, 3 in 10246 of all others. m64 n32 l128 k64 w4 s3 once timed clean for a GPT-2
# attention kernel and then faulted in the plan (session 26); a gpt_neox attention chain at m64 n32
# l128 k64 w4 faulted in 300 direct launches and when timed, with PDL and without, at 1 and 2
# stages, and ran at 8 warps or 64 columns (session 62). Triton's issues 10486, 10573 and 11366
# report the same for kernels of several dots with a 32-wide one at 4 warps.


def known_fault(block_m: int, block_n: int, num_warps: int) -> bool:
    """Whether Triton's Hopper code for this chain tile is known to fault (above): kept out of
    every space. At 64 rows the same tile at 8 warps (two groups of 16 columns) or 64 columns wide
    stays."""
    return block_n == 32 and block_m >= 64 * max(1, num_warps // 4)


def chain_schedules(cp: ChainProblem, itemsize: int, smem_bytes: int = 227 << 10) -> ChainSpace:
    """The problem's tilings, pruned by MCFuser's four rules:

    - deduplication: blocks past an extent's next power of two are the same schedule as that
      power (they only add masked lanes), so they are not enumerated twice;
    - padding: a block more than twice an extent's power of two wastes most of its lanes;
    - on-chip intermediates: the S chunk, the output accumulator and A's row tile (flat K) live in
      registers, and must fit the threads' share;
    - shared memory: the pipelined operand stages (B's and V's chunks, A's tile) must fit the block's
      shared memory (`Device.smem_bytes`);

    and drops the schedules Triton is known to miscompile (`known_fault`).
    """
    p2 = pow2
    ks = [max(MIN_BLOCK, p2(cp.k))] if p2(cp.k) <= MAX_FLAT else []
    ks += [k for k in DEEP_K if k < p2(cp.k)]
    ns = [max(MIN_BLOCK, p2(cp.n))] if p2(cp.n) <= MAX_FLAT else []
    ns += [n for n in (32, 64, 128, 256) if n < p2(cp.n) and n <= MAX_FLAT]
    splits = SPLITS_L if splittable(cp) else (1,)
    full = [(bm, bn, bl, bk, w, st, sp) for bm in BLOCKS_M for bn in ns for bl in BLOCKS_L for bk in ks
            for w in WARPS for st in STAGES for sp in splits]
    rejected = {"duplicate": 0, "padding": 0, "registers": 0, "shared memory": 0, "known fault": 0}
    kept: dict[ChainSchedule, None] = {}
    for bm, bn, bl, bk, w, st, sp in full:
        cm, cl = min(bm, max(MIN_BLOCK, p2(cp.m))), min(bl, max(MIN_BLOCK, p2(cp.l)))
        if (cm, cl) != (bm, bl) or split_chunk(cp.l, bl, sp) is None:
            rejected["duplicate"] += 1
            continue
        s = ChainSchedule(bm, bn, bl, bk, w, st, sp)
        if known_fault(bm, bn, w):
            rejected["known fault"] += 1
            continue
        flat_k = bk >= cp.k
        live = bm * bn + bm * bl + (bm * bk * itemsize // 4 if flat_k else 0)  # 32-bit values
        if live > REGISTER_SHARE * REGISTERS_PER_THREAD * 32 * w:
            rejected["registers"] += 1
            continue
        smem = st * (bk * bl + bl * bn) * itemsize + (bm * bk * itemsize if flat_k else st * bm * bk * itemsize)
        if smem > smem_bytes:
            rejected["shared memory"] += 1
            continue
        if bk > 2 * p2(cp.k) or bn > 2 * p2(cp.n):
            rejected["padding"] += 1
            continue
        kept[s] = None
    return ChainSpace(len(full), tuple(kept), rejected)


def k_pieces(k: int) -> tuple[int, ...]:
    """The widths of a K walked whole: one power of two, or for a K past a power of two (a head
    dim of 80) the powers of two of its 16-rounded extent (64 + 16), so the dots skip the padding
    to 128; at most three pieces."""
    whole = max(MIN_BLOCK, pow2(k))
    rounded = cdiv(k, MIN_BLOCK) * MIN_BLOCK
    pieces = tuple(1 << b for b in range(rounded.bit_length() - 1, -1, -1) if rounded >> b & 1)
    return pieces if whole != rounded and len(pieces) <= 3 else (whole,)


def splittable(cp: ChainProblem) -> bool:
    """Can programs share a tile's walk over L? Only when no row reduction reads the whole walk."""
    return not any(n.op in REDUCE_OPS for n in cp.middle)


def split_chunk(l: int, block_l: int, split: int) -> int | None:
    """The L columns each of `split` programs walks (whole blocks); None when `split` slices of
    whole blocks do not cover L exactly `split` times (the same schedule as a smaller split)."""
    chunk = cdiv(cdiv(l, split), block_l) * block_l
    return chunk if cdiv(l, chunk) == split else None


class _Chain:
    """Shared state of one chain generation."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], s: ChainSchedule,
                 precision: str) -> None:
        self.graph, self.nodes, self.outputs, self.s = graph, list(nodes), list(outputs), s
        self.cp = chain_problem(graph, nodes)
        cp = self.cp
        if cp.batch > GRID_Y_MAX:
            raise Unsupported(f"{cp.second.name}: {cp.batch} batch entries exceed the grid")
        for b in (s.block_m, s.block_n, s.block_l, s.block_k):
            if b < MIN_BLOCK or b & (b - 1):
                raise Unsupported(f"chain blocks must be powers of two >= {MIN_BLOCK}: {s}")
        g = graph
        self.math1 = dot_math(*(g.types[t].dtype for t in cp.first.inputs), precision, f"{cp.first.name}: a chain")
        self.math2 = dot_math(*(g.types[t].dtype for t in cp.second.inputs), precision, f"{cp.second.name}: a chain")
        check_outputs(graph, nodes, outputs, cp.second.outputs[0], "second matmul", "GEMM-chain")
        self.passes, self.online = self._passes()
        self.chunk = cp.l  # the L columns one program walks
        if s.split_l > 1:
            if not splittable(cp):
                raise Unsupported(f"{cp.second.name}: a row reduction reads the whole walk over L; it cannot split")
            chunk = split_chunk(cp.l, s.block_l, s.split_l)
            if chunk is None:
                raise Unsupported(f"{cp.second.name}: L {cp.l} is not {s.split_l} slices of {s.block_l}-column steps")
            self.chunk = chunk

    # ---- passes over L ---------------------------------------------------------------------
    def _passes(self) -> tuple[list[list[Node]], Node | None]:
        """The walks over L, each with the accumulations it makes (reductions, the second product),
        and the max merged online into the next level's walk, if any."""
        cp = self.cp
        reds = [n for n in cp.middle if n.op in REDUCE_OPS]
        by_out = {n.outputs[0]: n for n in reds}
        producer = {o: n for n in self.nodes for o in n.outputs}

        def feeding(t: str) -> list[Node]:  # the reductions t is computed from, through middle nodes
            found, todo, seen = [], [t], set()
            while todo:
                x = todo.pop()
                if x in seen or x not in producer or producer[x] is cp.first:
                    continue
                seen.add(x)
                if x in by_out and x != t:
                    found.append(by_out[x])
                    continue
                todo.extend(i for i in producer[x].inputs if i)
            return found

        depth: dict[str, int] = {}
        order = {n.name: i for i, n in enumerate(self.nodes)}
        for n in sorted(reds, key=lambda n: order[n.name]):
            depth[n.name] = 1 + max((depth[r.name] for r in feeding(n.inputs[0])), default=0)
        depth[cp.second.name] = 1 + max((depth[r.name] for r in feeding(cp.second.inputs[0])), default=0)
        accs = reds + [cp.second]
        levels = sorted(set(depth.values()))
        passes = [[n for n in accs if depth[n.name] == lv] for lv in levels]
        if len(passes) == 2 and len(passes[0]) == 1 and passes[0][0].op == Prim.REDUCE_MAX.value:
            mx = passes[0][0]
            from_m = _reach(self.nodes, mx.outputs[0])
            if all(self._degree(n.inputs[0], mx.outputs[0], from_m, producer, {}) == 1 for n in passes[1]):
                return [passes[0] + passes[1]], mx
        return passes, None

    def _degree(self, t: str, m: str, from_m: set[str], producer: dict[str, Node],
                memo: dict[str, int | None]) -> int | None:
        """How `t` depends on the row max `m` (`from_m`: what is computed from it): 0 not at all, 1 as
        c * exp(-m) with c free of m, None otherwise."""
        if t in memo:
            return memo[t]
        n = producer.get(t)
        d: int | None
        if t == m:
            d = None
        elif t not in from_m:
            d = 0
        elif n.op == Prim.EXP.value:
            x = producer.get(n.inputs[0])
            d = 1 if x is not None and x.op == Prim.SUB.value and self._degree(x.inputs[0], m, from_m, producer, memo) == 0 \
                and self._is_row(x.inputs[1], m, producer) else None
        elif n.op in _PASS:
            d = self._degree(n.inputs[0], m, from_m, producer, memo)
        elif n.op == Prim.MUL.value:
            a, b = (self._degree(i, m, from_m, producer, memo) for i in n.inputs)
            d = None if a is None or b is None or a + b > 1 else a + b
        elif n.op == Prim.DIV.value:
            a, b = (self._degree(i, m, from_m, producer, memo) for i in n.inputs)
            d = a if b == 0 else None
        elif n.op == Prim.WHERE.value and self._zeroes_nans(n, producer):
            d = self._degree(n.inputs[2], m, from_m, producer, memo)  # homogeneous: NaN and 0 scale alike
        else:
            d = None
        memo[t] = d
        return d

    def _zeroes_nans(self, n: Node, producer: dict[str, Node]) -> bool:
        """Is `n` where(isnan(x), 0, x), 0 a constant (through broadcasts and reshapes)?"""
        cond, z, x = n.inputs
        test = producer.get(cond)
        if test is None or test.op != Prim.ISNAN.value or test.inputs[0] != x:
            return False
        return scalar_constant(self.graph, producer, z) == 0.0

    def _is_row(self, t: str, m: str, producer: dict[str, Node]) -> bool:
        """Is `t` the row max `m` itself, through broadcasts and reshapes?"""
        while t != m:
            n = producer.get(t)
            if n is None or n.op not in (Prim.BROADCAST.value, Prim.RESHAPE.value):
                return False
            t = n.inputs[0]
        return True

    # ---- one walk ----------------------------------------------------------------------------
    def walk(self, t: Tile, group: list[Node]) -> None:
        em, cp, g = t.em, self.cp, self.graph
        row = frozenset({"m"}) | (frozenset({"b"}) if t.nbatch > 1 else frozenset())
        rows = [*t.batch, t.rm, Ix.of(0)]  # the program's rows of S, as [*batch, M, 1]
        accs: dict[str, str] = {}
        for n in group:
            if n is cp.second:
                em.stmt("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
            else:
                accs[n.name] = em.fresh("acc")
                em.stmt(f"{accs[n.name]} = tl.full([BLOCK_M, 1], {REDUCE_IDENT[n.op]}, tl.float32)")
        tag = em.fresh("l")
        vtag = tag + "v"
        if self.chunk == cp.l:
            em.push(f"for {tag} in range(0, {cp.l}, BLOCK_L):", tag)
        else:  # this program's slice of L (the last may be shorter)
            lo = f"pid_s * {self.chunk}"
            hi = f"{lo} + {self.chunk}" if cp.l % self.chunk == 0 else f"tl.minimum({lo} + {self.chunk}, {cp.l})"
            em.push(f"for {tag} in range({lo}, {hi}, BLOCK_L):", tag)
        em.stack[-1].avail = em.stack[-1].avail | {vtag}
        coords, lmask, lmask_v, rlv = self._chunk(t, tag, vtag, row)
        mask = t.mmask | lmask
        full = row | {tag}
        alpha = None
        online = self.online if self.online in group else None
        if online is not None:
            mrun = accs[online.name]
            cur = self._row_chunk(t, online, coords, mask, full)
            mnew, msafe, alpha = em.fresh("mx"), em.fresh("mx"), em.fresh("alpha")
            em.stmt(f"{mnew} = tl.maximum({mrun}, {cur})")
            em.stmt(f'{msafe} = tl.where({mnew} == -float("inf"), 0.0, {mnew})')
            em.stmt(f"{alpha} = tl.exp({mrun} - {msafe})")
            em.stmt(f"{mrun} = {mnew}")
            em.rows[self._key(online, rows)] = Val(msafe, g.types[online.outputs[0]].dtype, full)
        for n in group:
            if n is online:
                continue
            if n is cp.second:
                p = self._p_operand(t, em.value(cp.second.inputs[0], coords, mask), lmask, full)
                v = dot_operand(t, g, self.math2, cp.second.inputs[1], [*t.batch, rlv, t.rn],
                                lmask_v | t.nmask, lmask_v, "[BLOCK_L, BLOCK_N]", {vtag, "n"})
                base = f"acc * {alpha}" if alpha else "acc"
                em.stmt(f"acc = tl.dot({p}, {v}, {base}{self.math2.precision})")
                continue
            acc = accs[n.name]
            cur = self._row_chunk(t, n, coords, mask, full)
            if alpha is not None:  # a sum proportional to exp(-max): rescaled as the max grows
                em.stmt(f"{acc} = {acc} * {alpha} + {cur}")
            else:
                em.stmt(f"{acc} = {COMBINE[n.op].format(acc=acc, v=cur)}")
        em.pop()
        # Values computed inside the walk are gone after it (Triton scopes loop bodies).
        em.values = {k: v for k, v in em.values.items() if tag not in v.deps and vtag not in v.deps}
        for n in group:
            if n is not cp.second:
                em.rows[self._key(n, rows)] = Val(accs[n.name], g.types[n.outputs[0]].dtype, row)

    def _view(self, coords: Sequence[Ix], tensor: str) -> list[Ix]:
        """`coords` of S's shape, or of its rows ([*batch, M, 1]), at `tensor`, a row view of either."""
        s = self.graph.types[self.cp.first.outputs[0]].shape
        shape = self.graph.types[tensor].shape
        src = (*s[:-1], shape[-1])
        return list(coords) if tuple(shape) == src else ix.reshape_index(coords, src, shape)

    def _key(self, n: Node, rows: Sequence[Ix]) -> tuple[str, tuple[str, ...]]:
        """Where the emitter finds reduction `n`'s result at the program's `rows`."""
        return n.outputs[0], tuple(i.expr for i in self._view(rows, n.outputs[0]))

    def _row_chunk(self, t: Tile, n: Node, coords: list[Ix], mask: frozenset[str], full: frozenset[str]) -> str:
        """The reduction of this chunk's values of `n`'s input along L, [BLOCK_M, 1]."""
        em = t.em
        v = em.value(n.inputs[0], self._view(coords, n.inputs[0]), mask)
        x = v.expr if not v.is_literal else f"tl.full([BLOCK_M, BLOCK_L], {v.expr}, tl.float32)"
        if not v.is_literal and not full <= v.deps:
            x = f"tl.broadcast_to({x}, [BLOCK_M, BLOCK_L])"
        m = em.mask_expr(mask)
        if m:
            x = f"tl.where({m}, {x}, {REDUCE_IDENT[n.op]})"
        return em.emit(row_result(self.graph, n, x), full, "r")

    def _p_operand(self, t: Tile, p: Val, lmask: frozenset[str], full: frozenset[str]) -> str:
        """The second product's left operand chunk in the dot's type, zero past L."""
        em, mt = t.em, self.math2
        x = p.expr if not p.is_literal else f"tl.full([BLOCK_M, BLOCK_L], {p.expr}, tl.float32)"
        deps = p.deps | full
        if not p.is_literal and not full <= p.deps:
            x = em.emit(f"tl.broadcast_to({x}, [BLOCK_M, BLOCK_L])", deps)
        m = em.mask_expr(lmask)
        if m:
            x = em.emit(f"tl.where({m}, {x}, 0.0)", deps)
        if mt.dot_type != "tl.float32":
            x = em.emit(f"({x}).to({mt.dot_type})", deps)
        if mt.tf32:
            x = em.emit(TF32_ROUND.format(x=x), deps)
        return x

    def _chunk(self, t: Tile, tag: str, vtag: str, row: frozenset[str]
               ) -> tuple[list[Ix], frozenset[str], frozenset[str], Ix]:
        """This walk step's chunk of S, registered as a known value: its coordinates [*batch, rm, rl],
        the L mask along its columns and along V's rows, and V's row index."""
        em, cp, s, g = t.em, self.cp, self.s, self.graph
        ldep, vdep = frozenset({tag}), frozenset({vtag})
        rl = Ix(em.emit(f"{tag} + tl.arange(0, BLOCK_L)[None, :]", ldep, "rl"), None, cp.l, ldep)
        rlv = Ix(em.emit(f"{tag} + tl.arange(0, BLOCK_L)[:, None]", vdep, "rl"), None, cp.l, vdep)
        ragged = cp.l % s.block_l != 0
        lmask = frozenset({em.cond(f"{rl.expr} < {cp.l}", ldep)}) if ragged else frozenset()
        lmask_v = frozenset({em.cond(f"{rlv.expr} < {cp.l}", vdep)}) if ragged else frozenset()
        a_in, b_in = cp.first.inputs
        mt = self.math1
        if s.block_k >= cp.k:  # one K step: A's row tile is the same for every chunk (hoisted)
            sval = ""
            start = 0
            for i, width in enumerate(k_pieces(cp.k)):  # a K of 80 is a 64-wide dot and a 16-wide one
                ka, kb = frozenset({f"ka{i}"}), frozenset({f"kb{i}"})
                at = f"{start} + " if start else ""
                rka = Ix(em.emit(f"{at}tl.arange(0, {width})[None, :]", ka, "rk"), None, cp.k, ka)
                rkb = Ix(em.emit(f"{at}tl.arange(0, {width})[:, None]", kb, "rk"), None, cp.k, kb)
                start += width
                kma = frozenset({em.cond(f"{rka.expr} < {cp.k}", ka)}) if start > cp.k else frozenset()
                kmb = frozenset({em.cond(f"{rkb.expr} < {cp.k}", kb)}) if start > cp.k else frozenset()
                a = dot_operand(t, g, mt, a_in, [*t.batch, t.rm, rka], t.mmask | kma, kma, f"[BLOCK_M, {width}]",
                                {"m"} | ka)
                b = dot_operand(t, g, mt, b_in, [*t.batch, rkb, rl], kmb | lmask, kmb, f"[{width}, BLOCK_L]",
                                kb | ldep)
                sval = em.emit(f"tl.dot({a}, {b}" + (f", {sval}" if sval else "") + f"{mt.precision})", row | ldep,
                               "s")
        else:
            sval = em.fresh("s")
            em.stmt(f"{sval} = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.float32)")
            kt = em.fresh("k")
            em.push(f"for {kt} in range(0, {cp.k}, BLOCK_K):", kt)
            ka, kb = frozenset({kt}), frozenset({kt + "b"})
            em.stack[-1].avail = em.stack[-1].avail | kb
            rka = Ix(em.emit(f"{kt} + tl.arange(0, BLOCK_K)[None, :]", ka, "rk"), None, cp.k, ka)
            rkb = Ix(em.emit(f"{kt} + tl.arange(0, BLOCK_K)[:, None]", kb, "rk"), None, cp.k, kb)
            kma = frozenset({em.cond(f"{rka.expr} < {cp.k}", ka)}) if cp.k % s.block_k else frozenset()
            kmb = frozenset({em.cond(f"{rkb.expr} < {cp.k}", kb)}) if cp.k % s.block_k else frozenset()
            a = dot_operand(t, g, mt, a_in, [*t.batch, t.rm, rka], t.mmask | kma, kma, "[BLOCK_M, BLOCK_K]",
                            {"m"} | ka)
            b = dot_operand(t, g, mt, b_in, [*t.batch, rkb, rl], kmb | lmask, kmb, "[BLOCK_K, BLOCK_L]", kb | ldep)
            em.stmt(f"{sval} = tl.dot({a}, {b}, {sval}{mt.precision})")
            em.pop()
        coords = [*t.batch, t.rm, rl]
        em.known[(cp.first.outputs[0], tuple(i.expr for i in coords))] = \
            Val(sval, g.types[cp.first.outputs[0]].dtype, row | ldep)
        return coords, lmask, lmask_v, rlv


def generate_chain(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], name: str, schedule: ChainSchedule,
                   sources: Sequence[str] = (), precision: str = "fp32") -> KernelSource:
    """The chain template computing `outputs` of a two-matmul kernel (`nodes`: both matmuls, the
    middle, the epilogue and the operands' prologue) under `schedule`.

    Raises `Unsupported` when the kernel has no chain form (see `chain_problem`), or when its
    operands are not fp32/fp16/bf16.
    """
    s = schedule
    ch = _Chain(graph, nodes, outputs, s, precision)
    cp = ch.cp
    main = KernelBody(graph, nodes, outputs)
    oshape = graph.types[cp.second.outputs[0]].shape
    t = Tile(main, oshape, s)
    em = t.em
    em.stack[0].avail = em.stack[0].avail | {f"k{ab}{i}" for ab in "ab" for i in range(len(k_pieces(cp.k)))}
    em.shape_of = lambda deps: ("[BLOCK_M, BLOCK_L]" if any(d.startswith("l") for d in deps)
                                else "[BLOCK_M, BLOCK_N]" if "n" in deps else "[BLOCK_M, 1]")
    for group in ch.passes:
        ch.walk(t, group)
    tiles = cdiv(cp.m, s.block_m) * cdiv(cp.n, s.block_n)
    workspace, extra = 0, []
    if s.split_l > 1:
        workspace = sum_slices(t, "pid_s", s.split_l, cp.batch * cp.m * cp.n, cp.batch * tiles)
        extra = ["pid_s = tl.program_id(2)"]
        summed = Val("tot", graph.types[cp.second.outputs[0]].dtype, frozenset({"b", "m", "n", "fix"}))
        store_outputs(t, graph, outputs, cp.second.outputs[0], t.coords, summed)  # inside the last's block
        t.em.pop()
    else:
        store_outputs(t, graph, outputs, cp.second.outputs[0], t.coords)
    fn = sanitize(name)
    ins = [f"in{i}" for i in range(len(main.inputs))]
    params = ", ".join(ins + (["ws"] if workspace else []) + list(main.out_args.values()))
    meta = (("BLOCK_M", s.block_m), ("BLOCK_N", s.block_n), ("BLOCK_L", s.block_l), ("BLOCK_K", s.block_k),
            ("num_warps", s.num_warps), ("num_stages", s.num_stages))
    src = module_source(_doc(graph, name, ch, main, sources, workspace)
                        + jit_function(fn, params, t, CHAIN_CONSTS, extra))
    grid = (tiles, cp.batch, s.split_l) if s.split_l > 1 else (tiles, cp.batch)
    return KernelSource(fn, src, main.inputs, main.outputs, cp.batch * cp.m * cp.n, cp.l, s,
                        [n.name for n in nodes], launches=[Launch(fn, grid, meta)], workspace=workspace,
                        rounded_inputs=tuple(sorted(main.rounded)))


def _doc(graph: Graph, name: str, ch: _Chain, k: KernelBody, sources: Sequence[str], workspace: int) -> list[str]:
    """The header: both products, the middle, the epilogue, the passes and the roofline."""
    g, cp = graph, ch.cp
    f, sc = cp.first, cp.second
    walks = " + ".join("[" + ", ".join(n.name for n in grp) + "]" for grp in ch.passes)
    doc = [f"# tessera kernel {name}: GEMM-chain template, batch {cp.batch} x M {cp.m}: "
           f"[M, K {cp.k}] @ [K, L {cp.l}] -> middle -> @ [L, N {cp.n}]; {ch.math1.label} x {ch.math2.label} "
           f"products, fp32 accumulation",
           f"# first matmul: {f.name} ({g.types[f.inputs[0]]} @ {g.types[f.inputs[1]]} -> {g.types[f.outputs[0]]})",
           f"# second matmul: {sc.name} ({g.types[sc.inputs[0]]} @ {g.types[sc.inputs[1]]} -> {g.types[sc.outputs[0]]})"]
    doc += textwrap.wrap("middle: " + (", ".join(f"{n.name} ({n.op})" for n in cp.middle) or "none"), 100,
                         initial_indent="# ", subsequent_indent="#   ")
    after = _reach(ch.nodes, sc.outputs[0])
    epi = [n for n in ch.nodes if n is not sc and n.outputs[0] in after]
    doc += textwrap.wrap("epilogue: " + (", ".join(f"{n.name} ({n.op})" for n in epi) or "none"), 100,
                         initial_indent="# ", subsequent_indent="#   ")
    doc.append(f"# walks over L: {walks}" + (f" ({ch.online.name} merged online)" if ch.online else "")
               + (f", split over {ch.s.split_l} programs of {ch.chunk} columns" if ch.s.split_l > 1 else ""))
    if sources:
        doc += textwrap.wrap("ONNX nodes: " + ", ".join(sources), 100, initial_indent="# ", subsequent_indent="#   ")
    doc += [f"# in{i}: {t} {g.types[t]}" + (" (rounded to tf32 once, at load)" if t in k.rounded else "")
            for i, t in enumerate(k.inputs)]
    if workspace:
        doc.append(f"# ws: float32[{workspace}] the slices' partial products, then one arrival counter per tile")
    doc += [f"# {arg}: {t} {g.types[t]}" for t, arg in k.out_args.items()]
    rd = sum(g.types[t].nbytes for t in k.inputs)
    wr = sum(g.types[t].nbytes for t in k.outputs)
    flops = 2 * cp.batch * cp.m * cp.l * (cp.k + cp.n)
    doc.append(f"# work: {flops} FLOP; memory: reads {rd} B, writes {wr} B; the roofline is the larger of the two "
               f"at full rate")
    return doc
