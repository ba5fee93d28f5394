"""GEMM template: a matmul kernel as one generated Triton kernel with its epilogue fused (Bolt, Hidet).

Form. A program owns one BLOCK_M x BLOCK_N tile of one batch entry of the matmul result
C = A @ B ([..., M, K] @ [..., K, N]). It walks K in BLOCK_K steps and accumulates `tl.dot` of
the operand tiles in float32: IEEE fp32 products for fp32 operands, tf32 where the plan's math
is tf32 (`cost/measured.py::math_mode`), fp16/bf16 operands as they are. Then the epilogue,
every primitive of the kernel computed from C (bias and residual adds through broadcasts,
activations, scaling, casts, reshapes), runs on the accumulator in registers, and each output
the kernel writes is stored from there, the product itself included when it is an output.

Addresses. Shapes are static, so every address is baked into the source. The epilogue is the
shared emitter's (`codegen/emitter.py`) pointwise computation over the tile's (batch, row,
column) indices, with C registered as a known value (the accumulator) at those indices. The
operands are read through the same emitter: in the storage order their types carry
(`TensorType.layout`), so an operand stored transposed needs no copy, and an operand that a free
prologue computes from constants (Gemm's transposed weight, a sliced or broadcast constant) is
computed at the tile's indices inside the K loop, also without a copy.

Tiles. Program ids are swizzled in groups of GROUP_M tile rows, so programs that run together
share operand tiles in L2. M, N and K remainders are masked; a dimension the block divides
needs no mask and gets none. The tile, the operand loads and the epilogue are shared with the
convolution template (`codegen/tile.py`, `codegen/conv.py`).

Split-K (few output tiles, long K: the GPU would sit mostly idle). One launch, deterministic:
each of SPLIT_K programs per tile walks a slice of K and writes its float32 partial tile to a
workspace [SPLIT_K, batch, M, N], then counts itself in on the tile's arrival counter; the
tile's last program sums the slices in a fixed order (the same bits whichever arrives last) and
runs the epilogue as above (`tile.sum_slices`, shared with the split GEMM chains). The
workspace is 4 x SPLIT_K x batch x M x N bytes plus a counter per tile, written once and read
once (the schedule model charges it). Until session 20 a second kernel summed the slices, one
more launch for the small-M, long-K GEMMs split-K exists for.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

from tessera.codegen import index as ix
from tessera.codegen.index import Ix
from tessera.codegen.kernels import GemmSchedule, KernelBody, KernelSource, Launch, sanitize
from tessera.codegen.norm import RowFactor, prewalk_statistic
from tessera.codegen.rotary import HalvesSwap, partner_columns, swap_halves
from tessera.codegen.tile import (GRID_Y_MAX, MIN_BLOCK, Tile, cdiv, check_outputs, describe, dot_math, dot_operand,
                                  jit_function, pow2, store_outputs, sum_slices)
from tessera.codegen.triton_ops import Unsupported, Val, module_source
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim

# The hardware's tile menu (block_m, block_n, block_k for 4-byte operands, num_warps, num_stages):
# Hidet's idea, fixed by the GPU, not by the problem; a problem keeps the tiles that fit it.
# 2-byte operands take twice the K step (the same bytes per step, the same shared memory).
TILES = (
    (128, 128, 32, 8, 3), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3), (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (64, 32, 32, 4, 4), (32, 64, 32, 4, 4),
    (32, 32, 64, 4, 4), (16, 64, 64, 4, 4), (16, 128, 64, 4, 3), (16, 32, 128, 2, 4),
    # Deeper pipelines and shorter K steps: the fastest of the H100 probe of the 128-row linear layers
    # of BERT and GPT-2 (`scripts/gemm_probe.py`, session 21), fp16 and tf32 beside.
    (64, 64, 64, 4, 5), (64, 32, 64, 4, 5), (16, 128, 32, 4, 3), (32, 32, 32, 4, 3),
)
SPLIT_K = (2, 4, 8, 16)
SPLIT_K_MIN_CHUNK = 128  # K elements per split-K program, at least: shorter slices make the workspace dominate
GEMM_CONSTS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")


def template_schedules(batch: int, m: int, n: int, k: int, itemsize: int = 4, sms: int = 132) -> list[GemmSchedule]:
    """A problem's template schedules: the tile menu cut to the problem (blocks no larger than the
    next power of two of each extent), plus split-K where the output tiles leave SMs idle (fewer
    tiles than `sms`) and each slice of K stays long. Deduplicated; at most 60 points."""
    out: list[GemmSchedule] = []
    for bm, bn, bk, warps, stages in TILES:
        bk = bk * 4 // max(1, min(itemsize, 4))
        bm, bn = min(bm, max(MIN_BLOCK, pow2(m))), min(bn, max(MIN_BLOCK, pow2(n)))
        bk = min(bk, max(MIN_BLOCK, pow2(k)))
        # A small tile gives each warp too little to do; 2 warps at least. With 4-byte operands
        # (tf32, fp32) a tile of 1024 outputs or more keeps 4: on the H100 sweep of issue 15's
        # chain products (session 38, scripts/gemm_probe.py --set chains) 4 warps ran 32x32 tiles
        # in a median 0.84 of 2 warps' time (96 pairs, none over 1.03), 16x64 tiles in 0.94.
        floor = 4 if itemsize >= 4 and bm * bn >= 1024 else 2
        warps = min(warps, max(floor, bm * bn // 512))
        stages = min(stages, max(2, cdiv(k, bk)))
        tm, tn = cdiv(m, bm), cdiv(n, bn)
        group = 8 if tm > 1 and tn > 1 else 1  # swizzling one row or column of tiles changes nothing
        out.append(GemmSchedule(bm, bn, bk, warps, stages, group, 1))
        for s, chunk in split_k_options(batch * tm * tn, cdiv(k, bk), bk, sms):
            out.append(GemmSchedule(bm, bn, bk, warps, min(stages, max(2, chunk)), group, s))
    return list(dict.fromkeys(out))


def split_k_options(tiles: int, steps: int, step: int, sms: int) -> list[tuple[int, int]]:
    """Split-K for a grid of `tiles` output tiles over a K walk of `steps` steps of `step` elements:
    (programs per tile, K steps each) for each split in SPLIT_K that pays. None where the tiles
    fill the SMs already; each slice keeps SPLIT_K_MIN_CHUNK elements and two steps at least, the
    grid stays within 2 programs per SM, and no program is left without steps. (GEMM and
    convolution templates share the rule.)"""
    if tiles >= sms:
        return []
    out = []
    for split in SPLIT_K:
        chunk = cdiv(steps, split)
        if chunk * step >= max(SPLIT_K_MIN_CHUNK, 2 * step) and tiles * split <= 2 * sms \
                and cdiv(steps, chunk) >= split:
            out.append((split, chunk))
    return out


def matmul_root(nodes: Sequence[Node]) -> Node | None:
    """The kernel's matmul primitive, if it has one (the template's anchor)."""
    roots = [n for n in nodes if n.op == Prim.MATMUL.value]
    return roots[0] if len(roots) == 1 else None


def problem(graph: Graph, root: Node) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a matmul primitive."""
    c = graph.types[root.outputs[0]].shape
    return prod(c[:-2]), c[-2], c[-1], graph.types[root.inputs[0]].shape[-1]


