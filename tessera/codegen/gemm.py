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
needs no mask and gets none.

Split-K (few output tiles, long K: the GPU would sit mostly idle). Two launches of one source,
atomic-free and deterministic: `<name>_partial` gives each of SPLIT_K programs per tile a slice
of K and writes its float32 partial tile to a workspace [SPLIT_K, batch, M, N]; `<name>` sums
the slices in a fixed order, then runs the epilogue as above. The workspace is 4 x SPLIT_K x
batch x M x N bytes, written once and read once (the schedule model charges it).
"""
from __future__ import annotations

import textwrap
from math import prod
from typing import Sequence

from tessera.codegen import index as ix
from tessera.codegen.index import Ix
from tessera.codegen.kernels import GemmSchedule, KernelSource, Launch, KernelBody, render, sanitize
from tessera.codegen.triton_ops import STORAGE, Unsupported, Val
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim

# The hardware's tile menu (block_m, block_n, block_k for 4-byte operands, num_warps, num_stages):
# Hidet's idea, fixed by the GPU, not by the problem; a problem keeps the tiles that fit it.
# 2-byte operands take twice the K step (the same bytes per step, the same shared memory).
TILES = (
    (128, 128, 32, 8, 3), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3), (128, 64, 32, 4, 4),
    (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (64, 32, 32, 4, 4), (32, 64, 32, 4, 4),
    (32, 32, 64, 4, 4), (16, 64, 64, 4, 4), (16, 128, 64, 4, 3), (16, 32, 128, 2, 4),
)
SPLIT_K = (2, 4, 8, 16)
MIN_BLOCK = 16  # tl.dot's smallest block on every GPU Triton supports
SPLIT_K_MIN_CHUNK = 256  # K elements per split-K program, at least: shorter slices make the workspace dominate
GRID_Y_MAX = 65535  # CUDA's grid limit on the batch axis
DOT_TYPES = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


# fp32 -> tf32, rounding to nearest (ties away, as cvt.rna.tf32.f32 does). The tensor cores read
# only the top 19 bits of an fp32 operand, so unrounded operands are truncated: a bias toward zero
# of ~1e-3 relative, the whole tf32 tolerance. Rounded operands err without bias, and their
# products are exact in fp32, so the CPU interpreter computes what the GPU does. Infinities and
# NaN pass unchanged.
_TF32 = ("tl.where(tl.abs({x}) < float(\"inf\"), "
         "((({x}).to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True), {x})")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def template_schedules(batch: int, m: int, n: int, k: int, itemsize: int = 4, sms: int = 132) -> list[GemmSchedule]:
    """A problem's template schedules: the tile menu cut to the problem (blocks no larger than the
    next power of two of each extent), plus split-K where the output tiles leave SMs idle (fewer
    tiles than `sms`) and each slice of K stays long. Deduplicated; at most 60 points."""
    out: list[GemmSchedule] = []
    for bm, bn, bk, warps, stages in TILES:
        bk = bk * 4 // max(1, min(itemsize, 4))
        bm, bn = min(bm, max(MIN_BLOCK, _pow2(m))), min(bn, max(MIN_BLOCK, _pow2(n)))
        bk = min(bk, max(MIN_BLOCK, _pow2(k)))
        warps = min(warps, max(2, bm * bn // 1024))  # a small tile gives each warp too little to do
        stages = min(stages, max(2, _cdiv(k, bk)))
        tm, tn = _cdiv(m, bm), _cdiv(n, bn)
        group = 8 if tm > 1 and tn > 1 else 1  # swizzling one row or column of tiles changes nothing
        out.append(GemmSchedule(bm, bn, bk, warps, stages, group, 1))
        tiles = batch * tm * tn
        if tiles >= sms:
            continue
        for s in SPLIT_K:
            chunk = _cdiv(_cdiv(k, s), bk) * bk
            if chunk < max(SPLIT_K_MIN_CHUNK, 2 * bk) or tiles * s > 2 * sms or _cdiv(k, chunk) < s:
                continue
            out.append(GemmSchedule(bm, bn, bk, warps, min(stages, max(2, chunk // bk)), group, s))
    return list(dict.fromkeys(out))


def matmul_root(nodes: Sequence[Node]) -> Node | None:
    """The kernel's matmul primitive, if it has one (the template's anchor)."""
    roots = [n for n in nodes if n.op == Prim.MATMUL.value]
    return roots[0] if len(roots) == 1 else None


def problem(graph: Graph, root: Node) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a matmul primitive."""
    c = graph.types[root.outputs[0]].shape
    return prod(c[:-2]), c[-2], c[-1], graph.types[root.inputs[0]].shape[-1]


