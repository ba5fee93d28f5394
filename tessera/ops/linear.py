"""Linear operators: MatMul, Gemm, Conv and ConvTranspose.

Each becomes one MATMUL / CONV / CONV_TRANSPOSE primitive plus the layout,
broadcast and elementwise primitives around it (transposes, batch folding,
scaling, bias). The linear primitives take no implied broadcast and no bias,
so everything ONNX does implicitly is spelled out here.
"""
from __future__ import annotations

from collections import Counter
import math
from typing import Sequence

from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, float_dtype_check, register



# ---- attribute helpers --------------------------------------------------------
def _kernel(ctx: OpCtx, w_shape: Sequence[int]) -> list[int]:
    """The kernel extents from W, checked against kernel_shape when it is given."""
    k = [int(d) for d in w_shape[2:]]
    given = ctx.attr("kernel_shape")
    if given is not None and [int(d) for d in given] != k:
        raise ctx.fail(f"kernel_shape {list(given)} does not match weight shape {list(w_shape)}")
    return k


def _bias(ctx: OpCtx, y: str, i: int) -> str:
    """y + B[c] for an optional per-channel bias input i of length C = y.shape[1]."""
    bias = ctx.optional(i)
    if bias is None:
        return y
    b = ctx.b
    c, rank = b.shape(y)[1], b.rank(y)
    if b.shape(bias) != (c,):
        raise ctx.fail(f"bias shape {list(b.shape(bias))} is not [{c}]")
    return b.add(y, b.reshape(bias, (1, c) + (1,) * (rank - 2)))


# ---- MatMul ---------------------------------------------------------------------
@register("MatMul", since=1)
def matmul(ctx: OpCtx) -> list[str]:
    # Versions 9 and 13 only added types; numpy.matmul semantics throughout.
    b, x, w = ctx.b, ctx.input(0), ctx.input(1)
    sa, sb = b.shape(x), b.shape(w)
    if not sa or not sb:
        raise ctx.fail(f"MatMul operands must have rank >= 1, got {list(sa)} and {list(sb)}")
    # numpy promotes 1-D operands to a row / column and drops that dim afterwards.
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    (m, k), (k2, n) = a2[-2:], b2[-2:]
    if k != k2:
        raise ctx.fail(f"MatMul inner dims differ: {list(sa)} @ {list(sb)}")
    batch = b.broadcast_shape(a2[:-2], b2[:-2])
    out_shape = batch + ((m,) if len(sa) > 1 else ()) + ((n,) if len(sb) > 1 else ())
    if len(sa) > 1 and len(sb) > 1 and a2[:-2] == b2[:-2]:
        # Equal batch dims (attention, GEMM chains): the primitive as it is.
        chunks = _split_k(math.prod(batch), m, n, k) if b.dtype(x).is_float else 1
        y = _split_k_matmul(ctx, x, w, chunks) if chunks > 1 else b.matmul(x, w)
    elif math.prod(b2[:-2]) == 1:
        # One right matrix for every batch: fold the left batch into M, no copies.
        y = b.matmul(b.reshape(x, (math.prod(a2[:-2]) * m, k)), b.reshape(w, (k, n)))
    else:
        # One RESHAPE (1-D promotion and leading 1s together), then BROADCAST.
        ones = (1,) * len(batch)
        xa = b.reshape(x, (ones + a2)[-len(batch) - 2:])
        wb = b.reshape(w, (ones + b2)[-len(batch) - 2:])
        y = b.matmul(b.broadcast_to(xa, batch + (m, k)), b.broadcast_to(wb, batch + (k, n)))
    return [b.reshape(y, out_shape)]


SPLIT_K_MIN = 4096  # reductions at least this long may be split
SPLIT_K_CHUNK = 512  # elements of K per chunk
SPLIT_K_MAX_TILES = 16  # 64x64 output tiles below which a GEMM leaves most SMs idle