def column_slices(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node) -> list[Node] | None:
    """The slices through which alone a kernel reads its product, where there are two or more and they
    cut the last axis into distinct pieces of one width, by start (else None). A merged gate and up
    projection read as silu(y[..., :I]) * y[..., I:] is one: the template then walks a tile of one
    piece with an accumulator per slice over the same A tiles (`tile_problem`), so the epilogue
    combines the slices where they are computed and the product is never stored."""
    y = root.outputs[0]
    readers = [n for n in nodes if y in n.inputs]
    if y in outputs or len(readers) < 2 or any(n.op != Prim.SLICE.value for n in readers):
        return None
    shape = graph.types[y].shape
    widths, starts = set(), set()
    for n in readers:
        out = graph.types[n.outputs[0]].shape
        if any(step != 1 for step in n.attrs["steps"]) or any(n.attrs["starts"][:-1]) or out[:-1] != shape[:-1]:
            return None
        widths.add(out[-1])
        starts.add(n.attrs["starts"][-1])
    if len(widths) != 1 or len(starts) != len(readers):
        return None
    return sorted(readers, key=lambda n: n.attrs["starts"][-1])


def tile_problem(graph: Graph, root: Node, cut: Sequence[Node] | None) -> tuple[int, int, int, int, int]:
    """(batch, M, N, K, accumulators) of the tiles a GEMM template walks: the product's, or where the
    kernel reads it through the slices `cut` (`column_slices`), one slice's N with an accumulator each."""
    batch, m, n, k = problem(graph, root)
    return (batch, m, graph.types[cut[0].outputs[0]].shape[-1], k, len(cut)) if cut else (batch, m, n, k, 1)