class _Tile:
    """One function of the template: the tile's indices and masks in its emitter."""

    def __init__(self, k: KernelBody, shape: tuple[int, ...], s: GemmSchedule) -> None:
        self.k, self.em = k, k.em
        em = self.em
        *batch, self.m, self.n = shape
        self.nbatch = prod(batch)
        em.stack[0].avail = frozenset({"b", "m", "n"})
        em.shape_of = lambda deps: "[BLOCK_M, BLOCK_N]"
        tm, tn = _cdiv(self.m, s.block_m), _cdiv(self.n, s.block_n)
        # Swizzle: consecutive programs walk GROUP_M tile rows down one tile column, then the next.
        self.header = ["pid = tl.program_id(0)"]
        if s.group_m > 1 and tm > 1 and tn > 1:
            self.header += [f"group = GROUP_M * {tn}", "first_m = (pid // group) * GROUP_M",
                            f"rows = tl.minimum({tm} - first_m, GROUP_M)",
                            "pid_m = first_m + (pid % group) % rows", "pid_n = (pid % group) // rows"]
        elif tn == 1:
            self.header += ["pid_m = pid", "pid_n = 0"]
        else:
            self.header += [f"pid_m = pid // {tn}", f"pid_n = pid % {tn}"]
        if self.nbatch > 1:
            self.header.append("pid_b = tl.program_id(1)")
        self.header += ["rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
                        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]"]
        # A size-1 extent is index 0, as the emitter's index maps write it (reshape_index drops
        # such dims); lanes past it stay masked.
        self.rm = Ix("rm", None, self.m, frozenset({"m"})) if self.m > 1 else Ix.of(0)
        self.rn = Ix("rn", None, self.n, frozenset({"n"})) if self.n > 1 else Ix.of(0)
        bdep = frozenset({"b"})
        self.batch = ix.unravel(Ix("pid_b", None, self.nbatch, bdep), batch) if self.nbatch > 1 \
            else [Ix.of(0)] * len(batch)
        self.mask: frozenset[str] = frozenset(
            ([em.cond(f"rm < {self.m}", frozenset({"m"}))] if self.m % s.block_m else [])
            + ([em.cond(f"rn < {self.n}", frozenset({"n"}))] if self.n % s.block_n else []))
        self.mmask = frozenset(c for c in self.mask if em.cond_deps[c] == {"m"})
        self.nmask = frozenset(c for c in self.mask if em.cond_deps[c] == {"n"})

    @property
    def coords(self) -> list[Ix]:
        return [*self.batch, self.rm, self.rn]

    def workspace_offset(self, split: str) -> str:
        """Where this tile's partial sums of slice `split` live in the workspace."""
        base = f"({split} * {self.nbatch} + pid_b) * {self.m * self.n}" if self.nbatch > 1 \
            else f"{split} * {self.m * self.n}"
        return f"{base} + rm * {self.n} + rn"


