"""Convolution template: a 2-D convolution kernel as one generated Triton kernel with its epilogue fused (Bolt).

Implicit GEMM. A convolution y[n, o, oh, ow] = sum over (c, kh, kw) of
x[n, g*Cg + c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] * w[o, c, kh, kw] is a GEMM whose M is
the output pixels (N x OH x OW), whose N is the output channels of a group (Og), and whose K is
the window (Cg x KH x KW). A program owns a BLOCK_M pixels x BLOCK_N channels tile (the GEMM
template's tile, `codegen/tile.py`, with a grouped convolution's groups along the grid's second
axis: a batch of per-group GEMMs) and gathers its operand tiles straight from x and w, so no
im2col buffer and no padded copy exist: zero padding is the load mask (a tap outside the image
reads 0). K is walked one of two ways, derived from the problem and BLOCK_K:
- *by channel blocks*: one step per (kh, kw, block of BLOCK_K input channels); the tap is a
  scalar per step, so the window costs no per-element index math and a channels-last input is
  read in contiguous runs. Taken unless it needs FLAT_SLACK times the flat walk's steps: wide
  channel counts take it;
- *flat*: K steps of BLOCK_K over the window raveled (channels innermost for a channels-last
  input, kw innermost otherwise), for few channels per group (an RGB input: Cg = 3, a 9x9
  window) where per-tap blocks would be mostly padding.
Operands are dotted as in the GEMM template: IEEE fp32, tf32 (operands rounded), fp16 or bf16,
accumulating in fp32.

Direct form, on the CUDA cores in fp32, with no `tl.dot`: a [BLOCK_M pixels, BLOCK_N channels]
tile loops over the window (and over the input channels of a group), each step a multiply-add of
an input tile by a [1, BLOCK_N] weight row. It is the only form of a depthwise convolution (one
input channel per group, output channel o reading input channel o // multiplier: a [BLOCK_M,
BLOCK_N] input tile per tap), and a second form of a convolution with few output channels per
group (at most DIRECT_MAX_OUT), where an implicit GEMM pads N to a tensor-core tile and wastes
most of it: candy's last convolution, 32 -> 3 channels over a 9x9 window, multiplies a [BLOCK_M,
1] column of one input channel by a row of 3 weights per step. The schedule picks the form
(block_k 0 is the direct form); measurement picks the schedule.

Addresses. Every tensor is addressed in the storage order its type carries (NCHW, NHWC or any
other). Operand pointers are set up before the K loop (the pixel part of x's address and the
channel lanes); each step adds one offset, a scalar tap and channel block or the flat lanes'
window offsets, so the gather costs one add per element. A weight that a free prologue computes
(a transpose of a constant stored in another order) is computed at the tile's indices instead,
without a copy.
Channel and pixel remainders are masked: a 3-channel output needs no padding.

Epilogue. Every primitive computed from the convolution (bias per channel, activations,
residual adds, casts, several outputs) runs on the accumulator through the shared emitter, as
in the GEMM template: y is a known value (the accumulator) at the tile's (n, o, oh, ow).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tessera.codegen import index as ix
from tessera.codegen.index import Ix
from tessera.codegen.gemm import split_k_options
from tessera.codegen.kernels import ConvSchedule, KernelBody, KernelSource, Launch, sanitize
from tessera.codegen.tile import (DOT_TYPES, GRID_Y_MAX, MIN_BLOCK, Tile, cdiv, check_outputs, describe, dot_math,
                                  dot_operand, jit_function, pow2, store_outputs, sum_slices)
from tessera.codegen.triton_ops import Unsupported, Val, module_source
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType
from tessera.ir.prims import Category, Prim

# The hardware's tile menus, as for GEMM templates (Hidet): cut to a problem, never grown for it.
# Implicit GEMM: (block_m pixels, block_n channels, block_k for 4-byte operands, num_warps, num_stages);
# 2-byte operands take twice the K step.
TILES = (
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (64, 64, 32, 4, 3), (256, 64, 32, 8, 3),
    (128, 32, 32, 4, 3), (64, 32, 32, 4, 4), (32, 64, 32, 4, 4), (32, 32, 32, 2, 4), (64, 16, 64, 2, 4),
    (16, 64, 64, 2, 4),
)
# Direct form: (block_m pixels, block_n channels, num_warps). Depthwise tiles span many channels;
# tiles for few output channels span them all (block_n grows to cover them) and trade pixels per
# thread (reuse of each weight row) against programs in flight.
DIRECT_TILES = ((64, 64, 4), (128, 32, 4), (32, 128, 4), (256, 16, 4), (128, 64, 8), (16, 256, 4), (32, 32, 2))
FEW_OUT_TILES = ((32, 16, 1), (64, 16, 1), (128, 16, 1), (128, 16, 2), (256, 16, 2), (256, 16, 4), (512, 16, 4))
DIRECT_MIN_CHANNELS = 4  # 16 bytes of fp32 channels per pixel: a narrower channel block buys nothing
DIRECT_MAX_OUT = 16  # output channels per group up to which a multi-channel convolution also takes the direct form
CONSTS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
SMEM_BYTES = 227 << 10  # an H100's shared memory per block: pipelines deeper than fit are cut
K_WIDTHS = (1, 2)  # K steps of the menu's width and twice it (fp16 convolutions often run best at 128)
FLAT_SLACK = 1.25  # channel-block steps may outnumber flat steps by this much and still be preferred


@dataclass(frozen=True)
class ConvProblem:
    """A 2-D convolution's sizes: x [n, c, h, w] * w [o, c/groups, kh, kw] -> y [n, o, oh, ow]."""

    n: int
    c: int
    h: int
    w: int
    o: int
    oh: int
    ow: int
    kh: int
    kw: int
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, left, bottom, right
    dilations: tuple[int, int]
    groups: int

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def m(self) -> int:
        """Output pixels: the GEMM's M."""
        return self.n * self.oh * self.ow

    @property
    def k(self) -> int:
        """The window: the GEMM's K."""
        return self.cg * self.kh * self.kw

    @property
    def depthwise(self) -> bool:
        """One input channel per group (with or without a multiplier): the direct form only."""
        return self.cg == 1

    @property
    def takes_direct(self) -> bool:
        """Whether the direct form applies: depthwise, or few output channels per group."""
        return self.cg == 1 or self.og <= DIRECT_MAX_OUT

    def by_channels(self, block_k: int) -> bool:
        """Walk K by channel blocks per window tap (else flat): unless that pads much more."""
        return self.kh * self.kw * cdiv(self.cg, block_k) <= FLAT_SLACK * cdiv(self.k, block_k)

    def steps(self, block_k: int) -> int:
        """K steps of one tile."""
        if self.by_channels(block_k):
            return self.kh * self.kw * cdiv(self.cg, block_k)
        return cdiv(self.k, block_k)