class _Template:
    """Shared state of one template generation."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node,
                 s: GemmSchedule, precision: str) -> None:
        self.graph, self.nodes, self.outputs, self.root, self.s = graph, list(nodes), list(outputs), root, s
        ta, tb = (graph.types[t] for t in root.inputs)
        self.tc = graph.types[root.outputs[0]]
        self.math = dot_math(ta.dtype, tb.dtype, precision, f"{root.name}: a GEMM template")
        # A product read only through column slices (a gate beside its up projection): an accumulator each
        self.slices = column_slices(graph, nodes, outputs, root)
        self.batch, self.m, self.n, self.k, _ = tile_problem(graph, root, self.slices)
        self.accs = [f"acc{i}" for i in range(len(self.slices))] if self.slices else ["acc"]
        self.tile_shape = (*self.tc.shape[:-1], self.n)
        if self.slices and s.split_k > 1:
            raise Unsupported(f"{root.name}: a product read through column slices is not split over K")
        if self.batch > GRID_Y_MAX:
            raise Unsupported(f"{root.name}: {self.batch} batch entries exceed the grid")
        for name in (s.block_m, s.block_n, s.block_k):
            if name < MIN_BLOCK or name & (name - 1):
                raise Unsupported(f"GEMM blocks must be powers of two >= {MIN_BLOCK}: {s}")
        if self.slices:
            check_outputs(graph, nodes, outputs, self.slices[0].outputs[0], "matmul's column slices", "GEMM",
                          reached=[n.outputs[0] for n in self.slices])
        else:
            check_outputs(graph, nodes, outputs, root.outputs[0], "matmul", "GEMM")
        self.b_layout = self.weight_layout()

    def kernel(self) -> KernelBody:
        k = KernelBody(self.graph, self.nodes, self.outputs)
        if self.b_layout is not None:
            k.layouts[self.root.inputs[1]] = self.b_layout
        return k

    def weight_layout(self) -> tuple[int, ...] | None:
        """The storage order this kernel reads its constant B operand in, where that is not the
        graph's, else None. Hopper's wgmma reads 32-bit (tf32) operands from shared memory only
        K-major. A B stored [K, N] with N contiguous (how the ONNX export stores a Linear's weight)
        sends Triton to the older mma.sync path, 8-22% slower at the 128-row layers of BERT and
        GPT-2 on the H100 (`scripts/tf32_operand_probe.py`, session 28). So a constant B that only
        the dot reads is stored [..., N, K] once, at load, as convolution weights are."""
        a, b = self.root.inputs
        tb = self.graph.types[b]
        if not self.math.tf32 or b == a or b not in self.graph.constants \
                or any(b in n.inputs for n in self.nodes if n is not self.root) \
                or tb.rank < 2 or not tb.plain or 1 in tb.shape[-2:]:
            return None
        return (*range(tb.rank - 2), tb.rank - 1, tb.rank - 2)

    # ---- the K loop ------------------------------------------------------------------------
    def mainloop(self, t: Tile, chunk: int, split: bool) -> None:
        """acc = the tile's product over K (over this program's slice of K when `split`)."""
        em, s = t.em, self.s
        for acc in self.accs:
            em.stmt(f"{acc} = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        tag = em.fresh("k")
        em.push(f"for {tag} in range(0, {chunk}, BLOCK_K):", tag)
        ka, kb = frozenset({tag}), frozenset({tag + "b"})  # K along A's columns, and along B's rows
        em.stack[-1].avail = em.stack[-1].avail | kb
        start = f"pid_k * {chunk} + {tag}" if split else tag
        rka = Ix(em.emit(f"{start} + tl.arange(0, BLOCK_K)[None, :]", ka, "rk"), None, self.k, ka)
        rkb = Ix(em.emit(f"{start} + tl.arange(0, BLOCK_K)[:, None]", kb, "rk"), None, self.k, kb)
        ragged = self.k % s.block_k != 0 or (split and chunk * s.split_k != self.k)
        kma = frozenset({em.cond(f"{rka.expr} < {self.k}", ka)}) if ragged else frozenset()
        kmb = frozenset({em.cond(f"{rkb.expr} < {self.k}", kb)}) if ragged else frozenset()
        a_in, b_in = self.root.inputs
        g, mt = self.graph, self.math
        # A norm's row factor (RMSNorm's rstd) moves onto the accumulator, its statistic into this walk
        rf = None if split else RowFactor.find(g, self.nodes, self.outputs, self.root)
        if rf is not None:
            em.intercepts[rf.mul.outputs[0]] = lambda index, mask: rf.intercept(em, index, mask)
        a = dot_operand(t, g, mt, a_in, [*t.batch, t.rm, rka], t.mmask | kma, kma, "[BLOCK_M, BLOCK_K]", {"m"} | ka)
        # each accumulator's columns of B: the whole product's, or its slice's (the same A tile for all)
        starts = [sl.attrs["starts"][-1] for sl in self.slices] if self.slices else [0]
        for acc, start in zip(self.accs, starts):
            rn = ix.add_const(t.rn, start) if start else t.rn
            b = dot_operand(t, g, mt, b_in, [*t.batch, rkb, rn], kmb | t.nmask, kmb, "[BLOCK_K, BLOCK_N]",
                            kb | {"n"}, layout=self.b_layout)
            em.stmt(f"{acc} = tl.dot({a}, {b}, {acc}{mt.precision})")
        if rf is not None:
            rf.walk(t, rka)
        em.pop()
        if rf is not None:
            em.intercepts.pop(rf.mul.outputs[0], None)
            rf.apply(t, self.accs)

    # ---- the epilogue ----------------------------------------------------------------------
    def allow_swaps(self, t: Tile) -> None:
        """Let the epilogue read the product's rotate_half from the accumulator's registers
        (`codegen/rotary.py`): where every element's partner is the column n ± s of the same row,
        and a tile holds whole runs of 2s columns. (Templates reading column slices never call it: their
        accumulators are the slices, not the product.)"""
        em, product = t.em, self.root.outputs[0]

        def swap(sw: HalvesSwap, index: tuple[Ix, ...], mask: frozenset[str]) -> Val | None:
            if not partner_columns(self.graph, em.producer, product, sw):
                return None
            if self.s.block_n % (2 * sw.half):
                raise Unsupported(f"{self.root.name}: rotate_half over {2 * sw.half} columns needs BLOCK_N a "
                                  f"multiple of them, not {self.s.block_n}")
            # x at the tile's own lanes: the accumulator, or values computed from it lane by lane (a bias
            # added); every lane holds x at the position it maps to, so the swap gives each its partner
            v = em.value(sw.x, index, mask)
            if not {"m", "n"} <= v.deps:
                return None
            return swap_halves(em.emit, v, sw.half)
        em.swap = swap

    def epilogue(self, t: Tile) -> None:
        """Every output from the accumulator, at its own indices (a reshape of the product's); where
        the product is read through column slices, each slice is its accumulator at the tile's indices."""
        if not self.slices:
            self.allow_swaps(t)
            store_outputs(t, self.graph, self.outputs, self.root.outputs[0], t.coords)
            return
        at = tuple(i.expr for i in t.coords)
        for acc, sl in zip(self.accs[1:], self.slices[1:]):
            t.em.known[(sl.outputs[0], at)] = Val(acc, self.graph.types[sl.outputs[0]].dtype, frozenset({"b", "m", "n"}))
        store_outputs(t, self.graph, self.outputs, self.slices[0].outputs[0], t.coords,
                      Val(self.accs[0], self.tc.dtype, frozenset({"b", "m", "n"})))


def _function(fn: str, params: str, t: Tile, extra: Sequence[str] = ()) -> list[str]:
    return jit_function(fn, params, t, GEMM_CONSTS, extra)


def generate_gemm(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], name: str, schedule: GemmSchedule,
                  sources: Sequence[str] = (), precision: str = "fp32") -> KernelSource:
    """The template kernel computing `outputs` of a matmul kernel (`nodes`: its matmul, its epilogue
    and its free prologue) under `schedule`; `precision` is the plan's (tf32 makes fp32 dots tf32).

    Raises `Unsupported` when the kernel has no template form: no single matmul, operands that
    are not fp32/fp16/bf16, an output of another size than the product, or an epilogue that
    reads the product at other indices than its own.
    """
    root = matmul_root(nodes)
    if root is None:
        raise Unsupported("a GEMM template needs exactly one matmul")
    s = schedule
    tp = _Template(graph, nodes, outputs, root, s, precision)
    fn = sanitize(name)
    shape = tp.tile_shape
    tiles = cdiv(tp.m, s.block_m) * cdiv(tp.n, s.block_n)
    meta = (("BLOCK_M", s.block_m), ("BLOCK_N", s.block_n), ("BLOCK_K", s.block_k), ("GROUP_M", s.group_m),
            ("num_warps", s.num_warps), ("num_stages", s.num_stages))
    main = tp.kernel()
    t = Tile(main, shape, s)
    # a norm's statistics that the operand prologue reads (`codegen/norm.py`)
    main.em.on_reduce = lambda node, index, mask: prewalk_statistic(t, graph, node, index, mask, s.block_k)
    ins = [f"in{i}" for i in range(len(main.inputs))]
    outs = list(main.out_args.values())
    funcs: list[list[str]] = []
    launches: list[Launch] = []
    workspace = 0
    if s.split_k > 1:
        chunk = cdiv(cdiv(tp.k, s.split_k), s.block_k) * s.block_k
        params = ", ".join(ins + ["ws"] + outs)
        tp.mainloop(t, chunk, split=True)
        workspace = sum_slices(t, "pid_k", s.split_k, tp.batch * tp.m * tp.n, tp.batch * tiles)
        summed = Val("tot", tp.tc.dtype, frozenset({"b", "m", "n", "fix"}))
        tp.allow_swaps(t)
        store_outputs(t, graph, tp.outputs, root.outputs[0], t.coords, summed)  # inside the last's block
        t.em.pop()
        funcs.append(_function(fn, params, t, ["pid_k = tl.program_id(2)"]))
        launches.append(Launch(fn, (tiles, tp.batch, s.split_k), meta))
        form = (f"split-K GEMM template ({s.split_k} slices of {chunk}; each tile's last program sums them "
                f"in order and runs the epilogue)")
    else:
        params = ", ".join(ins + outs)
        tp.mainloop(t, tp.k, split=False)
        tp.epilogue(t)
        funcs.append(_function(fn, params, t))
        launches.append(Launch(fn, (tiles, tp.batch), meta))
        form = "GEMM template"
    src = module_source(_doc(graph, name, form, tp, main, sources, workspace)
                        + [line for f in funcs for line in f + ["", ""]])
    return KernelSource(fn, src, main.inputs, main.outputs, tp.batch * tp.m * tp.n, tp.k, s,
                        [n.name for n in nodes], launches=launches, workspace=workspace,
                        input_layouts=dict(main.layouts), rounded_inputs=tuple(sorted(main.rounded)))