class _Template:
    """Shared state of one template generation."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node,
                 s: GemmSchedule, precision: str) -> None:
        self.graph, self.nodes, self.outputs, self.root, self.s = graph, list(nodes), list(outputs), root, s
        ta, tb = (graph.types[t] for t in root.inputs)
        self.tc = graph.types[root.outputs[0]]
        if ta.dtype != tb.dtype or ta.dtype not in DOT_TYPES:
            raise Unsupported(f"{root.name}: a GEMM template multiplies fp32, fp16 or bf16, "
                              f"not {ta.dtype.value} x {tb.dtype.value}")
        self.dot_type = STORAGE[ta.dtype]
        self.precision = ""
        if ta.dtype is DType.FLOAT32:  # fp32 plans multiply in IEEE fp32, as the libraries do there
            self.precision = ', input_precision="tf32"' if precision == "tf32" else ', input_precision="ieee"'
        self.tf32 = ta.dtype is DType.FLOAT32 and precision == "tf32"
        self.batch, self.m, self.n, self.k = problem(graph, root)
        if self.batch > GRID_Y_MAX:
            raise Unsupported(f"{root.name}: {self.batch} batch entries exceed the grid")
        for name in (s.block_m, s.block_n, s.block_k):
            if name < MIN_BLOCK or name & (name - 1):
                raise Unsupported(f"GEMM blocks must be powers of two >= {MIN_BLOCK}: {s}")
        c = self.tc.numel
        for o in outputs:
            if graph.types[o].numel != c:
                raise Unsupported(f"output {o} has {graph.types[o].numel} elements, the matmul {c}: "
                                  "a GEMM epilogue writes one value per product element")

    def kernel(self) -> KernelBody:
        return KernelBody(self.graph, self.nodes, self.outputs)

    # ---- the K loop ------------------------------------------------------------------------
    def mainloop(self, t: _Tile, chunk: int, split: bool) -> None:
        """acc = the tile's product over K (over this program's slice of K when `split`)."""
        em, s = t.em, self.s
        em.stmt("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
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
        a = self.operand(t, a_in, [*t.batch, t.rm, rka], t.mmask | kma, kma, "[BLOCK_M, BLOCK_K]", {"m"} | ka)
        b = self.operand(t, b_in, [*t.batch, rkb, t.rn], kmb | t.nmask, kmb, "[BLOCK_K, BLOCK_N]", kb | {"n"})
        em.stmt(f"acc = tl.dot({a}, {b}, acc{self.precision})")
        em.pop()

    def operand(self, t: _Tile, tensor: str, coords: list[Ix], mask: frozenset[str], kmask: frozenset[str],
                shape: str, axes: set[str] | frozenset[str]) -> str:
        """An operand tile in the dot's input type (`shape`, over the loop tags `axes`). A tensor from
        memory is loaded as stored; one a free prologue computes is computed at these indices, its
        lanes past K zeroed (a masked load gives 0 there, but 1/0 or log(0) of it would not). A value
        constant along an axis (a size-1 M, a broadcast operand) is broadcast to the full tile."""
        em = t.em
        ty = self.graph.types[tensor]
        need = frozenset(axes)
        if tensor in em.inputs:
            off = em.index_var(ix.ravel_stored(coords, ty.shape, ty.layout))
            m = em.mask_expr(mask, off.deps)
            v = em.emit(f"tl.load({em.inputs[tensor]} + {off.expr}" + (f", mask={m}, other=0.0)" if m else ")"),
                        off.deps, "a")
            deps = off.deps
            zero = frozenset(c for c in kmask if not em.cond_deps[c] <= off.deps)  # K has extent 1 here
        else:
            val = em.value(tensor, coords, mask)
            if val.is_literal:
                v, deps = f"tl.full({shape}, {val.expr}, tl.float32)", need
            else:
                v, deps = val.expr, val.deps
            zero = kmask
        km = em.mask_expr(zero)
        if km:
            deps = deps | em.mask_deps(zero)
            v = em.emit(f"tl.where({km}, {v}, 0.0)", deps)
        if self.dot_type != "tl.float32" and (km or tensor not in em.inputs):
            v = em.emit(f"({v}).to({self.dot_type})", deps)
        if self.tf32:
            v = em.emit(_TF32.format(x=v), deps)
        if not need <= deps:
            v = em.emit(f"tl.broadcast_to({v}, {shape})", need | deps)
        return v

    # ---- the epilogue ----------------------------------------------------------------------
    def epilogue(self, t: _Tile) -> None:
        """Every output from the accumulator, at its own indices (a reshape of the product's)."""
        em, g = t.em, self.graph
        em.known[(self.root.outputs[0], tuple(i.expr for i in t.coords))] = \
            Val("acc", self.tc.dtype, frozenset({"b", "m", "n"}))
        for o in self.outputs:
            ty = g.types[o]
            oc = ix.reshape_index(t.coords, self.tc.shape, ty.shape)
            flat = em.index_var(ix.ravel_stored(oc, ty.shape, ty.layout))
            if not {"m", "n"} <= flat.deps:  # a size-1 M or N: the store still covers the tile (masked)
                deps = flat.deps | {"m", "n"}
                flat = Ix(em.emit(f"tl.broadcast_to({flat.expr}, [BLOCK_M, BLOCK_N])", deps, "i"), None, None, deps)
            v = em.value(o, oc, t.mask)
            t.k.store(o, flat, v, t.mask, "[BLOCK_M, BLOCK_N]", frozenset({"m", "n"}))


def _function(fn: str, params: str, t: _Tile, extra: Sequence[str] = ()) -> list[str]:
    """One @triton.jit function: the tile's header (and `extra` lines after it), then its body."""
    body: list[str] = []
    render(t.em.stack[0], "    ", body)
    consts = ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr"]
    return ["@triton.jit", f"def {fn}({params}, {', '.join(consts)}):"] + \
        [f"    {h}" for h in [*t.header, *extra]] + body


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
    shape = tp.tc.shape
    tiles = _cdiv(tp.m, s.block_m) * _cdiv(tp.n, s.block_n)
    meta = (("BLOCK_M", s.block_m), ("BLOCK_N", s.block_n), ("BLOCK_K", s.block_k), ("GROUP_M", s.group_m),
            ("num_warps", s.num_warps), ("num_stages", s.num_stages))
    main = tp.kernel()
    t = _Tile(main, shape, s)
    ins = [f"in{i}" for i in range(len(main.inputs))]
    outs = list(main.out_args.values())
    funcs: list[list[str]] = []
    launches: list[Launch] = []
    workspace = 0
    if s.split_k > 1:
        chunk = _cdiv(_cdiv(tp.k, s.split_k), s.block_k) * s.block_k
        workspace = s.split_k * tp.batch * tp.m * tp.n
        params = ", ".join(ins + ["ws"] + outs)
        part = _Tile(tp.kernel(), shape, s)
        tp.mainloop(part, chunk, split=True)
        m = part.em.mask_expr(part.mask)
        part.em.stmt(f"tl.store(ws + {part.workspace_offset('pid_k')}, acc" + (f", mask={m})" if m else ")"))
        funcs.append(_function(f"{fn}_partial", params, part, ["pid_k = tl.program_id(2)"]))
        launches.append(Launch(f"{fn}_partial", (tiles, tp.batch, s.split_k), meta))
        # Second pass: the slices summed in order (no atomics: the same bits every run), then the epilogue.
        em = t.em
        m = em.mask_expr(t.mask)
        em.stmt("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        em.push(f"for split in range({s.split_k}):", "split")
        em.stmt(f"acc += tl.load(ws + {t.workspace_offset('split')}" + (f", mask={m}, other=0.0)" if m else ")"))
        em.pop()
        tp.epilogue(t)
        funcs.append(_function(fn, params, t))
        launches.append(Launch(fn, (tiles, tp.batch), meta))
        form = f"split-K GEMM template ({s.split_k} slices of {chunk}, then sum and epilogue)"
    else:
        params = ", ".join(ins + outs)
        tp.mainloop(t, tp.k, split=False)
        tp.epilogue(t)
        funcs.append(_function(fn, params, t))
        launches.append(Launch(fn, (tiles, tp.batch), meta))
        form = "GEMM template"
    src = "\n".join(["import triton", "import triton.language as tl", "", ""]
                    + _doc(graph, name, form, tp, main, sources, workspace)
                    + [line for f in funcs for line in f + ["", ""]]).rstrip() + "\n"
    return KernelSource(fn, src, main.inputs, main.outputs, tp.batch * tp.m * tp.n, tp.k, s,
                        [n.name for n in nodes], launches=launches, workspace=workspace)


def _doc(graph: Graph, name: str, form: str, tp: _Template, k: KernelBody, sources: Sequence[str],
         workspace: int) -> list[str]:
    """The header: what the kernel computes, from which primitives and ONNX nodes, and its roofline."""
    g, root = graph, tp.root
    reach = _reach(tp)
    epi = [n for n in tp.nodes if n is not root and any(t in reach for t in n.inputs)]
    pro = [n for n in tp.nodes if n is not root and n not in epi]
    a, b = root.inputs
    math = tp.precision.split('"')[1] if tp.precision else g.types[a].dtype.value
    doc = [f"# tessera kernel {name}: {form}, batch {tp.batch} x M {tp.m} x N {tp.n} x K {tp.k}, "
           f"{math} products, fp32 accumulation",
           f"# matmul: {root.name} ({g.types[a]} @ {g.types[b]} -> {g.types[root.outputs[0]]})"]
    doc += textwrap.wrap("epilogue: " + (", ".join(f"{n.name} ({n.op})" for n in epi) or "none"), 100,
                         initial_indent="# ", subsequent_indent="#   ")
    if pro:
        doc += textwrap.wrap("operand/epilogue prologue: " + ", ".join(f"{n.name} ({n.op})" for n in pro), 100,
                             initial_indent="# ", subsequent_indent="#   ")
    if sources:
        doc += textwrap.wrap("ONNX nodes: " + ", ".join(sources), 100, initial_indent="# ",
                             subsequent_indent="#   ")
    doc += [f"# in{i}: {t} {g.types[t]}" for i, t in enumerate(k.inputs)]
    if workspace:
        doc.append(f"# ws: float32[{workspace}] split-K partial sums")
    doc += [f"# {arg}: {t} {g.types[t]}" for t, arg in k.out_args.items()]
    rd = sum(g.types[t].nbytes for t in k.inputs)
    wr = sum(g.types[t].nbytes for t in k.outputs)
    doc.append(f"# work: {2 * tp.batch * tp.m * tp.n * tp.k} FLOP; memory: reads {rd} B, writes {wr} B"
               + (f", workspace {8 * workspace} B" if workspace else "")
               + "; the roofline is the larger of the two at full rate")
    return doc


def _reach(tp: _Template) -> set[str]:
    """Tensors computed from the product (the epilogue's)."""
    reach = {tp.root.outputs[0]}
    for n in tp.nodes:
        if n is not tp.root and any(t in reach for t in n.inputs):
            reach.update(n.outputs)
    return reach
