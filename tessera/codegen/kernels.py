"""Generated Triton kernels for memory-intensive candidates.

Two kernel forms cover every legal candidate:

- **pointwise**: one program per `XBLOCK` flat output elements. Outputs of
  different sizes share the grid of the largest, each store masked by its own
  size. Elementwise, layout and broadcast primitives are index arithmetic; a
  pooling window is a loop around the value it reduces.
- **row reduction**: all reductions of the kernel run over the same input
  shape `S` and axes `A` (the candidate rules guarantee it). A program owns
  `XBLOCK` rows (the coordinates off `A`) and walks the `RNUMEL` elements of
  each row. Reductions that read other reductions (layernorm's variance reads
  its mean) go in later passes. *Persistent* schedules hold a whole row in
  registers (`RBLOCK >= RNUMEL`, one pass over memory); *looped* schedules
  stream the row in `RBLOCK` chunks once per pass. Outputs are either per-row
  (the reduced shape, or anything of that many elements) or per-element (as
  many elements as `S`, in its row-major order).

The schedule space is Hidet's: a few block sizes and warp counts fixed by the
hardware, not by the input shape; remainders are masked.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from math import prod
from typing import Sequence

import numpy as np

from tessera.codegen import index as ix
from tessera.codegen.emitter import Emitter, Scope
from tessera.codegen.index import Ix
from tessera.codegen.triton_ops import (COMPUTE, PDL_PARAM, PDL_PROLOGUE, STORAGE, TF32_ROUND, Unsupported, Val, literal,
                                        module_source)
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import REDUCTIONS, Prim

# Bump when generated code changes: it is part of every tuning-database key.
CODEGEN_VERSION = 16  # 2: tiled pointwise schedules; trailing runs of one flat index collapse; 3: storage layouts;
# 4: reduction rows numbered in storage order; 5: GEMM templates with fused epilogues (codegen/gemm.py);
# 6: convolution templates (codegen/conv.py), the template tile shared in codegen/tile.py;
# 7: convolution templates read their constant weight from a K-contiguous copy;
# 8: tf32 templates read constant operands rounded once at load, not in the K loop;
# 9: a library matmul takes a tanh GELU after its bias into cuBLASLt's epilogue (codegen/gelu.py)
# (GEMM-chain templates, codegen/chain.py, came without a bump: they change no existing kernel's code,
# and their schedules have keys of their own, "chain-...");
# 10: a division by a divisor invariant in the dividend's inner loops is a product with its reciprocal
# 11: a GEMM chain's first product over a K walked whole and past a power of two is a dot per
# power-of-two piece (80: 64 + 16), not one padded to 128 (split walks came with new keys, "-p<n>")
# 12: a tf32 GEMM template reads a constant B operand from a K-major copy (wgmma; session 28)
# (split-K GEMM templates in one launch came without a bump: their keys end in "-1l")
# 13: one-element float constants are literals in the source (Graph.scalar_constant; GELU's x**3 as products)
# 14: tf32 rounding through a helper each rounding module defines: one PTX cvt.rna.tf32.f32 per element on the GPU
# 15: a tiled pointwise kernel narrower than its rows runs one tile a program, not a walk of its rows' columns
# 16: constant tables with a closed form in their position are computed, not loaded (ir/tables.py);
# a cast between float16 and bfloat16 rounds (it was taken for a widening)

# Elements one program holds in registers per value (fp32: 16 KiB).
BLOCK_ELEMENTS = 4096
POINTWISE_BLOCKS = (1024, 512, 256, 2048)
LOOPED_RBLOCKS = (1024, 2048, 512)
# Rows whose elements are apart in memory (a reduction over H and W of an NHWC tensor): a block
# spans many rows, which sit side by side, so each load is coalesced across rows.
STRIDED_BLOCKS = ((64, 32), (32, 64), (128, 16), (16, 128))
WARPS = (4, 8, 2)


@dataclass(frozen=True)
class Schedule:
    xblock: int
    rblock: int = 1
    num_warps: int = 4
    persistent: bool = True  # reductions: the whole row in one block

    def to_json(self) -> dict[str, object]:
        return {"xblock": self.xblock, "rblock": self.rblock, "num_warps": self.num_warps,
                "persistent": self.persistent}


@dataclass(frozen=True)
class GemmSchedule:
    """A GEMM template's schedule (`codegen/gemm.py`): the output tile (block_m x block_n), the K
    step, warps and software-pipeline stages, the GROUP_M swizzle of tiles (L2 reuse), and how
    many programs share one tile's K range (split_k; 1: none)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    split_k: int = 1

    def to_json(self) -> dict[str, object]:
        return {"form": "gemm", "block_m": self.block_m, "block_n": self.block_n, "block_k": self.block_k,
                "num_warps": self.num_warps, "num_stages": self.num_stages, "group_m": self.group_m,
                "split_k": self.split_k}