def _doc(graph: Graph, name: str, form: str, tp: _Template, k: KernelBody, sources: Sequence[str],
         workspace: int) -> list[str]:
    """The header: what the kernel computes, from which primitives and ONNX nodes, and its roofline."""
    g, root = graph, tp.root
    a, b = root.inputs
    doc = [f"# tessera kernel {name}: {form}, batch {tp.batch} x M {tp.m} x N {tp.n} x K {tp.k}, "
           f"{tp.math.label} products, fp32 accumulation",
           f"# matmul: {root.name} ({g.types[a]} @ {g.types[b]} -> {g.types[root.outputs[0]]})"]
    if tp.slices:
        doc.append("# read through its column slices, one accumulator each over the same A tiles: "
                   + ", ".join(f"{acc} = {sl.name} (columns {sl.attrs['starts'][-1]}:{sl.attrs['starts'][-1] + tp.n})"
                               for acc, sl in zip(tp.accs, tp.slices)))
    doc += describe(g, tp.nodes, root, k, sources, workspace)
    rd = sum(g.types[t].nbytes for t in k.inputs)
    wr = sum(g.types[t].nbytes for t in k.outputs)
    doc.append(f"# work: {2 * tp.batch * tp.m * tp.n * tp.k * len(tp.accs)} FLOP; memory: reads {rd} B, writes {wr} B"
               + (f", workspace {8 * workspace} B" if workspace else "")
               + "; the roofline is the larger of the two at full rate")
    return doc