def conv_root(nodes: Sequence[Node]) -> Node | None:
    """The kernel's 2-D convolution, if it has exactly one linear primitive and that is one
    (the template's anchor)."""
    linear = [n for n in nodes if Prim(n.op).category is Category.LINEAR]
    if len(linear) != 1 or linear[0].op != Prim.CONV.value or len(linear[0].attrs["strides"]) != 2:
        return None
    return linear[0]


def conv_problem(graph: Graph, root: Node) -> ConvProblem:
    """The sizes of 2-D convolution primitive `root`."""
    xs, ws, ys = (graph.types[t].shape for t in (*root.inputs[:2], root.outputs[0]))
    a = root.attrs
    return ConvProblem(xs[0], xs[1], xs[2], xs[3], ws[0], ys[2], ys[3], ws[2], ws[3], tuple(a["strides"]),
                       tuple(a["pads"]), tuple(a["dilations"]), int(a["group"]))


def channels_innermost(x: TensorType, p: ConvProblem) -> bool:
    """x stores a pixel's channels innermost (channels-last), so a flat K walk ravels the window
    with channels innermost and a tile's loads run along channels."""
    return x.strides[1] == 1 and p.c > 1


def conv_schedules(p: ConvProblem, itemsize: int = 4, sms: int = 132) -> list[ConvSchedule]:
    """A problem's template schedules: the tile menu of its form cut to the problem (blocks no
    larger than the next power of two of each extent; a K step no wider than the window, or than
    the channels of a group, which the channel-block walk favours), plus split-K where the output
    tiles leave SMs idle (fewer than `sms`) and each slice of the K walk stays long, as for GEMM
    templates (ResNet-50's last stage: 49 pixels, a few dozen tiles, a 4608-long window).
    Each tile takes the menu's K step and twice it (`K_WIDTHS`). Deduplicated. In session 24's
    probe of ResNet-50's and Inception-v3's convolutions (`scripts/conv_sweep_probe.py`), the
    best of this space was within 1% of the best of a wider sweep, geomean (6% before the second
    K step and 4 warps for 64 x 32 tiles)."""
    out: list[ConvSchedule] = []
    if p.takes_direct:
        for bm, bn, warps in DIRECT_TILES if p.depthwise else FEW_OUT_TILES:
            bm, bn = min(bm, max(MIN_BLOCK, pow2(p.m))), min(bn, max(DIRECT_MIN_CHANNELS, pow2(p.o)))
            warps = max(1, min(warps, bm * bn // 128))  # at least 4 outputs per thread
            tm, tn = cdiv(p.m, bm), cdiv(p.o, bn)
            out.append(ConvSchedule(bm, bn, 0, warps, 1, 8 if tm > 1 and tn > 1 else 1))
    if p.depthwise:
        return list(dict.fromkeys(out))
    for bm, bn, bk, warps, stages in TILES:
        bm, bn = min(bm, max(MIN_BLOCK, pow2(p.m))), min(bn, max(MIN_BLOCK, pow2(p.og)))
        warps = min(warps, max(2, bm * bn // 512))  # 4 warps from 64 x 32 up: each SM sub-partition gets one
        tm, tn = cdiv(p.m, bm), cdiv(p.og, bn)
        group = 8 if tm > 1 and tn > 1 else 1  # swizzling one row or column of tiles changes nothing
        tiles = p.groups * tm * tn
        for wide in K_WIDTHS:
            step = bk * wide * 4 // max(1, min(itemsize, 4))
            for k in dict.fromkeys((min(step, max(MIN_BLOCK, pow2(p.k))), min(step, max(MIN_BLOCK, pow2(p.cg))))):
                deepest = SMEM_BYTES // ((bm + bn) * k * itemsize)  # operand stages that fit in shared memory
                if deepest < 2:
                    continue
                depth = min(stages, deepest)
                out.append(ConvSchedule(bm, bn, k, warps, min(depth, max(2, p.steps(k))), group))
                for split, chunk in split_k_options(tiles, p.steps(k), k, sms):
                    out.append(ConvSchedule(bm, bn, k, warps, min(depth, max(2, chunk)), group, split))
    return list(dict.fromkeys(out))


class _Conv:
    """Shared state of one convolution template generation."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node,
                 s: ConvSchedule, precision: str) -> None:
        self.graph, self.nodes, self.outputs, self.root, self.s = graph, list(nodes), list(outputs), root, s
        self.x, self.w = root.inputs[:2]
        self.y = root.outputs[0]
        self.xt, self.wt = graph.types[self.x], graph.types[self.w]
        self.p = p = conv_problem(graph, root)
        self.direct_form = s.block_k == 0
        if p.depthwise and not self.direct_form:
            raise Unsupported(f"{root.name}: a depthwise convolution takes the direct form (block_k 0): {s}")
        if s.split_k > 1 and (self.direct_form or s.split_k > p.steps(s.block_k)):
            steps = p.steps(s.block_k) if s.block_k else 0
            raise Unsupported(f"{root.name}: split-K splits an implicit GEMM's walk of {steps} K steps: {s}")
        if self.direct_form:
            if not p.takes_direct:
                raise Unsupported(f"{root.name}: the direct form takes depthwise convolutions or at most "
                                  f"{DIRECT_MAX_OUT} output channels per group, not {p.og}: {s}")
            if self.xt.dtype != self.wt.dtype or self.xt.dtype not in DOT_TYPES:
                raise Unsupported(f"{root.name}: a convolution template multiplies fp32, fp16 or bf16, "
                                  f"not {self.xt.dtype.value} x {self.wt.dtype.value}")
            self.math = None
            blocks = (s.block_m, s.block_n)
        else:
            self.math = dot_math(self.xt.dtype, self.wt.dtype, precision, f"{root.name}: a convolution template")
            blocks = (s.block_m, s.block_n, s.block_k)
            if min(blocks) < MIN_BLOCK:
                raise Unsupported(f"implicit-GEMM blocks must be >= {MIN_BLOCK}: {s}")
        if any(b < 1 or b & (b - 1) for b in blocks):
            raise Unsupported(f"convolution blocks must be powers of two: {s}")
        if p.groups > GRID_Y_MAX:
            raise Unsupported(f"{root.name}: {p.groups} groups exceed the grid")
        check_outputs(graph, nodes, outputs, self.y, "convolution", "convolution")

    def weight_layout(self, k: KernelBody) -> tuple[int, ...] | None:
        """The storage order this kernel reads its constant weight in, where that is not the
        graph's, else None. An [O, C, KH, KW] weight gathered per tap with channels innermost would
        be read with a stride of KH*KW along K, so those walks read a copy stored (O, KH, KW, C):
        K-contiguous per output channel. The direct form reads one step's row of output channels:
        (KH, KW, C, O). Only a constant that the convolution alone reads is copied."""
        p = self.p
        if self.w not in k.em.inputs or self.w not in self.graph.constants \
                or any(self.w in n.inputs for n in self.nodes if n is not self.root):
            return None
        if self.direct_form:
            want: tuple[int, ...] = (2, 3, 1, 0)
        elif p.by_channels(self.s.block_k) or channels_innermost(self.xt, p):
            want = (0, 2, 3, 1)
        else:
            return None
        moved = TensorType(self.wt.shape, self.wt.dtype, want)
        if all(a == b or n == 1 for a, b, n in zip(moved.strides, self.wt.strides, self.wt.shape)):
            # the same memory order (a 1x1 window): size-1 dims never move an address
            return None
        self.wt = moved
        return want

    # ---- indices ---------------------------------------------------------------------------
    def pixels(self, t: Tile) -> list[Ix]:
        """(n, oh, ow) of the tile's rows."""
        p = self.p
        return ix.unravel(t.rm, [p.n, p.oh, p.ow])

    def window(self, t: Tile, pix: list[Ix], kh: Ix, kw: Ix) -> tuple[list[Ix], list[Ix], frozenset[str]]:
        """Where a tap (kh, kw) reads for each pixel: the window's origin (ih0, iw0), the input
        position (ih, iw), and the conditions that keep the position inside the image (the zero
        padding, as a mask)."""
        em, p = t.em, self.p
        _, oh, ow = pix
        bases, coords, conds = [], [], []
        dims = ((oh, kh, p.h, p.oh, p.strides[0], p.pads[0], p.dilations[0], p.kh),
                (ow, kw, p.w, p.ow, p.strides[1], p.pads[1], p.dilations[1], p.kw))
        for o, k, size, out, stride, pad, dil, kn in dims:
            base = em.index_var(ix.add_const(ix.mul(o, stride), -pad))
            pos = ix.add(base, ix.mul(k, dil))
            checks = ([">= 0"] if pad else []) + ([f"< {size}"] if (out - 1) * stride + (kn - 1) * dil - pad >= size
                                                    else [])
            if checks:
                pos = em.index_var(pos)
                conds.append(em.cond(" & ".join(f"({pos.expr} {c})" for c in checks), pos.deps))
            bases.append(base)
            coords.append(Ix(pos.expr, pos.const, None, pos.deps))
        return bases, coords, frozenset(conds)

    def pointer(self, t: Tile, tensor: str, fixed: Ix, moving: Ix) -> Ix | None:
        """The addresses of `tensor` (None when a free prologue computes it): its pointer plus the
        offset `fixed`, which the emitter places as far out of the K loop as its lanes allow, plus
        this step's `moving` offset (one add per element per step)."""
        em = t.em
        if tensor not in em.inputs:
            return None
        fixed = em.index_var(fixed)
        base = Ix(em.emit(f"{em.inputs[tensor]} + {fixed.expr}" if fixed.const != 0 else em.inputs[tensor],
                          fixed.deps, "p"), None, None, fixed.deps)
        if moving.const == 0:
            return base
        moving = em.index_var(moving)
        return Ix(em.emit(f"{base.expr} + {moving.expr}", base.deps | moving.deps, "p"), None, None,
                  base.deps | moving.deps)

    def x_pointer(self, t: Tile, n: Ix, bases: list[Ix], fixed: Sequence[Ix], moving: Sequence[Ix]) -> Ix | None:
        """x's addresses at (n, c, ih0 + kh*dh, iw0 + kw*dw): the pixel part (n, ih0, iw0) and the
        (c, kh, kw) terms in `fixed` before the loop, those in `moving` per step (a term of the other
        group is 0)."""
        xt, p = self.xt, self.p
        sn, sc, sh, sw = xt.strides
        scales = (sc, p.dilations[0] * sh, p.dilations[1] * sw)
        if any(p.pads[:2]):  # a window origin may lie outside the image: its address is linear, not raveled
            pix = _linear([n, *bases], (sn, sh, sw))
        else:
            pix = ix.ravel_stored([n, Ix.of(0), *bases], xt.shape, xt.layout)
        return self.pointer(t, self.x, _linear(list(fixed), scales, pix), _linear(list(moving), scales))

    def w_pointer(self, t: Tile, fixed: Sequence[Ix], moving: Sequence[Ix]) -> Ix | None:
        """w's addresses at (o, c, kh, kw), the terms split as in `x_pointer` (raveled: flat K in
        w's own order is one index)."""
        wt = self.wt
        return self.pointer(t, self.w, ix.ravel_stored(list(fixed), wt.shape, wt.layout),
                            ix.ravel_stored(list(moving), wt.shape, wt.layout))

    # ---- implicit GEMM ---------------------------------------------------------------------
    def implicit(self, t: Tile) -> list[Ix]:
        """acc = the tile's convolution as a GEMM over the window (over this program's slice of the
        K walk, `pid_k` of split_k, when split); returns y's coordinates."""
        em, s, p, g = t.em, self.s, self.p, self.graph
        split = s.split_k
        assert self.math is not None
        n, oh, ow = pix = self.pixels(t)
        grp = t.batch[0] if p.groups > 1 else Ix.of(0)
        o = ix.add(ix.mul(grp, p.og), t.rn)
        cbase = ix.mul(grp, p.cg)
        em.stmt("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        tag = em.fresh("k")
        ka, kb = frozenset({tag}), frozenset({tag + "b"})  # K along x's tile columns, and along w's rows
        z = Ix.of(0)
        if p.by_channels(s.block_k):
            # Lanes are channels c0 + j: the j part is set once, before the loop; the tap and c0
            # are per-step scalars.
            ka, kb, ks = frozenset({tag + "a"}), frozenset({tag + "b"}), frozenset({tag + "s"})
            em.stack[0].avail = em.stack[0].avail | ka | kb
            ja = Ix(em.emit("tl.arange(0, BLOCK_K)[None, :]", ka, "rc"), None, s.block_k, ka)
            jb = Ix(em.emit("tl.arange(0, BLOCK_K)[:, None]", kb, "rc"), None, s.block_k, kb)
            blocks = cdiv(p.cg, s.block_k)
            steps = p.kh * p.kw * blocks
            chunk = cdiv(steps, split)  # this program's steps (all of them, unsplit)
            em.push(f"for {tag} in range({chunk}):", tag)
            em.stack[-1].avail = em.stack[-1].avail | ks
            if split > 1:
                step = em.index_var(Ix(f"pid_k * {chunk} + {tag}", None, chunk * split, ks))
            else:
                step = Ix(tag, None, steps, ks) if steps > 1 else Ix.of(0)
            kh = em.index_var(ix.floordiv(step, p.kw * blocks))
            kw = em.index_var(ix.mod(ix.floordiv(step, blocks), p.kw))
            c0 = em.index_var(ix.mul(ix.mod(step, blocks), s.block_k))
            kma = kmb = frozenset()
            if chunk * split != steps:  # the last slice is short: its steps past the walk load nothing
                live = em.cond(f"{step.expr} < {steps}", ks)
                kma = kmb = frozenset({live})
            if p.cg % s.block_k:  # the last block of channels is ragged
                left = em.index_var(Ix(f"{p.cg} - {c0.expr}", None, None, c0.deps)) if c0.const is None else Ix.of(p.cg)
                kma = kma | {em.cond(f"{ja.expr} < {left.expr}", ka | left.deps)}
                kmb = kmb | {em.cond(f"{jb.expr} < {left.expr}", kb | left.deps)}
            ca, cb = ix.add(c0, ja), ix.add(c0, jb)
            bases, (ih, iw), pad = self.window(t, pix, kh, kw)
            xptr = self.x_pointer(t, n, bases, [ix.add(cbase, ja), z, z], [c0, kh, kw])
            wptr = self.w_pointer(t, [o, jb, z, z], [z, c0, kh, kw])
            kha = khb = kh
            kwa = kwb = kw
        else:
            chunk = cdiv(cdiv(p.k, split), s.block_k) * s.block_k  # this program's window elements
            em.push(f"for {tag} in range(0, {chunk}, BLOCK_K):", tag)
            em.stack[-1].avail = em.stack[-1].avail | kb
            start = f"pid_k * {chunk} + {tag}" if split > 1 else tag
            rka = Ix(em.emit(f"{start} + tl.arange(0, BLOCK_K)[None, :]", ka, "rk"), None, p.k, ka)
            rkb = Ix(em.emit(f"{start} + tl.arange(0, BLOCK_K)[:, None]", kb, "rk"), None, p.k, kb)
            ragged = p.k % s.block_k != 0 or chunk * split != p.k
            kma = frozenset({em.cond(f"{rka.expr} < {p.k}", ka)}) if ragged else frozenset()
            kmb = frozenset({em.cond(f"{rkb.expr} < {p.k}", kb)}) if ragged else frozenset()
            ca, kha, kwa = (em.index_var(i) for i in self.window_coords(rka))
            cb, khb, kwb = self.window_coords(rkb)
            bases, (ih, iw), pad = self.window(t, pix, kha, kwa)
            xptr = self.x_pointer(t, n, bases, [cbase, z, z], [ca, kha, kwa])
            wptr = self.w_pointer(t, [o, z, z, z], [z, cb, khb, kwb])
        mt = self.math
        a = dot_operand(t, g, mt, self.x, [n, ix.add(cbase, ca), ih, iw], t.mmask | kma | pad, kma | pad,
                        "[BLOCK_M, BLOCK_K]", {"m"} | ka, xptr)
        b = dot_operand(t, g, mt, self.w, [o, cb, khb, kwb], kmb | t.nmask, kmb, "[BLOCK_K, BLOCK_N]", kb | {"n"},
                        wptr)
        em.stmt(f"acc = tl.dot({a}, {b}, acc{mt.precision})")
        em.pop()
        return [n, o, oh, ow]

    def window_coords(self, rk: Ix) -> tuple[Ix, Ix, Ix]:
        """(c, kh, kw) of flat K positions: channels innermost where x stores them innermost (a
        contiguous run per tap), kw innermost otherwise."""
        p = self.p
        if channels_innermost(self.xt, p):
            kh, kw, c = ix.unravel(rk, [p.kh, p.kw, p.cg])
            return c, kh, kw
        c, kh, kw = ix.unravel(rk, [p.cg, p.kh, p.kw])
        return c, kh, kw

    # ---- direct (CUDA cores) ---------------------------------------------------------------
    def direct(self, t: Tile) -> list[Ix]:
        """acc = the tile's convolution, one step per input channel of the group and window tap;
        returns y's coordinates. Channels are the outermost loop, so consecutive steps read
        neighbouring pixels of one channel (L1 hits). Measured on the H100 (candy's 32 -> 3
        channels 9x9, tf32, `scripts/results/conv_probe/`): 84 µs this way, 91 µs with channels
        innermost, where each step re-reads a pixel column 200 KB away."""
        em, p = t.em, self.p
        n, oh, ow = pix = self.pixels(t)
        o = t.rn
        z = Ix.of(0)
        # The group's first input channel: per output channel lane (o // og: the multiplier of a
        # depthwise convolution), or 0 with one group.
        c0 = ix.mul(ix.floordiv(o, p.og), p.cg) if p.groups > 1 else z
        em.stmt("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        loops: list[Ix] = []
        for extent, name in ((p.cg, "c"), (p.kh, "w"), (p.kw, "w")):
            if extent == 1:
                loops.append(z)
                continue
            tag = em.fresh(name)
            em.push(f"for {tag} in range({extent}):", tag)
            loops.append(Ix(tag, None, extent, frozenset({tag})))
        ci, kh, kw = loops
        c = ix.add(c0, ci)
        bases, (ih, iw), pad = self.window(t, pix, kh, kw)
        mask = t.mmask | (t.nmask if p.groups > 1 else frozenset()) | pad
        xptr = self.x_pointer(t, n, bases, [c0, z, z], [ci, kh, kw])
        if xptr is not None:
            m = em.mask_expr(mask, xptr.deps)
            wide = "" if self.xt.dtype is DType.FLOAT32 else ".to(tl.float32)"
            xv = em.emit(f"tl.load({xptr.expr}" + (f", mask={m}, other=0.0)" if m else ")") + wide, xptr.deps, "a")
        else:  # computed by a free prologue: its padding lanes are zeroed here
            val = em.value(self.x, [n, c, ih, iw], mask)
            valid = em.mask_expr(pad)
            xv = em.emit(f"tl.where({valid}, {val.expr}, 0.0)" if valid else val.expr, val.deps | em.mask_deps(pad))
        wptr = self.w_pointer(t, [o, z, z, z], [z, ci, kh, kw])
        if wptr is not None:
            m = em.mask_expr(t.nmask, wptr.deps)
            wide = "" if self.wt.dtype is DType.FLOAT32 else ".to(tl.float32)"
            wv = em.emit(f"tl.load({wptr.expr}" + (f", mask={m}, other=0.0)" if m else ")") + wide, wptr.deps, "a")
        else:
            wv = em.value(self.w, [o, ci, kh, kw], t.nmask).expr
        em.stmt(f"acc += {xv} * {wv}")
        for lp in loops:
            if lp.const is None:
                em.pop()
        return [n, o, oh, ow]


def _linear(coords: list[Ix], scales: Sequence[int], start: Ix | None = None) -> Ix:
    """start + sum of coords[i] * scales[i] (an address: linear, so it splits into parts freely)."""
    out = start if start is not None else Ix.of(0)
    for c, k in zip(coords, scales):
        out = ix.add(out, ix.mul(c, k))
    return out


def generate_conv(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], name: str, schedule: ConvSchedule,
                  sources: Sequence[str] = (), precision: str = "fp32") -> KernelSource:
    """The template kernel computing `outputs` of a convolution kernel (`nodes`: its 2-D
    convolution, its epilogue and its free prologue) under `schedule`; `precision` is the plan's
    (tf32 makes fp32 dots tf32).

    Raises `Unsupported` when the kernel has no template form: no single 2-D convolution,
    operands that are not fp32/fp16/bf16, an output of another size than the convolution's, an
    epilogue that reads the convolution at other indices than its own, or a schedule of the
    other form (block_k 0 is the direct form's, of depthwise convolutions).
    """
    root = conv_root(nodes)
    if root is None:
        raise Unsupported("a convolution template needs exactly one 2-D convolution")
    s = schedule
    cv = _Conv(graph, nodes, outputs, root, s, precision)
    p = cv.p
    k = KernelBody(graph, nodes, outputs)
    relayout = cv.weight_layout(k)
    shape = (p.m, p.o) if cv.direct_form else ((p.groups, p.m, p.og) if p.groups > 1 else (p.m, p.og))
    t = Tile(k, shape, s)
    coords = cv.direct(t) if cv.direct_form else cv.implicit(t)
    tiles = cdiv(p.m, s.block_m) * cdiv(shape[-1], s.block_n)
    workspace, extra, grid = 0, [], (tiles, t.nbatch)
    if s.split_k > 1:  # the GEMM template's one-launch split (codegen/gemm.py): the tile's last program sums
        workspace = sum_slices(t, "pid_k", s.split_k, p.groups * p.m * p.og, tiles * t.nbatch)
        summed = Val("tot", graph.types[cv.y].dtype, frozenset({"b", "m", "n", "fix"}))
        store_outputs(t, graph, outputs, cv.y, coords, summed)  # inside the last program's block
        t.em.pop()
        extra, grid = ["pid_k = tl.program_id(2)"], (tiles, t.nbatch, s.split_k)
    else:
        store_outputs(t, graph, outputs, cv.y, coords)
    fn = sanitize(name)
    params = ", ".join([f"in{i}" for i in range(len(k.inputs))] + (["ws"] if workspace else [])
                       + list(k.out_args.values()))
    consts = [c for c in CONSTS if c != "BLOCK_K" or not cv.direct_form]  # the direct form has no K step
    meta = tuple((c, getattr(s, c.lower())) for c in consts) + (("num_warps", s.num_warps),
                                                                 ("num_stages", s.num_stages))
    src = module_source(_doc(cv, name, k, sources, workspace)
                        + jit_function(fn, params, t, consts, extra))
    return KernelSource(fn, src, k.inputs, k.outputs, p.m * p.o, p.k, s, [n.name for n in nodes],
                        launches=[Launch(fn, grid, meta)], workspace=workspace,
                        input_layouts={cv.w: relayout} if relayout else {}, rounded_inputs=tuple(sorted(k.rounded)))


def _doc(cv: _Conv, name: str, k: KernelBody, sources: Sequence[str], workspace: int = 0) -> list[str]:
    """The header: what the kernel computes, from which primitives and ONNX nodes, and its roofline."""
    g, p, s, root = cv.graph, cv.p, cv.s, cv.root
    if cv.direct_form:
        kind = f"depthwise, channel multiplier {p.og}" if p.depthwise else f"{p.cg} input channels per group"
        form = (f"direct convolution template ({kind}: a window loop on the CUDA cores), pixels M {p.m} "
                f"(N {p.n} x {p.oh} x {p.ow}) x channels {p.o} x window {p.kh}x{p.kw}, fp32 math")
        padded = 2 * cdiv(p.m, s.block_m) * s.block_m * cdiv(p.o, s.block_n) * s.block_n * p.kh * p.kw * p.cg
    else:
        assert cv.math is not None
        walk = "K by channel blocks per tap" if p.by_channels(s.block_k) else "flat K"
        if s.split_k > 1:
            walk += (f", split-K: {s.split_k} programs per tile walk {cdiv(p.steps(s.block_k), s.split_k)} steps "
                     "each, the tile's last sums them in order and runs the epilogue")
        grouped = f", {p.groups} groups along the grid" if p.groups > 1 else ""
        form = (f"convolution template (implicit GEMM, {walk}), pixels M {p.m} (N {p.n} x {p.oh} x {p.ow}) x "
                f"channels N {p.og} x K {p.k} (Cg {p.cg} x {p.kh}x{p.kw}){grouped}, {cv.math.label} products, "
                "fp32 accumulation")
        padded = 2 * p.groups * cdiv(p.m, s.block_m) * s.block_m * cdiv(p.og, s.block_n) * s.block_n \
            * p.steps(s.block_k) * s.block_k
    a = root.attrs
    doc = [f"# tessera kernel {name}: {form}",
           f"# conv: {root.name} ({g.types[cv.x]} * {g.types[cv.w]} -> {g.types[cv.y]}), strides {list(a['strides'])}, "
           f"pads {list(a['pads'])}, dilations {list(a['dilations'])}, group {a['group']}"]
    if cv.wt != g.types[cv.w]:
        order = "".join("OCHW"[d] for d in cv.wt.layout)
        doc.append(f"# weight: read from a copy stored {order} (made once at load), not as the graph stores it")
    doc += describe(g, cv.nodes, root, k, sources, workspace)
    rd = sum(g.types[t].nbytes for t in k.inputs)
    wr = sum(g.types[t].nbytes for t in k.outputs)
    doc.append(f"# work: {2 * p.m * p.o * p.k} FLOP ({padded} with the tiles' padding); memory: reads {rd} B, "
               f"writes {wr} B" + (f", workspace {8 * workspace} B" if workspace else "")
               + "; the roofline is the larger of the two at full rate")
    return doc