@dataclass(frozen=True)
class ConvSchedule:
    """A convolution template's schedule (`codegen/conv.py`): the output tile (block_m pixels x
    block_n output channels), the K step over input channels and the window (block_k; 0 in the
    direct form, which walks the window without a dot), warps, software-pipeline stages, the
    GROUP_M swizzle of tiles, and how many programs share one tile's K walk (split_k; 1: none)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    split_k: int = 1

    def to_json(self) -> dict[str, object]:
        return {"form": "conv", "block_m": self.block_m, "block_n": self.block_n, "block_k": self.block_k,
                "num_warps": self.num_warps, "num_stages": self.num_stages, "group_m": self.group_m,
                "split_k": self.split_k}


@dataclass(frozen=True)
class ChainSchedule:
    """A GEMM-chain template's schedule (`codegen/chain.py`): a program owns block_m rows and
    block_n output columns of the second product; it walks the intermediate's L columns block_l
    at a time, computing each chunk of the first product over K in block_k steps (block_k >= K:
    the left operand's row tile is loaded once, before the walk), with warps and pipeline stages.
    split_l > 1 splits the walk over that many programs per tile (a middle without row
    reductions): the last to finish sums their partial products. `late`: under programmatic
    dependent launch this kernel launches only as the kernel before it ends, not while it runs
    (that kernel launches with PDL=2, `runtime/executable.pdl_modes`); the same binary, chosen by
    measurement (`cost/measured._neighbours`)."""

    block_m: int
    block_n: int
    block_l: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2
    split_l: int = 1
    late: bool = False

    @property
    def group_m(self) -> int:  # the tile's swizzle (codegen/tile.py): none, programs walk rows
        return 1

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"form": "chain", "block_m": self.block_m, "block_n": self.block_n,
                                  "block_l": self.block_l, "block_k": self.block_k, "num_warps": self.num_warps,
                                  "num_stages": self.num_stages}
        if self.split_l > 1:  # plans written before split L read the same
            doc["split_l"] = self.split_l
        if self.late:
            doc["late"] = True
        return doc


TemplateSchedule = GemmSchedule | ConvSchedule | ChainSchedule
AnySchedule = Schedule | GemmSchedule | ConvSchedule | ChainSchedule


def schedule_from_json(doc: dict[str, object]) -> AnySchedule:
    """The schedule `to_json` wrote (plan.json): a template's carries its "form" ("gemm", "conv", "chain")."""
    d = dict(doc)
    form = d.pop("form", None)
    if form == "gemm":
        return GemmSchedule(**d)  # type: ignore[arg-type]
    if form == "conv":
        return ConvSchedule(**d)  # type: ignore[arg-type]
    if form == "chain":
        return ChainSchedule(**d)  # type: ignore[arg-type]
    return Schedule(**d)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Launch:
    """One launch of a kernel form with launches of its own (a template): the function of
    the source, its grid, and its meta-parameters (constexprs, num_warps, num_stages)."""

    fn: str
    grid: tuple[int, ...]
    meta: tuple[tuple[str, int], ...]


@dataclass
class KernelSource:
    """A generated kernel: Triton source and how to launch it."""

    name: str
    source: str
    inputs: list[str]  # tensors read from memory, in argument order
    outputs: list[str]  # tensors written, after the inputs
    xnumel: int
    rnumel: int
    schedule: AnySchedule
    prims: list[str] = field(default_factory=list)
    tile: tuple[int, int] | None = None  # (rows, columns) when tiled schedules apply (`tile_shape`)
    strided: bool = False  # a reduction whose row elements are not adjacent in memory (`rows_strided`)
    # Templates: their launches, in order (empty: one launch of `name` over `grid` programs), and
    # the float32 elements of a scratch buffer passed between the inputs and the outputs (split-K).
    launches: list[Launch] = field(default_factory=list)
    workspace: int = 0
    # Constants read in another storage order than their type's (tensor -> layout): a convolution
    # template reads its weight K-contiguous. The runtime makes that copy once, at load.
    input_layouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Constants a tf32 template multiplies as they are (no rounding in its K loop): the runtime
    # rounds them to tf32 once, at load (`runtime.buffers.round_tf32`, the same bits).
    rounded_inputs: tuple[str, ...] = ()

    @property
    def grid(self) -> int:
        s = self.schedule
        assert isinstance(s, Schedule), "a template launches by `launches`"
        if self.tile is not None and s.rblock > 1 and not s.persistent:  # one tile a program (`_tiled`)
            return -(-self.xnumel // s.xblock) * -(-self.rnumel // s.rblock)
        return -(-self.xnumel // s.xblock)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


TILES = ((32, 32), (64, 32), (32, 64), (16, 64), (64, 64))  # tiled pointwise: (rows, columns) per block


def schedules(xnumel: int, rnumel: int, tile: tuple[int, int] | None = None, strided: bool = False) -> list[Schedule]:
    """The schedule space of a kernel, the default first. A pointwise kernel that can run tiled
    (`tile_shape` gives its rows and columns) also gets 2-D blocks, after the flat ones. A reduction
    over strided rows (`rows_strided`) starts with blocks of many rows (`STRIDED_BLOCKS`)."""
    if rnumel <= 1:
        flat = [Schedule(min(b, _pow2(xnumel)), 1, w) for b in POINTWISE_BLOCKS for w in WARPS[:2]]
        if tile is None:
            return flat
        rows, cols = tile
        tiled = [Schedule(min(xb, _pow2(rows)), min(cb, _pow2(cols)), w, cb >= cols)
                 for xb, cb in TILES for w in WARPS[:2]]
        return flat + list(dict.fromkeys(tiled))
    out: list[Schedule] = []
    if strided:
        for xb, r in STRIDED_BLOCKS:
            xb = min(xb, _pow2(xnumel))
            out.append(Schedule(xb, min(r, _pow2(rnumel)), 4, r >= rnumel))
    rb = _pow2(rnumel)
    if rb <= BLOCK_ELEMENTS:
        for xb in (max(1, BLOCK_ELEMENTS // rb), max(1, BLOCK_ELEMENTS // rb // 4)):
            xb = min(xb, _pow2(xnumel))
            out.extend(Schedule(xb, rb, w, True) for w in WARPS)
    for r in LOOPED_RBLOCKS:
        if r < rb:
            out.append(Schedule(1, r, 4, False))
    return list(dict.fromkeys(out))


def sanitize(name: str) -> str:
    """A kernel name as a Python identifier."""
    s = re.sub(r"\W", "_", name)
    return s if s[:1].isalpha() else f"k_{s}"


class KernelBody:
    """Shared state of one generation: the emitter and the argument lists (one per generated function)."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], outputs: Sequence[str]) -> None:
        self.graph = graph
        self.nodes = list(nodes)
        produced = {o for n in nodes for o in n.outputs}
        missing = [o for o in outputs if o not in produced]
        if missing:
            raise Unsupported(f"outputs {missing} are not computed by the kernel")
        reads: dict[str, None] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t and t not in produced:
                    reads[t] = None
        self.inputs = list(reads)
        self.outputs = list(outputs)
        self.rounded: set[str] = set()  # constants read pre-rounded to tf32 (KernelSource.rounded_inputs)
        self.layouts: dict[str, tuple[int, ...]] = {}  # constants read in another storage order (input_layouts)
        for t in self.inputs + self.outputs:
            if self.graph.types[t].dtype not in STORAGE:
                raise Unsupported(f"tensor {t} has type {self.graph.types[t].dtype.value}")
        args = {t: f"in{i}" for i, t in enumerate(self.inputs)}
        self.em = Emitter(graph, nodes, args)
        self.out_args = {t: f"out{i}" for i, t in enumerate(self.outputs)}

    def block(self, v: Val, shape: str, need: frozenset[str]) -> str:
        """`v` as a full block: stores need one even when the value is a scalar."""
        if v.is_literal:
            return f"tl.full({shape}, {v.expr}, {COMPUTE[v.dtype]})"
        if not need <= v.deps:
            return f"tl.broadcast_to({v.expr}, {shape})"
        return v.expr

    def store(self, tensor: str, offset: Ix, v: Val, mask: frozenset[str], shape: str,
              need: frozenset[str]) -> None:
        m = self.em.mask_expr(mask)
        value = self.block(v, shape, need)
        if tensor in self.graph.tf32_rounded:  # only tf32 products read it: rounded once, here
            value = self.em.emit(TF32_ROUND.format(x=value), need | v.deps)
        self.em.stmt(f"tl.store({self.out_args[tensor]} + {offset.expr}, {value}"
                     + (f", mask={m})" if m else ")"))


def _pointwise(k: KernelBody, sched: Schedule) -> tuple[list[str], int, int]:
    em = k.em
    xnumel = max(k.graph.types[o].numel for o in k.outputs)
    em.stack[0].avail = frozenset({"x"})
    header = ["pid = tl.program_id(0)", "xindex = pid * XBLOCK + tl.arange(0, XBLOCK)",
              f"xmask = xindex < {xnumel}"]
    em.cond_deps["xmask"] = frozenset({"x"})
    xdep = frozenset({"x"})
    for o in k.outputs:
        t = k.graph.types[o]
        mask = frozenset({"xmask"}) if t.numel == xnumel else frozenset({em.cond(f"xindex < {t.numel}", xdep)})
        # The grid walks each output in its storage order, so stores are contiguous whatever the layout.
        flat = Ix("xindex", None, t.numel, xdep)
        v = em.value(o, ix.unravel_stored(flat, t.shape, t.layout), mask)
        k.store(o, flat, v, mask, "[XBLOCK]", xdep)
    return header, xnumel, 1


def tile_shape(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str]) -> tuple[int, int] | None:
    """(rows, columns) of a pointwise kernel that can run tiled, or None.

    Tiled: a program owns a block of XBLOCK rows by RBLOCK columns of the output (persistent: whole
    rows), so every access is a 2-D block. A kernel that transposes reads its input along the rows while it
    writes along the columns; in 2-D blocks Triton stages the exchange through shared memory and
    both sides stay coalesced, where a flat index reads with a stride. Only kernels with a
    transpose that moves the last axis get the option, and all their outputs must have one shape.
    """
    split = _column_split(graph, nodes, outputs)
    if split is None:
        return None
    shape = graph.types[outputs[0]].shape
    return prod(shape[:split]), prod(shape[split:])


def _column_split(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str]) -> int | None:
    """The first output dim of a tiled kernel's columns (the dims before it make the rows), or None
    where the kernel has no tiled form (`tile_shape`)."""
    shapes = {graph.types[o].shape for o in outputs}
    if len(shapes) != 1 or not all(graph.types[o].plain for o in outputs):
        return None  # tiles write row-major outputs
    (shape,) = shapes
    if len(shape) < 2 or shape[-1] < 2 or prod(shape) // shape[-1] < 2:
        return None
    movers = [n for n in nodes
              if n.op == Prim.TRANSPOSE.value and list(n.attrs["perm"])[-1] != len(n.attrs["perm"]) - 1]
    if not movers:
        return None
    # A reshape may split the transpose's last axis over several output dims ([N, HW, C] -> [N, C, HW]
    # -> [N, C, H, W], segformer_b0's decoder): the columns are then all of them, so that a row is one
    # channel, which the input holds contiguously, and a block's rows read coalesced. With W alone as
    # the columns neither side of a block was: on the H200 its 17 MB kernel ran 35.6 us tiled, 29.2 flat
    # (the roofline: 3.9).
    moved = {graph.types[n.outputs[0]].shape[-1] for n in movers}
    if len(moved) == 1:
        (extent,) = moved
        split = next((d for d in range(1, len(shape) - 1) if prod(shape[d:]) == extent), None)
        if split is not None and prod(shape[:split]) >= 2:
            return split
    return len(shape) - 1


def _tiled(k: KernelBody, sched: Schedule) -> tuple[list[str], int, int]:
    em = k.em
    shape = k.graph.types[k.outputs[0]].shape
    split = _column_split(k.graph, k.nodes, k.outputs)
    assert split is not None
    rows, cols = prod(shape[:split]), prod(shape[split:])
    if sched.persistent and sched.rblock < cols:
        raise Unsupported("persistent tiled schedule with a block narrower than the row")
    xdep = frozenset({"x"})
    em.shape_of = lambda deps: "[XBLOCK, RBLOCK]" if any(d.startswith("r") for d in deps) else "[XBLOCK, 1]"
    tag = em.fresh("r")
    em.stack[0].avail = xdep | {tag}
    if sched.persistent:  # a program owns whole rows
        header = ["pid = tl.program_id(0)", "xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]"]
        cexpr = "tl.arange(0, RBLOCK)[None, :]"
    else:
        # One tile a program, the programs of a row block side by side. A program walking its rows'
        # columns left the grid at rows / XBLOCK: 16 programs for segformer_b0's decoder transposes
        # (256 channel rows of 16384 columns), which ran 5-13x slower tiled than flat on the H200.
        header = ["pid = tl.program_id(0)", f"col_blocks = tl.cdiv({cols}, RBLOCK)",
                  "xindex = (pid // col_blocks) * XBLOCK + tl.arange(0, XBLOCK)[:, None]"]
        cexpr = "(pid % col_blocks) * RBLOCK + tl.arange(0, RBLOCK)[None, :]"
    header.append(f"xmask = xindex < {rows}")
    em.cond_deps["xmask"] = xdep
    dep = frozenset({tag})
    cindex = Ix(em.emit(cexpr, dep, "cindex"), None, cols, dep)
    cmask = em.cond(f"{cindex.expr} < {cols}", dep)
    row = Ix("xindex", None, rows, xdep)
    coords = ix.unravel(row, shape[:split]) + (ix.unravel(cindex, shape[split:]) if split < len(shape) - 1 else [cindex])
    flat = em.index_var(ix.add(ix.mul(row, cols), cindex))
    mask = frozenset({"xmask", cmask})
    for o in k.outputs:
        v = em.value(o, coords, mask)
        k.store(o, flat, v, mask, "[XBLOCK, RBLOCK]", v.deps | flat.deps)
    return header, rows, cols


def _reduction(k: KernelBody, sched: Schedule) -> tuple[list[str], int, int]:
    em, g = k.em, k.graph
    reds = [n for n in k.nodes if n.op in REDUCE_OPS]
    loops = {(g.types[n.inputs[0]].shape, tuple(n.attrs["axes"])) for n in reds}
    if len(loops) != 1:
        raise Unsupported("reductions over different shapes or axes")
    ((shape, axes),) = loops
    outer = [d for d in range(len(shape)) if d not in axes]
    xnumel = prod(shape[d] for d in outer)
    rnumel = prod(shape[d] for d in axes)
    if sched.persistent and sched.rblock < rnumel:
        raise Unsupported("persistent schedule with a block shorter than the row")
    # An output of another size is still per row if it keeps the row dims (InstanceNorm -> ReLU
    # -> Pad writes a padded plane per row): each program then walks that output's own plane.
    planes = {}
    for o in k.outputs:
        t = g.types[o]
        if t.numel in (xnumel, xnumel * rnumel):
            continue
        if t.rank == len(shape) and all(t.shape[d] == shape[d] for d in outer):
            planes[o] = prod(t.shape[d] for d in axes)
            continue
        raise Unsupported(f"output {o} has {t.numel} elements, neither a row ({xnumel}) "
                          f"nor the reduced tensor ({xnumel * rnumel}), and it does not keep the row dims")
    xdep = frozenset({"x"})
    em.stack[0].avail = xdep
    em.shape_of = lambda deps: "[XBLOCK, RBLOCK]" if any(d.startswith("r") for d in deps) else "[XBLOCK, 1]"
    header = ["pid = tl.program_id(0)", "xindex = pid * XBLOCK + tl.arange(0, XBLOCK)[:, None]",
              f"xmask = xindex < {xnumel}"]
    em.cond_deps["xmask"] = xdep
    # Rows are numbered in the storage order of the reduced tensor, so that neighbouring rows of
    # a block are neighbours in memory: over strided rows (H and W of NHWC) that is what makes a
    # [XBLOCK, RBLOCK] load coalesced. Row-major tensors number them as before.
    xorder = _row_order(g, reds, outer)
    xc = ix.unravel(Ix("xindex", None, xnumel, xdep), [shape[d] for d in xorder])
    row_index = [Ix.of(0)] * len(shape)
    for d, c in zip(xorder, xc):
        row_index[d] = c
    # The row's number in the logical (row-major) order, which per-row outputs are indexed by.
    logical_row = (Ix("xindex", None, xnumel, xdep) if xorder == outer
                   else ix.ravel([row_index[d] for d in outer], [shape[d] for d in outer]))
    natural = tuple(i.expr for i in row_index)

    def open_row(tag: str) -> tuple[list[Ix], str]:
        """The element coordinates of the row chunk the current scope walks."""
        if sched.persistent:
            rexpr = "tl.arange(0, RBLOCK)[None, :]"
        else:
            rexpr = f"{tag} + tl.arange(0, RBLOCK)[None, :]"
        dep = frozenset({tag})
        rindex = Ix(em.emit(rexpr, dep, "rindex"), None, rnumel, dep)
        rmask = em.cond(f"{rindex.expr} < {rnumel}", dep)
        coords = list(row_index)
        for d, c in zip(axes, ix.unravel(rindex, [shape[d] for d in axes])):
            coords[d] = c
        return coords, rmask

    def walk() -> tuple[list[Ix], str]:
        tag = em.fresh("r")
        if sched.persistent:
            em.stack[0].avail = em.stack[0].avail | {tag}
        else:
            em.push(f"for {tag} in range(0, {rnumel}, RBLOCK):", tag)
        return open_row(tag)

    # Passes: a reduction goes after every reduction it reads. (Its depth is found from the
    # kernel's own nodes: ordering the whole graph per kernel took a fifth of gpt2's compile.)
    depth: dict[str, int] = {}
    by_out = {n.outputs[0]: n for n in reds}

    def level(n: Node) -> int:
        if n.name not in depth:
            depth[n.name] = 1 + max((level(by_out[t]) for t in _reduce_ancestors(n, k, by_out)), default=0)
        return depth[n.name]

    for n in reds:
        level(n)
    persistent_coords: tuple[list[Ix], str] | None = walk() if sched.persistent else None
    for level in sorted(set(depth.values())):
        group = [n for n in reds if depth[n.name] == level]
        accs = {}
        if not sched.persistent:
            for n in group:
                accs[n.name] = em.fresh("acc")
                ident, acc_type = reduction_identity(n.op, g.types[n.inputs[0]].dtype)
                em.stmt(f"{accs[n.name]} = tl.full([XBLOCK, RBLOCK], {ident}, {acc_type})")
        coords, rmask = persistent_coords if persistent_coords else walk()
        mask = frozenset({"xmask", rmask})
        for n in group:
            v = em.value(n.inputs[0], coords, mask)
            if not v.dtype.is_float and not v.is_literal:  # a closed-form index table is int32 arithmetic
                v = Val(f"({v.expr}).to(tl.int64)", v.dtype, v.deps)
            m = em.mask_expr(mask)
            if sched.persistent:
                term = f"tl.where({m}, {v.expr}, {reduction_identity(n.op, g.types[n.inputs[0]].dtype)[0]})"
                res = em.emit(row_result(g, n, term), xdep, "row")
            else:
                acc = accs[n.name]
                em.stmt(f"{acc} = tl.where({m}, {COMBINE[n.op].format(acc=acc, v=v.expr)}, {acc})")
            if sched.persistent:
                em.rows[(n.outputs[0], natural)] = Val(res, g.types[n.outputs[0]].dtype, xdep)
        if not sched.persistent:
            em.pop()
            for n in group:
                res = em.emit(row_result(g, n, accs[n.name]), xdep, "row")
                em.rows[(n.outputs[0], natural)] = Val(res, g.types[n.outputs[0]].dtype, xdep)
    per_element = [o for o in k.outputs if g.types[o].numel != xnumel and o not in planes]
    if per_element:
        coords, rmask = persistent_coords if persistent_coords else walk()
        mask = frozenset({"xmask", rmask})
        for o in per_element:
            t = g.types[o]
            oc = ix.reshape_index(coords, shape, t.shape)
            flat = em.index_var(ix.ravel_stored(oc, t.shape, t.layout))
            v = em.value(o, oc, mask)
            k.store(o, flat, v, mask, "[XBLOCK, RBLOCK]", v.deps | flat.deps)
        if not sched.persistent:
            em.pop()
    for o, plane in planes.items():
        t = g.types[o]
        tag = em.fresh("r")
        em.push(f"for {tag} in range(0, {plane}, RBLOCK):", tag)
        dep = frozenset({tag})
        pindex = Ix(em.emit(f"{tag} + tl.arange(0, RBLOCK)[None, :]", dep, "rindex"), None, plane, dep)
        pmask = em.cond(f"{pindex.expr} < {plane}", dep)
        coords = list(row_index)
        for d, c in zip(axes, ix.unravel(pindex, [t.shape[d] for d in axes])):
            coords[d] = c
        mask = frozenset({"xmask", pmask})
        flat = em.index_var(ix.ravel_stored(coords, t.shape, t.layout))
        v = em.value(o, coords, mask)
        k.store(o, flat, v, mask, "[XBLOCK, RBLOCK]", v.deps | flat.deps)
        em.pop()
    for o in k.outputs:
        if o in per_element or o in planes:
            continue
        t = g.types[o]
        row = logical_row
        coords = ix.unravel(row, t.shape)
        at = row if t.plain and xorder == outer else em.index_var(ix.ravel_stored(coords, t.shape, t.layout))
        v = em.value(o, coords, frozenset({"xmask"}))
        k.store(o, at, v, frozenset({"xmask"}), "[XBLOCK, 1]", xdep)
    return header, xnumel, rnumel


def _row_order(g: Graph, reds: Sequence[Node], outer: list[int]) -> list[int]:
    """The kept dims in the storage order of the first reduction's input (logical order if plain)."""
    t = g.types[reds[0].inputs[0]]
    if t.plain:
        return list(outer)
    return [d for d in t.layout if d in outer]


def _reduce_ancestors(n: Node, k: KernelBody, by_out: dict[str, Node]) -> list[str]:
    """Outputs of the kernel's reductions that `n` reads, directly or through other kernel nodes."""
    producer = {o: m for m in k.nodes for o in m.outputs}
    seen: set[str] = set()
    found: list[str] = []
    stack = list(n.inputs)
    while stack:
        t = stack.pop()
        if t in seen or t not in producer:
            continue
        seen.add(t)
        if t in by_out:
            found.append(t)
            continue
        stack.extend(producer[t].inputs)
    return found


REDUCE_OPS = {p.value for p in REDUCTIONS}
REDUCE_IDENT = {Prim.REDUCE_SUM.value: "0.0", Prim.REDUCE_MAX.value: '-float("inf")', Prim.REDUCE_MIN.value: 'float("inf")'}


def reduction_identity(op: str, dtype: DType) -> tuple[str, str]:
    """(identity literal, accumulator type) of a reduction over `dtype`. Integers accumulate in int64
    (a narrower sum wraps the same once cast back), from their type's extreme for max and min (written
    by `literal`, which spells int64's least)."""
    if dtype.is_float:
        return REDUCE_IDENT[op], "tl.float32"
    info = np.iinfo(dtype.to_numpy())
    extreme = {Prim.REDUCE_SUM.value: 0, Prim.REDUCE_MAX.value: int(info.min), Prim.REDUCE_MIN.value: int(info.max)}
    return literal(extreme[op], dtype).expr, "tl.int64"


def row_result(g: Graph, n: Node, acc: str) -> str:
    """Reduction `n` of a [rows, block] accumulator `acc` along its block: one value per row, [rows, 1],
    in the reduction's output type (row kernels, and a GEMM template's row statistics)."""
    return f"{REDUCE_FN[n.op]}({acc}, 1)[:, None]{_narrow(g, n)}"


def _narrow(g: Graph, n: Node) -> str:
    """The cast of an integer reduction's int64 result to its narrower output type ('' if none)."""
    dt = g.types[n.outputs[0]].dtype
    return "" if dt.is_float or dt is DType.INT64 else f".to({COMPUTE[dt]})"


REDUCE_FN = {Prim.REDUCE_SUM.value: "tl.sum", Prim.REDUCE_MAX.value: "tl.max", Prim.REDUCE_MIN.value: "tl.min"}
COMBINE = {Prim.REDUCE_SUM.value: "{acc} + {v}", Prim.REDUCE_MAX.value: "tl.maximum({acc}, {v})",
           Prim.REDUCE_MIN.value: "tl.minimum({acc}, {v})"}


def render(scope: Scope, indent: str, out: list[str]) -> None:
    """Append the statements of `scope` and its nested scopes to `out`, indented."""
    for line in scope.lines:
        if isinstance(line, Scope):
            out.append(f"{indent}{line.header}")
            render(line, indent + "    ", out)
        else:
            out.append(f"{indent}{line}")


def rows_strided(graph: Graph, nodes: Sequence[Node]) -> bool:
    """Are the elements of a reduction's row apart in memory? True when the reduced axes are not
    the innermost dims of the input's storage order (H and W of an NHWC tensor)."""
    red = next((n for n in nodes if n.op in REDUCE_OPS), None)
    if red is None:
        return False
    t = graph.types[red.inputs[0]]
    axes = red.attrs["axes"]
    return any(t.shape[d] != 1 for d in axes) and not t.rows_contiguous(axes)


def kind_of(nodes: Sequence[Node]) -> str:
    return "reduction" if any(n.op in REDUCE_OPS for n in nodes) else "pointwise"


def generate(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], name: str,
             schedule: Schedule | None = None, sources: Sequence[str] = ()) -> KernelSource:
    """Triton source computing `outputs` from `nodes` (a kernel's primitives and free prologue).

    Raises `Unsupported` with the reason when the candidate has no Triton form.
    """
    k = KernelBody(graph, nodes, outputs)
    reduction = kind_of(nodes) == "reduction"
    strided = reduction and rows_strided(graph, nodes)
    if schedule is None:
        schedule = _default_schedule(graph, nodes, outputs, reduction, strided)
    tile = None if reduction else tile_shape(graph, nodes, outputs)
    tiled = not reduction and schedule.rblock > 1
    if tiled and tile is None:
        raise Unsupported("a tiled schedule needs a transposing kernel with outputs of one shape")
    header, xnumel, rnumel = (_reduction if reduction else _tiled if tiled else _pointwise)(k, schedule)
    fn = sanitize(name)
    body: list[str] = []
    render(k.em.stack[0], "    ", body)
    g = graph
    rd = sum(g.types[t].nbytes for t in k.inputs)
    wr = sum(g.types[t].nbytes for t in k.outputs)
    form = "row reduction" if reduction else "tiled pointwise (rows x columns)" if tiled else "pointwise"
    doc = [f"# tessera kernel {name}: {form}, "
           f"{xnumel} x {rnumel} elements",
           *textwrap.wrap("primitives: " + ", ".join(f"{n.name} ({n.op})" for n in nodes), 100,
                          initial_indent="# ", subsequent_indent="#   ")]
    if sources:
        doc += textwrap.wrap("ONNX nodes: " + ", ".join(sources), 100, initial_indent="# ",
                             subsequent_indent="#   ")
    doc += [f"# {a}: {t} {g.types[t]}" for t, a in zip(k.inputs, [f"in{i}" for i in range(len(k.inputs))])]
    doc += [f"# {a}: {t} {g.types[t]}" for t, a in k.out_args.items()]
    doc.append(f"# memory: reads {rd} B, writes {wr} B; the roofline is this traffic at full bandwidth")
    params = ", ".join([f"in{i}" for i in range(len(k.inputs))] + list(k.out_args.values()))
    src = module_source(doc + [
        "@triton.jit", f"def {fn}({params}, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, {PDL_PARAM}):"]
        + [f"    {h}" for h in (*PDL_PROLOGUE, *header)] + body)
    return KernelSource(fn, src, k.inputs, k.outputs, xnumel, rnumel, schedule, [n.name for n in nodes], tile,
                        strided)


def _default_schedule(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], reduction: bool,
                      strided: bool = False) -> Schedule:
    if not reduction:
        return schedules(max(graph.types[o].numel for o in outputs), 1)[0]
    red = next(n for n in nodes if n.op in REDUCE_OPS)
    shape = graph.types[red.inputs[0]].shape
    axes = red.attrs["axes"]
    rnumel = prod(shape[d] for d in axes)
    return schedules(prod(shape) // max(1, rnumel), max(2, rnumel), None, strided)[0] if rnumel > 1 else \
        Schedule(min(64, _pow2(prod(shape))), 1, 4, True)