def _split_k(batch: int, m: int, n: int, k: int) -> int:
    """How many chunks to split a long reduction into (1: none).

    A GEMM with a tiny output and a huge K (EfficientViT's linear attention: 16x17 outputs
    over 16384 tokens) gives cuBLAS a handful of output tiles for the whole GPU: on the H100 it
    ran 44x off its roofline (docs/benchmarks.md). Split into chunks, the partial products are
    a batched GEMM with many tiles and the sum over chunks is a small reduction kernel.
    """
    tiles = batch * -(-m // 64) * -(-n // 64)
    if k < SPLIT_K_MIN or tiles > SPLIT_K_MAX_TILES:
        return 1
    chunks = 1
    while k % (2 * chunks) == 0 and k // (2 * chunks) >= SPLIT_K_CHUNK:
        chunks *= 2
    return chunks


def _split_k_matmul(ctx: OpCtx, x: str, w: str, chunks: int) -> str:
    """x [..., m, k] @ w [..., k, n] as sum over chunks of x[..., m, k/c] @ w[..., k/c, n]."""
    b = ctx.b
    *batch, m, k = b.shape(x)
    n = b.shape(w)[-1]
    r = len(batch)
    xs = b.transpose(b.reshape(x, (*batch, m, chunks, k // chunks)),
                     tuple(range(r)) + (r + 1, r, r + 2))  # [..., chunks, m, k/c]
    ws = b.reshape(w, (*batch, chunks, k // chunks, n))  # [..., chunks, k/c, n]: a view
    return b.reduce(Prim.REDUCE_SUM, b.matmul(xs, ws), [r], keepdims=False)


# ---- Gemm -------------------------------------------------------------------------
def _gemm(ctx: OpCtx, c: str | None, legacy_broadcast: bool) -> str:
    """alpha * A' @ B' + beta * C, with A' and B' optionally transposed."""
    b, x, w = ctx.b, ctx.input(0), ctx.input(1)
    if b.rank(x) != 2 or b.rank(w) != 2:
        raise ctx.fail(f"Gemm needs 2-D A and B, got {list(b.shape(x))} and {list(b.shape(w))}")
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if not b.dtype(x).is_float and not (alpha.is_integer() and beta.is_integer()):
        raise Unsupported(f"Gemm on {b.dtype(x).value} with fractional alpha/beta")
    if int(ctx.attr("transA", 0)):
        x = b.transpose(x, (1, 0))
    if int(ctx.attr("transB", 0)):
        w = b.transpose(w, (1, 0))
    (m, k), (k2, n) = b.shape(x), b.shape(w)
    if k != k2:
        raise ctx.fail(f"Gemm inner dims differ: A' is [{m}, {k}], B' is [{k2}, {n}]")
    y = b.matmul(x, w)
    if alpha != 1.0:
        y = b.mul_scalar(y, alpha)
    # beta == 0 drops C, as onnxruntime does (it never reads C then).
    if c is None or beta == 0.0:
        return y
    cs = b.shape(c)
    if legacy_broadcast and not int(ctx.attr("broadcast", 0)) and cs != (m, n):
        raise ctx.fail(f"C is {list(cs)} but broadcast=0 requires [{m}, {n}]")
    if len(cs) > 2 or b.broadcast_shape(cs, (m, n)) != (m, n):
        raise ctx.fail(f"C of shape {list(cs)} does not broadcast to [{m}, {n}]")
    if beta != 1.0:
        c = b.mul_scalar(c, beta)  # before the broadcast: C is usually the smaller tensor
    return b.add(y, c)


@register("Gemm", since=1)
def gemm1(ctx: OpCtx) -> list[str]:
    # Opsets 1-6: C is required and broadcast only when attribute broadcast=1.
    return [_gemm(ctx, ctx.input(2), legacy_broadcast=True)]


@register("Gemm", since=7)
def gemm7(ctx: OpCtx) -> list[str]:
    # Opset 7: C broadcasts unidirectionally to [M, N]; still required.
    return [_gemm(ctx, ctx.input(2), legacy_broadcast=False)]


@register("Gemm", since=11)
def gemm11(ctx: OpCtx) -> list[str]:
    # Opset 11: C is optional.
    return [_gemm(ctx, ctx.optional(2), legacy_broadcast=False)]


# ---- Conv -------------------------------------------------------------------------
def _same_pads(size: int, k: int, stride: int, dil: int, upper: bool) -> tuple[int, int]:
    """auto_pad SAME_*: pads so that out = ceil(size / stride); the odd one goes
    to the end for SAME_UPPER and to the beginning for SAME_LOWER."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + dil * (k - 1) + 1 - size)
    return (total // 2, total - total // 2) if upper else (total - total // 2, total // 2)


def _conv_pads(ctx: OpCtx, spatial: Sequence[int], k: Sequence[int], strides: Sequence[int],
               dils: Sequence[int]) -> list[int]:
    n = len(spatial)
    mode = ctx.auto_pad()
    if mode == "NOTSET":
        pads = ctx.attr_ints("pads", 2 * n, 0)
        if any(p < 0 for p in pads):
            raise ctx.fail(f"negative pads {pads}")
        return pads
    if mode == "VALID":
        return [0] * (2 * n)
    # onnxruntime rejects SAME with dilations; this follows the ONNX spec (dilated span).
    pairs = [_same_pads(spatial[i], k[i], strides[i], dils[i], mode == "SAME_UPPER") for i in range(n)]
    return [p[0] for p in pairs] + [p[1] for p in pairs]


@register("Conv", since=1)
@register("Conv", since=11)
def conv(ctx: OpCtx) -> list[str]:
    # Opset 11 only restated auto_pad SAME as out = ceil(in / stride), which is
    # also what opset 1 means in practice; one rule serves both.
    b, x, w = ctx.b, ctx.input(0), ctx.input(1)
    float_dtype_check(ctx, x)
    xs, ws = b.shape(x), b.shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise ctx.fail(f"Conv needs X [N, C, *spatial] and W of the same rank, got {list(xs)} and {list(ws)}")
    n = len(xs) - 2
    group = int(ctx.attr("group", 1))
    if group < 1 or xs[1] != ws[1] * group or ws[0] % group:
        raise ctx.fail(f"weight {list(ws)} does not fit input {list(xs)} with group {group}")
    k = _kernel(ctx, ws)
    strides = ctx.attr_ints("strides", n, 1)
    dils = ctx.attr_ints("dilations", n, 1)
    pads = _conv_pads(ctx, xs[2:], k, strides, dils)
    for i in range(n):
        if xs[2 + i] + pads[i] + pads[i + n] < dils[i] * (k[i] - 1) + 1:
            raise ctx.fail(f"kernel {k} (dilations {dils}) is larger than the padded input {list(xs)}")
    if _is_patchify(xs, k, strides, pads, dils, group):
        return [_patchify(ctx, x, w, k)]
    y = b.emit(Prim.CONV, [x, w], {"strides": tuple(strides), "pads": tuple(pads),
                                   "dilations": tuple(dils), "group": group})
    return [_bias(ctx, y, 2)]


def _is_patchify(xs: Sequence[int], k: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                 dils: Sequence[int], group: int) -> bool:
    """A 2-D conv whose windows tile the input exactly (kernel = stride > 1, no padding or dilation):
    ViT's patch embedding, SegFormer's spatial reduction."""
    return (len(xs) == 4 and group == 1 and list(k) == list(strides) and max(k) > 1 and not any(pads)
            and all(d == 1 for d in dils) and xs[2] % k[0] == 0 and xs[3] % k[1] == 0)


def _patchify(ctx: OpCtx, x: str, w: str, k: Sequence[int]) -> str:
    """The non-overlapping conv as one GEMM: patches [N*Ho*Wo, C*kh*kw] @ W^T [C*kh*kw, O].

    cuDNN ran SegFormer-B0's 8x8 stride-8 convs at about 75x their roofline on the H100
    (docs/benchmarks.md); as a GEMM they go to cuBLAS, the bias rides in the library call, and
    the two transposes are memory-bound primitives that can fuse with their neighbours.
    """
    b = ctx.b
    n, c, h, wd = b.shape(x)
    o = b.shape(w)[0]
    kh, kw = k
    ho, wo = h // kh, wd // kw
    patches = b.transpose(b.reshape(x, (n, c, ho, kh, wo, kw)), (0, 2, 4, 1, 3, 5))
    rows = b.reshape(patches, (n * ho * wo, c * kh * kw))
    # On the GEMM's [rows, O] output the bias is a row vector: the library call takes it.
    y = _bias(ctx, b.matmul(rows, b.transpose(b.reshape(w, (o, c * kh * kw)), (1, 0))), 2)
    return b.transpose(b.reshape(y, (n, ho, wo, o)), (0, 3, 1, 2))


# ---- ConvTranspose -------------------------------------------------------------------
def _conv_transpose_pads(ctx: OpCtx, spatial: Sequence[int], k: Sequence[int], strides: Sequence[int],
                         dils: Sequence[int], out_pad: Sequence[int]) -> list[int]:
    """Explicit pads, or the pads implied by output_shape / auto_pad SAME_*."""
    n = len(spatial)
    mode = ctx.auto_pad()
    natural = [strides[i] * (spatial[i] - 1) + out_pad[i] + dils[i] * (k[i] - 1) + 1 for i in range(n)]
    target = ctx.attr("output_shape")
    if target is not None:
        target = [int(t) for t in target]
        if len(target) != n:
            raise ctx.fail(f"output_shape {target} must list the {n} spatial extents")
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        target = [spatial[i] * strides[i] for i in range(n)]
    elif mode == "VALID":
        return [0] * (2 * n)
    else:
        pads = ctx.attr_ints("pads", 2 * n, 0)
        if any(p < 0 for p in pads):
            raise ctx.fail(f"negative pads {pads}")
        return pads
    begins, ends = [], []
    for i in range(n):
        total = natural[i] - target[i]
        if total < 0:
            # A larger output than the kernel covers: onnxruntime zero-fills (output_shape)
            # or ignores the target (auto_pad), neither as the spec says.
            raise Unsupported(f"output extent {target[i]} exceeds the computed {natural[i]}")
        # Matches onnxruntime (and the opset-11 text): the odd pad goes to the end for
        # SAME_UPPER and to the beginning otherwise.
        lo = total // 2 if mode == "SAME_UPPER" else total - total // 2
        begins.append(lo)
        ends.append(total - lo)
    return begins + ends


@register("ConvTranspose", since=1)
@register("ConvTranspose", since=11)
def conv_transpose(ctx: OpCtx) -> list[str]:
    # Opset 11 documented defaults and the output_shape pad split; semantics as in 1.
    b, x, w = ctx.b, ctx.input(0), ctx.input(1)
    float_dtype_check(ctx, x)
    xs, ws = b.shape(x), b.shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise ctx.fail(f"ConvTranspose needs X [N, C, *spatial] and W of the same rank, "
                       f"got {list(xs)} and {list(ws)}")
    n = len(xs) - 2
    group = int(ctx.attr("group", 1))
    if group < 1 or xs[1] != ws[0] or xs[1] % group:
        raise ctx.fail(f"weight {list(ws)} does not fit input {list(xs)} with group {group}")
    k = _kernel(ctx, ws)
    strides = ctx.attr_ints("strides", n, 1)
    dils = ctx.attr_ints("dilations", n, 1)
    out_pad = ctx.attr_ints("output_padding", n, 0)
    if any(p < 0 for p in out_pad):
        raise ctx.fail(f"negative output_padding {out_pad}")
    pads = _conv_transpose_pads(ctx, xs[2:], k, strides, dils, out_pad)
    y = b.emit(Prim.CONV_TRANSPOSE, [x, w], {"strides": tuple(strides), "pads": tuple(pads),
                                             "dilations": tuple(dils), "group": group,
                                             "output_padding": tuple(out_pad)})
    return [_bias(ctx, y, 2)]


# ---- Einsum ---------------------------------------------------------------------
# An operand as its labels (one per axis) and its tensor; "..." becomes labels of their own ("…0", ...).
_Term = tuple[list[str], str]


def _einsum_terms(ctx: OpCtx, equation: str) -> tuple[list[list[str]], list[str] | None]:
    """The labels of every operand, and of the output (None: implicit, "->" absent)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ctx.node.inputs):
        raise ctx.fail(f"equation '{equation}' names {len(terms)} operands for {len(ctx.node.inputs)} inputs")
    ranks = [ctx.b.rank(ctx.input(i)) for i in range(len(terms))]
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)

    def labels(term: str, rank: int | None) -> list[str]:
        head, dots, tail = term.partition("...")
        if not all(c.isalpha() for c in head + tail) or "." in tail:
            raise ctx.fail(f"equation '{equation}': '{term}' is not a term of letters")
        n = (rank - len(head) - len(tail)) if dots and rank is not None else ell if dots else 0
        if n < 0 or (rank is not None and len(head) + n + len(tail) != rank):
            raise ctx.fail(f"equation '{equation}': '{term}' does not fit an operand of rank {rank}")
        return list(head) + [f"…{ell - n + i}" for i in range(n)] + list(tail)

    ins = [labels(t, r) for t, r in zip(terms, ranks)]
    return ins, labels(rhs, None) if arrow else None


@register("Einsum", since=12)
def einsum(ctx: OpCtx) -> list[str]:
    """Operands contracted pairwise, left to right, each pair one batched MATMUL: its shared labels that
    the output or a later operand keeps are the batch, the others the contraction, the rest the rows and
    columns (transposed and reshaped into place; a pair with nothing to contract is a broadcast product).
    Labels in one operand alone that nothing keeps are summed first; the result is transposed to the
    output's order. An ellipsis is labels of its own (size-1 dims broadcast). A label twice in one operand
    takes that operand's diagonal first (`_diagonal`; a trace is then a diagonal summed out). Stays
    opaque: integer operands."""
    b = ctx.b
    ins, out = _einsum_terms(ctx, str(ctx.attr("equation")))
    xs = [ctx.input(i) for i in range(len(ins))]
    for x in xs:
        float_dtype_check(ctx, x)
    # occurrences as written: an implicit output drops a label repeated in one operand (a trace)
    counts = Counter(label for t in ins for label in t)
    for i, (t, x) in enumerate(zip(ins, xs)):  # a label twice in one operand: its diagonal first
        ins[i], xs[i] = _diagonal(ctx, t, x)
    sizes: dict[str, int] = {}
    for t, x in zip(ins, xs):
        for label, d in zip(t, b.shape(x)):
            if sizes.get(label, 1) not in (1, d) and d != 1:
                raise ctx.fail(f"label '{label}' has sizes {sizes[label]} and {d}")
            sizes[label] = max(sizes.get(label, 1), d)
    if out is None:  # implicit: the ellipsis, then the letters used once, in alphabetical order
        out = sorted((label for label in sizes if label.startswith("…")), key=lambda label: int(label[1:])) + \
            sorted(label for label in sizes if not label.startswith("…") and counts[label] == 1)
    if len(set(out)) != len(out) or any(label not in sizes for label in out):
        raise ctx.fail(f"output labels {out} repeat or are not among the operands'")
    terms: list[_Term] = [(t, b.broadcast_to(x, [sizes[label] for label in t])) for t, x in zip(ins, xs)]
    for i in range(len(terms)):  # labels only this operand has and nothing keeps: summed now
        t, x = terms[i]
        elsewhere = set(out).union(*(terms[j][0] for j in range(len(terms)) if j != i))
        terms[i] = _sum_out(b, t, x, [label for label in t if label not in elsewhere])
    acc = terms[0]
    for i in range(1, len(terms)):
        keep = set(out).union(*(t for t, _ in terms[i + 1:]))
        acc = _contract(b, acc, terms[i], keep)
    t, y = _sum_out(b, *acc, [label for label in acc[0] if label not in out])
    return [b.transpose(y, [t.index(label) for label in out])]


def _diagonal(ctx: OpCtx, labels: list[str], x: str) -> _Term:
    """The operand's elements whose repeated labels agree, each label once (its first place): the two
    axes of a repeated label moved last and merged, every (n + 1)-th element of the merged axis kept
    (a strided slice: a view's index arithmetic in any kernel)."""
    b = ctx.b
    labels = list(labels)
    while len(set(labels)) != len(labels):
        label = next(lb for k, lb in enumerate(labels) if lb in labels[:k])
        p, q = labels.index(label), labels.index(label, labels.index(label) + 1)
        shape = b.shape(x)
        if shape[p] != shape[q]:
            raise ctx.fail(f"label '{label}' repeats in one operand over axes of sizes {shape[p]} and {shape[q]}")
        n = shape[p]
        rest = [k for k in range(len(labels)) if k not in (p, q)]
        y = b.reshape(b.transpose(x, rest + [p, q]), [shape[k] for k in rest] + [n * n])
        y = b.slice(y, [0] * (len(rest) + 1), [1] * len(rest) + [n + 1], [shape[k] for k in rest] + [n])
        at = sum(1 for k in rest if k < p)  # the label back at its first place
        order = list(range(len(rest)))
        order.insert(at, len(rest))
        x = b.transpose(y, order)
        labels = [labels[k] for k in rest]
        labels.insert(at, label)
    return labels, x


def _sum_out(b, labels: list[str], x: str, gone: list[str]) -> _Term:
    if not gone:
        return labels, x
    y = b.reduce(Prim.REDUCE_SUM, x, [labels.index(label) for label in gone], keepdims=False)
    return [label for label in labels if label not in gone], y


def _contract(b, left: _Term, right: _Term, keep: set[str]) -> _Term:
    """left * right summed over the labels both have and `keep` lacks."""
    (la, a), (lb, w) = left, right
    shared = [label for label in la if label in lb]
    batch = [label for label in shared if label in keep]
    inner = [label for label in shared if label not in keep]
    rows = [label for label in la if label not in lb]
    cols = [label for label in lb if label not in la]
    size = dict(zip(la, b.shape(a))) | dict(zip(lb, b.shape(w)))

    def n(labels: list[str]) -> int:
        return math.prod(size[label] for label in labels)

    if not inner:  # nothing to sum: a broadcast product over the union of labels
        union = batch + rows + cols
        xa = b.reshape(b.transpose(a, [la.index(label) for label in batch + rows]),
                       [size[label] if label in la else 1 for label in union])
        xb = b.reshape(b.transpose(w, [lb.index(label) for label in batch + cols]),
                       [size[label] if label in lb else 1 for label in union])
        return union, b.binary(Prim.MUL, xa, xb)
    xa = b.reshape(b.transpose(a, [la.index(label) for label in batch + rows + inner]), [n(batch), n(rows), n(inner)])
    xb = b.reshape(b.transpose(w, [lb.index(label) for label in batch + inner + cols]), [n(batch), n(inner), n(cols)])
    y = b.matmul(xa, xb)
    return batch + rows + cols, b.reshape(y, [size[label] for label in batch + rows + cols])
