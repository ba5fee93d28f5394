"""The fuzzer's op generators for network ops: linear, conv, normalization, reduction, pooling,
resize, and opaque ops (no fission rule: tessera's fallback runs them). See `fuzzops.py`.
"""
from __future__ import annotations

import math

import numpy as np
from fuzzops import reduce_node
from fuzzspec import FLOAT, Builder, Draw, Tensor, bcast


# ---- linear ------------------------------------------------------------------------------
def matmul(d: Draw, b: Builder) -> None:
    kind = d.pick(["weight", "batched", "broadcast", "vector"])
    w: Tensor
    x = b.float_in(lambda t: t.rank >= (2 if kind != "vector" else 1))
    k = x.shape[-1]
    n = b.dim(1, max(1, b.cap // max(1, x.numel // k)))
    scale = 1 / math.sqrt(k)
    if kind == "weight" or x.rank < 2:
        w = b.const((k, n), FLOAT, scale=scale) if d.maybe(0.7) else b.add_input((k, n))
        out = x.shape[:-1] + (n,)
    elif kind == "batched":
        w = b.pick(lambda t: t.is_float and t.shape[:-1] == x.shape[:-2] + (k,) and t.rank == x.rank)
        if w is None:
            w = b.add_input(x.shape[:-2] + (k, n)) if d.maybe(0.5) else b.const(x.shape[:-2] + (k, n), scale=scale)
        out = x.shape[:-1] + (w.shape[-1],)
    elif kind == "broadcast":
        batch = b.partner(x.shape[:-2], allow_grow=True) if x.rank > 2 else (b.dim(1, 4),)
        w = b.const(batch + (k, n), FLOAT, scale=scale)
        out = bcast(x.shape[:-2], batch) + (x.shape[-2], n)
    else:  # x @ vector
        w = b.const((k,), FLOAT, scale=scale)
        out = x.shape[:-1]
    if kind == "weight" and x.rank >= 2 and d.maybe(0.25):  # the constant on the left: W [m, k] @ x [..., k, n]
        m = b.dim(1, max(1, b.cap // max(1, x.numel // x.shape[-2])))
        x, w = b.const((m, x.shape[-2]), FLOAT, scale=1 / math.sqrt(x.shape[-2])), x
        out = w.shape[:-2] + (m, w.shape[-1])
    if math.prod(out) > 2 * b.cap:
        return
    b.one("MatMul", [x, w], [(out, FLOAT)])


def einsum(d: Draw, b: Builder) -> None:
    """x contracted with a constant matrix over one of its axes, the result's axes in a drawn order
    (since session 51 Einsum lowers to a batched MATMUL between transposes). At times two axes of x of one
    size share a label: x's diagonal first (since session 58), that label kept once or summed (a trace)."""
    x = b.float_in()
    lx = list("abcdefgh"[:x.rank])  # (rank 5 and up too: a Pad and an Unsqueeze make them)
    c = d.int(0, x.rank - 1)
    pairs = [(i, j) for i in range(x.rank) for j in range(i + 1, x.rank) if x.shape[i] == x.shape[j]]
    traced = None
    if pairs and d.maybe(0.3):
        i, j = d.pick(pairs)
        lx[j] = lx[i]
        traced = lx[i] if d.maybe(0.5) and lx[i] != lx[c] else None
    n = b.dim(1, max(1, b.cap // max(1, x.numel // x.shape[c])))
    w = b.const((x.shape[c], n), FLOAT, scale=1 / math.sqrt(x.shape[c]))
    kept = [label for label in dict.fromkeys(lx) if label != lx[c] and label != traced] + ["z"]
    turn = d.int(0, len(kept) - 1)
    out_labels = kept[turn:] + kept[:turn]
    size = dict(zip(lx, x.shape)) | {"z": n}
    out = tuple(size[label] for label in out_labels)
    if math.prod(out) > 2 * b.cap:
        return
    lx = "".join(lx)
    b.one("Einsum", [x, w], [(out, FLOAT)], {"equation": f"{lx},{lx[c]}z->{''.join(out_labels)}"})


def gemm(d: Draw, b: Builder) -> None:
    ta, tb = d.maybe(0.3), d.maybe(0.4)
    a = b.float_in(lambda t: t.rank == 2, rank=2)
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = b.dim(1, max(1, b.cap // max(1, m)))
    bshape = (n, k) if tb else (k, n)
    w = b.const(bshape, FLOAT, scale=1 / math.sqrt(k)) if d.maybe(0.7) else b.add_input(bshape)
    attrs: dict = {}
    if ta:
        attrs["transA"] = 1
    if tb:
        attrs["transB"] = 1
    if d.maybe(0.3):
        attrs["alpha"] = d.pick([0.5, 2.0, -1.0])
    ins: list = [a, w]
    if d.maybe(0.7):
        cshape = d.pick([(n,), (1, n), (m, 1), (m, n), ()])
        ins.append(b.const(cshape, FLOAT) if d.maybe(0.7) else b.add_input(cshape))
        if d.maybe(0.3):
            attrs["beta"] = d.pick([0.5, 0.0, 2.0])
    b.one("Gemm", ins, [((m, n), FLOAT)], attrs)


# ---- convolutions --------------------------------------------------------------------------
def _image(d: Draw, b: Builder, rank: int = 4) -> Tensor:
    def ok(t: Tensor) -> bool:
        return t.is_float and t.rank == rank and t.shape[1] <= 32

    def make() -> Tensor:
        c = d.pick([3, 4, 1, 5, 8, 6, 12, 16])
        if b.big and rank == 4 and d.maybe(0.3):
            # Large planes; in a channels-last region, reductions over 32 planes of 128x32 split in
            # two levels (orchestrate/layout.py: _split_strided_reductions).
            return b.add_input(d.pick([(1, 4, 65, 65), (1, 32, 128, 32), (1, 3, 129, 65)]))
        sp = [b.dim(1, 17) if not (b.big and d.maybe(0.3)) else d.pick([33, 65]) for _ in range(rank - 2)]
        sp = [max(s, 2) for s in sp]
        return b.add_input((d.pick([1, 2]), c, *sp))

    t = b.pick(ok, make)
    assert t is not None
    return t


def _conv_out(size: int, k: int, s: int, dil: int, p0: int, p1: int) -> int:
    return (size + p0 + p1 - dil * (k - 1) - 1) // s + 1


def conv(d: Draw, b: Builder, x: Tensor | None = None) -> Tensor | None:
    x = x or _image(d, b, 4 if d.maybe(0.85) else 3)
    n, c, *sp = x.shape
    nd = len(sp)
    kind = d.pick(["plain", "depthwise", "pointwise", "grouped", "patchify"])
    group = 1
    if kind == "depthwise":
        group = c
    elif kind == "grouped":
        divs = [g for g in (2, 3, 4) if c % g == 0]
        group = d.pick(divs) if divs else 1
    o = group * d.pick([1, 2, 3]) if kind in ("depthwise", "grouped") else d.pick([4, 3, 8, 5, 16, 1, 6, 12])
    if kind == "pointwise":
        ks, strides, dils = [1] * nd, [1] * nd, [1] * nd
    elif kind == "patchify":
        p = d.pick([2, 4])
        ks = strides = [p] * nd
        dils = [1] * nd
        if any(s % p for s in sp):
            ks, strides = [1] * nd, [1] * nd
    else:
        ks = [d.pick([3, 1, 2, 5]) for _ in range(nd)]
        strides = [d.pick([1, 2]) for _ in range(nd)]
        dils = [d.pick([1, 1, 2]) for _ in range(nd)]
    attrs: dict = {}
    pads = [0] * (2 * nd)
    auto = "NOTSET"
    if kind in ("plain", "depthwise", "grouped"):
        if d.maybe(0.15) and all(x == 1 for x in dils):
            auto = d.pick(["SAME_UPPER", "SAME_LOWER", "VALID"])
            attrs["auto_pad"] = auto
        else:
            pads = [d.pick([0, 1, 2]) for _ in range(2 * nd)]
    outs = []
    for i in range(nd):
        span = dils[i] * (ks[i] - 1) + 1
        if auto.startswith("SAME"):
            outs.append(-(-sp[i] // strides[i]))
            continue
        if sp[i] + pads[i] + pads[i + nd] < span:
            return None
        outs.append(_conv_out(sp[i], ks[i], strides[i], dils[i], pads[i], pads[i + nd]))
    if any(s != 1 for s in strides):
        attrs["strides"] = strides
    if any(v != 1 for v in dils):
        attrs["dilations"] = dils
    if any(pads):
        attrs["pads"] = pads
    if group != 1:
        attrs["group"] = group
    if d.maybe(0.3):
        attrs["kernel_shape"] = ks
    w = b.const((o, c // group, *ks), FLOAT, scale=1 / math.sqrt(c // group * math.prod(ks)))
    ins: list = [x, w]
    if d.maybe(0.6):
        ins.append(b.const((o,), FLOAT, scale=0.5))
    return b.one("Conv", ins, [((n, o, *outs), FLOAT)], attrs)


def conv_transpose(d: Draw, b: Builder) -> None:
    x = _image(d, b, 4)
    n, c, h, w_ = x.shape
    group = c if d.maybe(0.2) else 1
    o = group * d.pick([1, 2, 3])
    ks = [d.pick([2, 3, 1]) for _ in range(2)]
    strides = [d.pick([1, 2]) for _ in range(2)]
    dils = [d.pick([1, 1, 2]) for _ in range(2)]
    out_pad = [d.int(0, s - 1) if s > 1 and d.maybe(0.3) else 0 for s in strides]
    out_pad = [min(p, max(s, dl) - 1) for p, s, dl in zip(out_pad, strides, dils)]
    pads = [d.pick([0, 1]) for _ in range(4)]
    outs = []
    for i, size in enumerate((h, w_)):
        e = strides[i] * (size - 1) + out_pad[i] + dils[i] * (ks[i] - 1) + 1 - pads[i] - pads[i + 2]
        if e < 1:
            return
        outs.append(e)
    attrs: dict = {"strides": strides, "pads": pads}
    if any(v != 1 for v in dils):
        attrs["dilations"] = dils
    if any(out_pad):
        attrs["output_padding"] = out_pad
    if group != 1:
        attrs["group"] = group
    wt = b.const((c, o // group, *ks), FLOAT, scale=1 / math.sqrt(c * math.prod(ks)))
    ins: list = [x, wt] + ([b.const((o,), FLOAT, scale=0.5)] if d.maybe(0.5) else [])
    b.one("ConvTranspose", ins, [((n, o, *outs), FLOAT)], attrs)


def conv_stack(d: Draw, b: Builder) -> None:
    """Convolutions with activations, a residual add, a pool or a norm between them: a region the
    layout pass may store channels-last (odd channel counts get padded channels)."""
    y = conv(d, b, _image(d, b, 4))
    for _ in range(d.int(1, 3)):
        if y is None:
            return
        step = d.pick(["relu", "conv", "add", "pool", "bn", "hardswish", "conv", "instnorm"])
        if step == "relu":
            y = b.one("Relu", [y], [(y.shape, FLOAT)])
        elif step == "hardswish" and b.opset >= 14:
            y = b.one("HardSwish", [y], [(y.shape, FLOAT)])
        elif step == "add":
            y = b.one("Add", [y, b.operand_like(y.shape, allow_grow=False)], [(y.shape, FLOAT)])
        elif step == "pool" and min(y.shape[2:]) >= 2:
            k = d.pick([2, 3])
            p = 1 if k == 3 else 0
            hs = [_conv_out(s, k, 2 if d.maybe(0.5) else 1, 1, p, p) for s in y.shape[2:]]
            st = 2 if hs[0] == _conv_out(y.shape[2], k, 2, 1, p, p) else 1
            hs = [_conv_out(s, k, st, 1, p, p) for s in y.shape[2:]]
            y = b.one("MaxPool", [y], [(y.shape[:2] + tuple(hs), FLOAT)],
                      {"kernel_shape": [k, k], "strides": [st, st], "pads": [p] * 4})
        elif step == "instnorm":
            c = y.shape[1]
            y = b.one("InstanceNormalization", [y, b.const((c,)), b.const((c,), scale=0.5)], [(y.shape, FLOAT)],
                      family="normalization")
        elif step == "bn":
            c = y.shape[1]
            ins = [y, b.const((c,)), b.const((c,)), b.const((c,), scale=0.5), b.const((c,), positive=True)]
            y = b.one("BatchNormalization", ins, [(y.shape, FLOAT)], family="normalization")
        else:
            y = conv(d, b, y)


# ---- normalization ---------------------------------------------------------------------------
def softmax(d: Draw, b: Builder) -> None:
    x = b.float_in()
    op = d.pick(["Softmax", "LogSoftmax"])
    axis = d.int(-x.rank, x.rank - 1) if x.rank else 0
    b.one(op, [x], [(x.shape, FLOAT)], {"axis": axis} if d.maybe(0.8) else {})


def layer_norm(d: Draw, b: Builder) -> None:
    x = b.float_in()
    a = d.int(-x.rank, x.rank - 1)
    k = a % x.rank
    norm = x.shape[k:]
    sshape = norm if d.maybe(0.7) else tuple(1 if d.maybe(0.5) else s for s in norm)[d.int(0, len(norm) - 1):]
    ins: list = [x, b.const(sshape)]
    if d.maybe(0.6):
        ins.append(b.const(sshape, scale=0.5))
    attrs: dict = {"axis": a}
    if d.maybe(0.2):
        attrs["epsilon"] = 1e-3
    outs = [(x.shape, FLOAT)]
    stat = x.shape[:k] + (1,) * (x.rank - k)
    if d.maybe(0.2):
        outs += [(stat, FLOAT)] * d.int(1, 2)
    b.node("LayerNormalization", ins, outs, attrs)


def norm_projection(d: Draw, b: Builder) -> None:
    """A pre-norm projection: LayerNorm or RMSNorm over the last axis (of a residual sum, at times),
    then a matmul with a constant weight and at times a bias: the motif a GEMM template computes with
    the norm in its prologue (`codegen/norm.py`), which other draws rarely line up."""
    x = b.pick(lambda t: t.is_float and t.rank >= 2 and t.shape[-1] > 1) or b.add_input((b.dim(), b.dim(2)))
    if d.maybe(0.4):  # (float_in's fresh input would not keep to a predicate: pick, or make one alike)
        r = b.pick(lambda t: t.is_float and t.shape == x.shape and t is not x) or b.add_input(x.shape)
        x = b.one("Add", [x, r], [(x.shape, FLOAT)])
    k = x.shape[-1]
    if d.maybe(0.5):
        ins: list = [x, b.const((k,))] + ([b.const((k,), scale=0.5)] if d.maybe(0.7) else [])
        y = b.one("LayerNormalization", ins, [(x.shape, FLOAT)], {"axis": -1})
    else:  # RMSNorm as Llama's export spells it
        sq = b.one("Mul", [x, x], [(x.shape, FLOAT)])
        stat = x.shape[:-1] + (1,)
        axes = b.opset >= 18
        ms = b.one("ReduceMean", [sq] + ([b.ints([-1])] if axes else []), [(stat, FLOAT)],
                   {"keepdims": 1} if axes else {"axes": [-1], "keepdims": 1})
        r = b.one("Reciprocal", [b.one("Sqrt", [b.one("Add", [ms, b.scalar(1e-5)], [(stat, FLOAT)])], [(stat, FLOAT)])],
                  [(stat, FLOAT)])
        y = b.one("Mul", [b.one("Mul", [x, r], [(x.shape, FLOAT)]), b.const((k,))], [(x.shape, FLOAT)])
    n = b.dim(1, max(1, b.cap // max(1, x.numel // k)))
    out = x.shape[:-1] + (n,)
    if math.prod(out) > 2 * b.cap:
        return
    z = b.one("MatMul", [y, b.const((k, n), FLOAT, scale=1 / math.sqrt(k))], [(out, FLOAT)])
    if d.maybe(0.5):
        b.one("Add", [z, b.const((n,), scale=0.5)], [(out, FLOAT)])


def gated_mlp(d: Draw, b: Builder) -> None:
    """A gated MLP's first half: act(x @ wg) * (x @ wu) with constant weights of one width (SiLU as
    Llama's export spells it, or GELU or ReLU), the factors either way round, at times a third
    projection beside them. Merged over their weights (`rewrite/merged.py`), the product is read only
    through its column slices: the GEMM template's accumulator-per-slice form (`gemm.column_slices`)."""
    x = b.pick(lambda t: t.is_float and t.rank >= 2 and t.shape[-1] > 1) or b.add_input((b.dim(), b.dim(2)))
    k = x.shape[-1]
    n = b.dim(1, max(1, b.cap // max(1, x.numel // k)))
    out = x.shape[:-1] + (n,)
    if math.prod(out) > b.cap:
        return
    gate, up = (b.one("MatMul", [x, b.const((k, n), FLOAT, scale=1 / math.sqrt(k))], [(out, FLOAT)]) for _ in "gu")
    act = d.pick(["silu", "gelu", "relu"])
    if act == "silu":
        a = b.one("Mul", [gate, b.one("Sigmoid", [gate], [(out, FLOAT)])], [(out, FLOAT)])
    elif act == "gelu" and b.opset >= 20:
        a = b.one("Gelu", [gate], [(out, FLOAT)], {"approximate": d.pick(["none", "tanh"])})
    else:
        a = b.one("Relu", [gate], [(out, FLOAT)])
    b.one("Mul", [a, up] if d.maybe(0.5) else [up, a], [(out, FLOAT)])
    if d.maybe(0.25):  # a third projection of x, read on its own
        w = b.dim(1, 9)
        b.one("MatMul", [x, b.const((k, w), FLOAT, scale=1 / math.sqrt(k))], [(x.shape[:-1] + (w,), FLOAT)])


def _rotate_half(d: Draw, b: Builder, q: Tensor, h: int) -> Tensor:
    """concat(-q[.., h:], q[.., :h]) over the last axis of 2h values (or the other sign): Llama's."""
    half = q.shape[:-1] + (h,)
    x1, x2 = (b.one("Slice", [q, b.ints([a]), b.ints([a + h]), b.ints([-1])], [(half, FLOAT)]) for a in (0, h))
    if d.maybe(0.8):
        return b.one("Concat", [b.one("Neg", [x2], [(half, FLOAT)]), x1], [(q.shape, FLOAT)], {"axis": -1})
    return b.one("Concat", [x2, b.one("Neg", [x1], [(half, FLOAT)])], [(q.shape, FLOAT)], {"axis": -1})


def _rotate_every_two(d: Draw, b: Builder, q: Tensor, h: int) -> Tensor:
    """stack(-q[.., 1::2], q[.., ::2]) flattened (or the other sign): GPT-J's and CodeGen's interleaved pairs."""
    half = q.shape[:-1] + (h,)
    even, odd = (b.one("Slice", [q, b.ints([a]), b.ints([2 * h]), b.ints([-1]), b.ints([2])], [(half, FLOAT)])
                 for a in (0, 1))
    if d.maybe(0.8):
        pair = (b.one("Neg", [odd], [(half, FLOAT)]), even)
    else:
        pair = (odd, b.one("Neg", [even], [(half, FLOAT)]))
    cols = [b.one("Unsqueeze", [t, b.ints([-1])], [(half + (1,), FLOAT)]) for t in pair]
    stacked = b.one("Concat", cols, [(half + (2,), FLOAT)], {"axis": -1})
    return b.one("Reshape", [stacked, b.ints(q.shape)], [(q.shape, FLOAT)])


def rotary_projection(d: Draw, b: Builder) -> None:
    """Rotary positions after a projection, as Llama's export spells them: x @ w (at times plus a bias) cut
    into heads of 2h values, at times transposed to [.., heads, rows, head], then q * cos + rotate_half(q) * sin with
    rotate_half = concat(-q[.., h:], q[.., :h]) (or the other sign) over the last axis; at times the product also
    holds v, split into heads the same way and left unrotated, and at times only each head's first half rotates
    and the rest is put back beside it (partial rotary); at times the rotation is GPT-J's interleaved
    rotate_every_two instead, stack(-q[.., 1::2], q[.., ::2]) flattened. A GEMM template
    computes either from its accumulator's registers where a tile holds whole heads (or pairs)
    (`codegen/rotary.py`); other draws never line the concat up this way."""
    x = b.pick(lambda t: t.is_float and t.rank >= 2 and t.shape[-1] > 1) or b.add_input((b.dim(), b.dim(2)))
    k = x.shape[-1]
    h = d.pick([1, 2, 3, 4, 8, 16])
    heads = b.dim(1, max(1, b.cap // max(1, x.numel // k * 2 * h)))
    hd = heads * 2 * h
    wide = d.maybe(0.4)  # q beside v in one product (Llama's merged projection): v is only split into heads
    out = x.shape[:-1] + (2 * hd if wide else hd,)
    if math.prod(out) > b.cap:
        return
    y = b.one("MatMul", [x, b.const((k, out[-1]), FLOAT, scale=1 / math.sqrt(k))], [(out, FLOAT)])
    if d.maybe(0.4):  # a bias before the heads (Qwen2's projections)
        y = b.one("Add", [y, b.const((out[-1],), scale=0.5)], [(out, FLOAT)])
    split = x.shape[:-1] + (heads, 2 * h)
    r = len(split)
    perm = list(range(r - 3)) + [r - 2, r - 3, r - 1] if d.maybe(0.7) else None  # [.., heads, rows, head]
    heads_of = []
    for a in ((0, hd) if wide else (0,)):
        part = b.one("Slice", [y, b.ints([a]), b.ints([a + hd]), b.ints([-1])], [(x.shape[:-1] + (hd,), FLOAT)]) \
            if wide else y
        t = b.one("Reshape", [part, b.ints(split)], [(split, FLOAT)])
        if perm is not None:
            t = b.one("Transpose", [t], [(tuple(split[p] for p in perm), FLOAT)], {"perm": perm})
        heads_of.append(t)
    q = heads_of[0]  # (v, the second, is left for the graph's outputs)
    whole, rest = q, None
    if h % 2 == 0 and d.maybe(0.3):  # partial rotary (GPT-NeoX's, Phi's): the head's first h values rotate
        h //= 2
        q = b.one("Slice", [whole, b.ints([0]), b.ints([2 * h]), b.ints([-1])], [(whole.shape[:-1] + (2 * h,), FLOAT)])
        rest = b.one("Slice", [whole, b.ints([2 * h]), b.ints([4 * h]), b.ints([-1])],
                     [(whole.shape[:-1] + (2 * h,), FLOAT)])
    rot = (_rotate_every_two if d.maybe(0.3) else _rotate_half)(d, b, q, h)
    table = q.shape[-2:] if d.maybe(0.7) else q.shape[-1:]
    qc = b.one("Mul", [q, b.const(table)], [(q.shape, FLOAT)])
    out = b.one("Add", [qc, b.one("Mul", [rot, b.const(table)], [(q.shape, FLOAT)])], [(q.shape, FLOAT)])
    if rest is not None:  # the rest of the head put back beside the rotation
        b.one("Concat", [out, rest], [(whole.shape, FLOAT)], {"axis": -1})


def instance_norm(d: Draw, b: Builder) -> None:
    x = b.float_in(lambda t: t.rank >= 3)
    if x.rank < 3:
        x = _image(d, b, 4)
    c = x.shape[1]
    b.one("InstanceNormalization", [x, b.const((c,)), b.const((c,), scale=0.5)], [(x.shape, FLOAT)],
          {"epsilon": d.pick([1e-5, 1e-3])})


def batch_norm(d: Draw, b: Builder) -> None:
    x = b.float_in(lambda t: t.rank >= 2)
    if x.rank < 2:
        x = _image(d, b, 4)
    c = x.shape[1]
    ins = [x, b.const((c,)), b.const((c,), scale=0.5), b.const((c,), scale=0.5), b.const((c,), positive=True)]
    b.one("BatchNormalization", ins, [(x.shape, FLOAT)], {"epsilon": d.pick([1e-5, 1e-3])})


def group_norm(d: Draw, b: Builder) -> None:
    x = b.float_in(lambda t: t.rank >= 3 and t.shape[1] > 1)
    if x.rank < 3 or x.shape[1] < 2:
        x = b.add_input((d.pick([1, 2]), d.pick([4, 6, 2, 8, 12]), b.dim(1, 9), b.dim(1, 9)))
    c = x.shape[1]
    g = d.pick([q for q in (1, 2, 3, 4, c) if c % q == 0])
    p = c  # opset 21: per-channel scale and bias
    b.one("GroupNormalization", [x, b.const((p,)), b.const((p,), scale=0.5)], [(x.shape, FLOAT)],
          {"num_groups": g, "epsilon": 1e-5})


# ---- reductions ---------------------------------------------------------------------------------
_REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp"]


def reduce(d: Draw, b: Builder) -> None:
    op = d.pick(_REDUCE)
    x = b.float_in()
    if op == "ReduceLogSum":
        x = b.positive(x, 0.5)
    reduce_node(d, b, op, x)


# ---- pooling --------------------------------------------------------------------------------
def pool(d: Draw, b: Builder) -> None:
    op = d.pick(["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    x = _image(d, b, 4 if d.maybe(0.85) else 3)
    n, c, *sp = x.shape
    nd = len(sp)
    if op.startswith("Global"):
        b.one(op, [x], [((n, c) + (1,) * nd, FLOAT)])
        return
    ks = [min(d.pick([2, 3, 1, 5]), s) for s in sp]
    strides = [d.pick([1, 2, 3]) for _ in range(nd)]
    dil_ok = op == "MaxPool" or b.opset >= 19
    dils = [d.pick([1, 2]) if dil_ok and d.maybe(0.3) else 1 for _ in range(nd)]
    pads = [d.int(0, k - 1) if d.maybe(0.5) else 0 for k in ks * 2]
    ceil = d.maybe(0.3)
    attrs: dict = {"kernel_shape": ks}
    outs = []
    for i in range(nd):
        span = dils[i] * (ks[i] - 1) + 1
        room = sp[i] + pads[i] + pads[i + nd] - span
        if room < 0:
            return
        o = (-(-room // strides[i]) if ceil else room // strides[i]) + 1
        if ceil and (o - 1) * strides[i] >= sp[i] + pads[i]:
            # onnxruntime drops a last window that would start in the end pad, but its load-time
            # shape inference (ONNX's) keeps it, so later nodes see a shape the run does not make.
            ceil = False
        outs.append(o)
    if not ceil:
        outs = [_conv_out(sp[i], ks[i], strides[i], dils[i], pads[i], pads[i + nd]) for i in range(nd)]
    if any(v != 1 for v in strides):
        attrs["strides"] = strides
    if any(v != 1 for v in dils):
        attrs["dilations"] = dils
    if any(pads):
        attrs["pads"] = pads
    if ceil:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and d.maybe(0.4):
        attrs["count_include_pad"] = 1
    b.one(op, [x], [((n, c, *outs), FLOAT)], attrs, exact=op == "MaxPool" and x.exact)


# ---- resize ---------------------------------------------------------------------------------------
_COORD = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric",
          "tf_half_pixel_for_nn"]
_NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def resize(d: Draw, b: Builder) -> None:
    mode = d.pick(["nearest", "linear", "cubic"])
    x = _image(d, b, 4) if mode != "nearest" or d.maybe(0.7) else b.float_in()
    r = x.rank
    coords = [c for c in _COORD if not (c == "half_pixel_symmetric" and b.opset < 19)
              and not (c == "tf_half_pixel_for_nn" and mode != "nearest")]
    attrs: dict = {"mode": mode, "coordinate_transformation_mode": d.pick(coords)}
    if mode == "nearest":
        attrs["nearest_mode"] = d.pick(_NEAREST)
    if mode == "cubic" and d.maybe(0.5):  # TensorFlow's bicubic; PyTorch's is the default (-0.75, 0)
        attrs |= {"cubic_coeff_a": -0.5, "exclude_outside": d.pick([0, 1])}
    # Which axes change: the last two of an image (linear / cubic), any for nearest.
    movable = list(range(r - 2, r)) if mode != "nearest" or r < 2 else list(range(r))
    axes = [a for a in movable if d.maybe(0.7)] or [movable[-1]]
    use_sizes = d.maybe(0.4)
    scales = [1.0] * r
    sizes = list(x.shape)
    for a in axes:
        if use_sizes:
            sizes[a] = max(1, min(d.pick([2 * x.shape[a], x.shape[a] + 1, max(1, x.shape[a] // 2), 7, 3]), 64))
        else:
            scales[a] = d.pick([2.0, 0.5, 1.5, 3.0, 0.75, 1.7, 0.6])
    if use_sizes:
        out = tuple(sizes)
    else:
        out = tuple(int(np.float32(s) * np.float32(n)) for s, n in zip(scales, x.shape))
    if min(out) < 1 or math.prod(out) > 2 * b.cap:
        return
    use_axes = b.opset >= 18 and d.maybe(0.3) and len(axes) < r
    if use_axes:
        attrs["axes"] = axes
        sc = [scales[a] for a in axes]
        sz = [sizes[a] for a in axes]
    else:
        sc, sz = scales, sizes
    roi = "" if b.opset >= 13 and d.maybe(0.7) else b.const((0,), FLOAT, [], data=False).name
    if use_sizes:
        ins = [x, roi, "", b.ints(sz)]
    else:
        ins = [x, roi, b.const((len(sc),), FLOAT, sc, data=False).name]
    exact = mode == "nearest" and x.exact
    b.one("Resize", ins, [(out, x.dtype)], attrs, exact=exact, nan_free=x.nan_free)


# ---- opaque (fallback) ------------------------------------------------------------------------
def opaque(d: Draw, b: Builder) -> None:
    # Most of these have fission rules now (CumSum, Mean and ArgMax since session 50; Sin, Cos, Tan, Floor,
    # Ceil, Round, Mod, TopK (k up to 16), Hardmax, Trilu and LpNormalization since 51); drawn here still,
    # they test them.
    op = d.pick(["Sin", "Floor", "CumSum", "ArgMax", "Mean", "Cos", "Round", "TopK", "Tan", "Ceil", "Mod",
                 "Hardmax", "Trilu", "LpNormalization"])
    if op in ("Hardmax", "LpNormalization"):
        x = b.float_in(exact=op == "Hardmax")
        attrs = {"axis": d.int(-1, x.rank - 1)} | ({"p": d.pick([1, 2])} if op == "LpNormalization" else {})
        b.one(op, [x], [(x.shape, FLOAT)], attrs, exact=op == "Hardmax")
        return
    if op == "Trilu" and b.opset >= 14:
        x = b.float_in(lambda t: t.rank >= 2)
        if x.rank >= 2:
            b.one(op, [x, b.const((), "int64", [d.int(-3, 3)], data=False)], [(x.shape, FLOAT)],
                  {"upper": int(d.maybe(0.5))}, exact=x.exact)
        return
    if op == "Trilu":
        op = "Sin"
    if op in ("Sin", "Cos", "Tan"):
        x = b.float_in()
        b.one(op, [x], [(x.shape, FLOAT)])
    elif op in ("Floor", "Round", "Ceil"):
        x = b.float_in(exact=True)
        b.one(op, [x], [(x.shape, FLOAT)], exact=True)
    elif op == "Mod":  # C's remainder of floats by a constant of either sign
        x = b.float_in(exact=True)
        y = b.scalar(d.pick([0.75, -1.5, 2.0, -3.0, 0.5]))
        b.one(op, [x, y], [(x.shape, FLOAT)], {"fmod": 1}, exact=True)
    elif op == "Mean":
        x = b.float_in()
        y = b.operand_like(x.shape)
        b.one(op, [x, y], [(bcast(x.shape, y.shape), FLOAT)])
    elif op == "CumSum":
        x = b.float_in()
        a = d.int(0, x.rank - 1)
        b.one(op, [x, b.const((), "int64", [a], data=False)], [(x.shape, FLOAT)],
              {"reverse": 1} if d.maybe(0.3) else {})
    elif op == "ArgMax":
        x = b.float_in(exact=True)
        a = d.int(0, x.rank - 1)
        keep = d.maybe(0.5)
        out = tuple(1 if i == a else s for i, s in enumerate(x.shape)) if keep else \
            tuple(s for i, s in enumerate(x.shape) if i != a)
        b.one(op, [x], [(out, "int64")], {"axis": a, "keepdims": int(keep)})
    else:  # TopK: two outputs, values and indices
        x = b.float_in(exact=True)
        k = d.int(1, x.shape[-1])
        out = x.shape[:-1] + (k,)
        b.node(op, [x, b.ints([k])], [(out, FLOAT), (out, "int64")], exact=x.exact)
