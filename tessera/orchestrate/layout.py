"""The `layout` pass: one memory layout per tensor, chosen once for the whole plan.

Convolution networks want channels-last (NHWC) storage. cuDNN's tensor-core
kernels are NHWC kernels: handed NCHW tensors, cuDNN converts the input before
and the result after every call (`nchwToNhwcKernel` / `nhwcToNchwKernel` in a
profile), and a 1x1 convolution on NCHW data is a GEMM whose leading dimension
is the spatial size (49 at 7x7), which no aligned GEMM kernel takes. Stored
NHWC from the first convolution to the last, the library runs its native
kernels with no conversion at all, and the generated kernels in between read
and write NHWC directly (they address memory by the layout a tensor's type
carries, so a layout costs them nothing but the access order).

How the choice is made:
1. *Regions.* Rank-4 activations are joined through the primitives that do not
   care how their operands are stored (elementwise, broadcasts, reductions,
   pooling, pad, slice, concat, gather, and a 2-D convolution's input with its
   output). A tensor a layout-bound consumer reads (a matmul, an opaque
   operator, a transposed convolution) or produces stays row-major, as do graph
   inputs, outputs and constants.
2. *Price.* A region with convolutions goes channels-last when the pricer says
   its convolutions gain more than the region's boundary costs: an explicit
   conversion where a convolution reads a row-major tensor (the graph input) or
   writes one (a graph output), a copy where a reshape that was a view reads
   it, and the strided access of a generated kernel that reads it row-major
   on the other side. The pricer is the cost stage's (`cost/layout_price.py`):
   analytical without a GPU, measured convolutions with one.
3. *Apply.* Region tensors get the layout in their types; conversions are
   identity TRANSPOSE primitives (`is_conversion`) whose output layout
   differs from their input's. Orchestration fuses them into neighbouring
   kernels like any primitive; one left alone is marked a conversion kernel in
   the plan.

Legality and profitability stay apart: this module never imports `cost/`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tessera.ir.graph import Graph, Node, TensorType
from tessera.ir.prims import BINARY, REDUCTIONS, UNARY, Prim

NHWC = (0, 2, 3, 1)
LAYOUT_POLICIES = ("auto", "nchw", "nhwc")

# Primitives whose rank-4 operands and result may share any storage order: generated kernels
# address each tensor by its own layout, so these never force a conversion.
_AGNOSTIC = {p.value for p in UNARY | BINARY | REDUCTIONS} | {
    Prim.WHERE.value, Prim.BROADCAST.value, Prim.WINDOW_REDUCE.value, Prim.PAD.value, Prim.SLICE.value,
    Prim.CONCAT.value, Prim.GATHER.value, Prim.GATHER_ELEMENTS.value}
# Consumers that read row-major memory: library matmuls (torch would copy a permuted
# operand), opaque operators, transposed convolutions.
_BOUND = {Prim.MATMUL.value, Prim.OPAQUE.value, Prim.CONV_TRANSPOSE.value}


class LayoutPricer(Protocol):
    """What a layout costs, in seconds (the cost stage implements it)."""

    def conv(self, graph: Graph, node: Node, layout: tuple[int, ...]) -> float:
        """The library convolution `node` with its input and output stored in `layout`."""
        ...

    def conversion(self, graph: Graph, tensor: str) -> float:
        """A kernel that only converts `tensor` from one layout to another."""
        ...

    def strided(self, graph: Graph, tensor: str) -> float:
        """What a generated kernel loses reading or writing `tensor` out of its storage order."""
        ...

    def pad(self, graph: Graph, node: Node) -> bool:
        """Whether channels-last convolution `node` should have its channels padded to the
        library's alignment (`padded_channels`): whether it runs faster so."""
        ...


@dataclass
class Region:
    """Rank-4 tensors joined through layout-agnostic primitives, with the convolutions among them."""

    tensors: list[str]
    convs: list[str]
    layout: tuple[int, ...] = ()
    gain_s: float = 0.0  # convolutions' gain minus boundary costs, for channels-last
    conversions: int = 0  # explicit conversion primitives inserted
    padded: int = 0  # convolutions whose channels were padded to the library's alignment

    def to_json(self) -> dict[str, object]:
        return {"tensors": len(self.tensors), "convs": len(self.convs), "layout": list(self.layout),
                "gain_us": round(self.gain_s * 1e6, 3), "conversions": self.conversions, "padded": self.padded}


@dataclass
class LayoutResult:
    graph: Graph
    regions: list[Region] = field(default_factory=list)
    split_reductions: int = 0  # reductions over strided rows split in two levels (`_split_strided_reductions`)
    padded_matmuls: int = 0  # matmuls whose k or n was padded to the library's alignment (`_pad_matmuls`)
    unpadded: list[str] = field(default_factory=list)  # misaligned channels-last convolutions left unpadded

    @property
    def choices(self) -> list[bool]:
        """Which regions went channels-last, in order: what `assign_layouts(replay=...)` repeats."""
        return [bool(r.layout) for r in self.regions]

    @property
    def conversions(self) -> int:
        return sum(r.conversions for r in self.regions)

    def summary(self) -> dict[str, object]:
        cl = [r for r in self.regions if r.layout]
        return {"regions": len(self.regions), "channels_last_regions": len(cl),
                "convs_channels_last": sum(len(r.convs) for r in cl), "convs_padded": sum(r.padded for r in cl),
                "convs_unpadded": len(self.unpadded),
                "convs": sum(len(r.convs) for r in self.regions), "conversions": self.conversions,
                "split_reductions": self.split_reductions, "matmuls_padded": self.padded_matmuls,
                "detail": [r.to_json() for r in self.regions]}


def is_conversion(node: Node) -> bool:
    """An identity transpose: a copy whose only work is changing the storage order."""
    perm = node.attrs.get("perm") if node.op == Prim.TRANSPOSE.value else None
    return perm is not None and list(perm) == list(range(len(perm)))


def _conv2d(graph: Graph, n: Node) -> bool:
    return n.op == Prim.CONV.value and graph.types[n.inputs[0]].rank == 4


class _Sets:
    """Union-find over tensor names."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, t: str) -> str:
        self.parent.setdefault(t, t)
        while self.parent[t] != t:
            self.parent[t] = self.parent[self.parent[t]]
            t = self.parent[t]
        return t

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def regions(graph: Graph) -> list[Region]:
    """The regions that hold at least one 2-D convolution, in graph order."""
    consumers = graph.consumers()
    producers = graph.producers()
    fixed = set(graph.inputs) | set(graph.outputs) | set(graph.constants)

    def free(t: str) -> bool:
        ty = graph.types.get(t)
        if not t or ty is None or t in fixed or ty.rank != 4 or not ty.dtype.is_float:
            return False
        p = producers.get(t)
        if p is not None and (p.op in _BOUND or p.op == Prim.FILL.value):
            return False
        return not any(c.op in _BOUND for c in consumers.get(t, []))

    sets = _Sets()
    for n in graph.nodes:
        joined = n.op in _AGNOSTIC or _conv2d(graph, n)
        if not joined:
            continue
        ts = [t for t in (n.inputs[:1] if n.op in (Prim.CONV.value, Prim.GATHER.value) else n.inputs)
              if free(t)] + [t for t in n.outputs if free(t)]
        for t in ts:
            sets.find(t)
        for a, b in zip(ts, ts[1:]):
            sets.union(a, b)
    groups: dict[str, list[str]] = {}
    for t in sets.parent:
        groups.setdefault(sets.find(t), []).append(t)
    order = {t: i for i, t in enumerate(t for n in graph.nodes for t in n.outputs)}
    out: list[Region] = []
    for members in groups.values():
        inside = set(members)
        convs = [n.name for n in graph.nodes if _conv2d(graph, n)
                 and (n.inputs[0] in inside or n.outputs[0] in inside)]
        if convs:
            out.append(Region(sorted(members, key=lambda t: order.get(t, -1)), convs))
    return sorted(out, key=lambda r: order.get(r.tensors[0], -1))


@dataclass
class _Wiring:
    """The graph's producer and consumer maps, built once for all regions."""

    consumers: dict[str, list[Node]]
    producers: dict[str, Node]
    by_name: dict[str, Node]

    @staticmethod
    def of(graph: Graph) -> "_Wiring":
        return _Wiring(graph.consumers(), graph.producers(), {n.name: n for n in graph.nodes})


def _boundary(graph: Graph, region: Region, wiring: _Wiring | None = None) -> tuple[list[str], list[str], list[str]]:
    """(tensors needing an explicit conversion, tensors whose view becomes a copy, tensors read or
    written out of order by a generated kernel) if `region` were stored channels-last."""
    w = wiring or _Wiring.of(graph)
    inside = set(region.tensors)
    convert: dict[str, None] = {}
    strided: dict[str, None] = {}
    unview: list[str] = []
    for c in region.convs:
        n = w.by_name[c]
        convert.update((t, None) for t in (n.inputs[0], n.outputs[0]) if t not in inside)
    for t in region.tensors:
        for c in w.consumers.get(t, []):
            if c.op == Prim.RESHAPE.value and not TensorType(graph.types[t].shape, graph.types[t].dtype, NHWC).plain:
                unview.append(t)
            elif c.op not in _AGNOSTIC and not _conv2d(graph, c):
                strided[t] = None
        p = w.producers.get(t)
        if p is None:
            continue
        if p.op not in _AGNOSTIC and not _conv2d(graph, p):
            strided[t] = None
        elif p.op in _AGNOSTIC:
            # Row-major tensors that region primitives read (other than the convolutions' own) are
            # read out of order too.
            strided.update((u, None) for u in p.inputs if u and u not in inside and u not in graph.constants
                           and graph.types[u].rank == 4 and graph.types[u].numel > 1)
    return list(convert), unview, list(strided)


def price(graph: Graph, region: Region, pricer: LayoutPricer, wiring: _Wiring | None = None) -> float:
    """Seconds saved by storing `region` channels-last (negative: it costs)."""
    w = wiring or _Wiring.of(graph)
    gain = sum(pricer.conv(graph, w.by_name[c], ()) - pricer.conv(graph, w.by_name[c], NHWC) for c in region.convs)
    convert, unview, strided = _boundary(graph, region, w)
    gain -= sum(pricer.conversion(graph, t) for t in convert + unview)
    gain -= sum(pricer.strided(graph, t) for t in strided)
    return gain


def assign_layouts(graph: Graph, pricer: LayoutPricer | None, policy: str = "auto",
                   replay: list[bool] | None = None, unpadded: list[str] | None = None) -> LayoutResult:
    """`graph` with a storage layout on every tensor (a new graph when anything changes).

    policy "auto" prices each region; "nhwc" stores every region with a convolution channels-last;
    "nchw" keeps everything row-major. `replay` (one flag per region, in `regions` order, as
    `LayoutResult.choices` gives them) repeats an earlier choice without pricing: how an artifact
    rebuilds its graph; `unpadded` (`LayoutResult.unpadded`) repeats its padding choice. Otherwise
    a misaligned channels-last convolution is padded where the pricer says it runs faster so
    (without a pricer, always).
    """
    if policy not in LAYOUT_POLICIES:
        raise ValueError(f"layout policy must be one of {LAYOUT_POLICIES}, got {policy!r}")
    found = regions(graph)
    if replay is not None and len(replay) != len(found):
        raise ValueError(f"the saved layout choice covers {len(replay)} regions, the graph has {len(found)}")
    if policy == "auto" and pricer is None and replay is None and found:
        raise ValueError("layout policy 'auto' needs a pricer")
    wiring = _Wiring.of(graph) if found else None
    for i, r in enumerate(found):
        if replay is None and policy == "nchw":
            continue
        r.gain_s = price(graph, r, pricer, wiring) if pricer is not None and replay is None else 0.0
        if (replay[i] if replay is not None else policy == "nhwc" or r.gain_s > 0):
            r.layout = NHWC
    chosen = [r for r in found if r.layout]
    if unpadded is None and (pricer is None or replay is not None):
        unpadded = []  # the alignment rule: pad every misaligned one
    elif unpadded is None:
        by_name = wiring.by_name if wiring else {}
        unpadded = [c for r in chosen for c in r.convs if padded_channels(graph, by_name[c]) is not None
                    and not pricer.pad(graph, by_name[c])]
    g = graph.clone(copy_constants=False)  # constants are replaced or added, never written
    for r in chosen:
        for t in r.tensors:
            ty = g.types[t]
            g.types[t] = TensorType(ty.shape, ty.dtype, r.layout)
        r.conversions = _convert_conv_operands(g, r)
        r.padded = _pad_conv_channels(g, r, set(unpadded))
    split = _split_strided_reductions(g) if chosen else 0
    matmuls = _pad_matmuls(g)
    if not chosen and not matmuls:
        return LayoutResult(graph, found)
    g.validate()
    return LayoutResult(g, found, split, matmuls, list(unpadded))


def _convert_conv_operands(g: Graph, region: Region) -> int:
    """Each convolution of a channels-last region reads and writes channels-last: where its input
    or output is row-major (a graph input or output), an identity TRANSPOSE converts it."""
    inside = set(region.tensors)
    convs = set(region.convs)
    nodes: list[Node] = []
    count = 0
    for n in g.nodes:
        if n.name not in convs:
            nodes.append(n)
            continue
        x, y = n.inputs[0], n.outputs[0]
        ins, outs = list(n.inputs), list(n.outputs)
        after: list[Node] = []
        if x not in inside:  # x -> x/conv/nhwc, read by the convolution
            ins[0] = f"{x}/{n.name}/nhwc"
            nodes.append(_conversion(g, f"{n.name}/to_nhwc", x, ins[0], g.types[x], region.layout, n.source))
            count += 1
        if y not in inside:  # the convolution writes y/nhwc -> y
            outs[0] = f"{y}/nhwc"
            after.append(_conversion(g, f"{n.name}/from_nhwc", outs[0], y, g.types[y], region.layout, n.source))
            count += 1
        nodes.append(Node(n.name, n.op, tuple(ins), tuple(outs), dict(n.attrs), n.domain, n.source))
        nodes.extend(after)
    g.nodes = nodes
    return count


def _conversion(g: Graph, name: str, src: str, dst: str, logical: TensorType, layout: tuple[int, ...],
                source: tuple[str, ...]) -> Node:
    """An identity TRANSPOSE between `src` and `dst`; the new one of the two (not yet typed) is
    stored in `layout`, the other keeps its row-major type."""
    for t in (src, dst):
        if t not in g.types:
            g.types[t] = TensorType(logical.shape, logical.dtype, layout)
    return Node(name, Prim.TRANSPOSE.value, (src,), (dst,), {"perm": tuple(range(logical.rank))}, source=source)


ALIGN_BYTES = 16  # what cuBLAS and cuDNN want of a leading dimension for their aligned tensor-core kernels


def zero_padded(g: Graph, t: str, shape: tuple[int, ...], out: str, node: str, source: tuple[str, ...],
                 layout: tuple[int, ...] = ()) -> Node | None:
    """`t` zero-padded at the end of each dim to `shape`, as tensor `out`: a constant is padded once
    here (None returned), a computed tensor by the returned PAD primitive."""
    ty = g.types[t]
    g.types[out] = TensorType(shape, ty.dtype, layout)
    widths = [(0, n - m) for m, n in zip(ty.shape, shape)]
    if t in g.constants:
        g.constants[out] = np.pad(g.constants[t], widths)
        return None
    pads = tuple(w[0] for w in widths) + tuple(w[1] for w in widths)
    return Node(node, Prim.PAD.value, (t,), (out,), {"pads": pads, "mode": "constant", "value": 0.0}, source=source)


def _cut_back(g: Graph, padded: str, y: str, node: str, source: tuple[str, ...]) -> Node:
    """The SLICE that cuts a padded result back to `y`'s shape."""
    rank = g.types[y].rank
    return Node(node, Prim.SLICE.value, (padded,), (y,),
                {"starts": (0,) * rank, "steps": (1,) * rank, "shape": g.types[y].shape}, source=source)


def padded_channels(g: Graph, n: Node) -> tuple[int, int] | None:
    """(input channels, output channels) that convolution `n` is padded to when stored NHWC, or
    None where it runs as it is: aligned already, grouped, or with a computed weight. The layout
    pricer times a convolution in this form, since it is the form that runs."""
    if n.op != Prim.CONV.value or n.attrs.get("group", 1) != 1 or n.inputs[1] not in g.constants:
        return None
    unit = max(1, ALIGN_BYTES // g.types[n.inputs[0]].dtype.itemsize)
    o, c = g.types[n.inputs[1]].shape[:2]
    cp, op = -(-c // unit) * unit, -(-o // unit) * unit
    return None if (cp, op) == (c, o) else (cp, op)


def _pad_conv_channels(g: Graph, region: Region, keep: set[str]) -> int:
    """Stored NHWC, a convolution's leading dimension is its channel count. Where that is not a
    multiple of 16 bytes (3 colour channels, a 150-label classifier), the library falls back to
    slow unaligned kernels, so the channels are padded with zeros: the input by a PAD primitive
    (which fuses into the kernel that writes it), the constant weight once here, and the
    output cut back by a SLICE that the next kernel reads through. Zero channels add nothing to
    the result, so it is exact. Grouped convolutions keep their shape, and so do those in `keep`
    (where the pricer found the padded form slower: a template on an RGB input does 8/3 times
    the work padded, and cuDNN's fp16 kernels for 4 channels beat those for 8)."""
    convs = set(region.convs) - keep
    padded_w: dict[tuple[str, int, int], str] = {}
    nodes: list[Node] = []
    count = 0
    for n in g.nodes:
        padding = padded_channels(g, n) if n.name in convs else None
        if padding is None:
            nodes.append(n)
            continue
        x, w, y = n.inputs[0], n.inputs[1], n.outputs[0]
        xt, wt, yt = g.types[x], g.types[w], g.types[y]
        (o, c), (cp, op) = wt.shape[:2], padding
        ins, outs, after = list(n.inputs), list(n.outputs), []
        if cp != c:
            xp = f"{x}/{n.name}/padded"
            node = zero_padded(g, x, (xt.shape[0], cp, *xt.shape[2:]), xp, f"{n.name}/pad_channels", n.source,
                                region.layout)
            if node is not None:
                nodes.append(node)
            ins[0] = xp
        key = (w, cp, op)
        if key not in padded_w:
            padded_w[key] = f"{w}/padded{op}x{cp}"
            zero_padded(g, w, (op, cp, *wt.shape[2:]), padded_w[key], "", n.source)
        ins[1] = padded_w[key]
        if op != o:
            yp = f"{y}/padded"
            g.types[yp] = TensorType((yt.shape[0], op, *yt.shape[2:]), yt.dtype, yt.layout)
            after.append(_cut_back(g, yp, y, f"{n.name}/unpad_channels", n.source))
            outs[0] = yp
        nodes.append(Node(n.name, n.op, tuple(ins), tuple(outs), dict(n.attrs), n.domain, n.source))
        nodes.extend(after)
        count += 1
    g.nodes = nodes
    g.remove_dead()  # weights that only the padded copies replaced
    return count


MIN_PADDED_GEMM = 4096  # output elements below which a matmul is not worth padding


def _pad_matmuls(g: Graph) -> int:
    """A matmul `[..., m, k] @ [..., k, n]` hands the library leading dimensions k (of A) and n (of
    B and the result). Where one is not a multiple of 16 bytes (EfficientViT's linear attention
    multiplies by values with a row of ones appended: n = 17), cuBLAS runs `align1`/`align2`
    kernels. Such a k is zero-padded in both operands and such an n in B, with the result cut back
    by a SLICE: zeros add nothing, so the result is exact. PADs on computed operands fuse into the
    kernels that write them; a constant operand is padded once here. Dims of one alignment unit or
    less are left alone (a matrix-vector product is no tensor-core GEMM, and padding would
    multiply its work), and so are matmuls with fewer than MIN_PADDED_GEMM outputs."""
    nodes: list[Node] = []
    count = 0
    padded: dict[tuple[str, tuple[int, ...]], str] = {}

    def pad(t: str, dim: int, to: int, name: str, source: tuple[str, ...]) -> str:
        shape = g.types[t].shape[:dim] + (to,) + g.types[t].shape[dim + 1:]
        key = (t, shape)
        if key not in padded:
            out = f"{t}/{name}/dim{dim}"  # A @ A pads one tensor along two dims: two names
            node = zero_padded(g, t, shape, out, f"{out}/pad", source)
            if node is not None:
                nodes.append(node)
            padded[key] = out
        return padded[key]

    for n in g.nodes:
        if n.op != Prim.MATMUL.value:
            nodes.append(n)
            continue
        a, b = n.inputs[:2]
        y = n.outputs[0]
        at, bt, yt = g.types[a], g.types[b], g.types[y]
        unit = max(1, ALIGN_BYTES // at.dtype.itemsize)
        if not at.dtype.is_float or not (at.plain and bt.plain and yt.plain):
            nodes.append(n)
            continue
        k, cols = at.shape[-1], bt.shape[-1]
        if at.numel // k * cols < MIN_PADDED_GEMM:
            nodes.append(n)  # launch-bound: a PAD and a SLICE would cost more than alignment saves
            continue
        kp = -(-k // unit) * unit if k > unit else k
        np_ = -(-cols // unit) * unit if cols > unit else cols
        if (kp, np_) == (k, cols):
            nodes.append(n)
            continue
        if kp != k:
            a = pad(a, at.rank - 1, kp, f"k{kp}", n.source)
            b = pad(b, bt.rank - 2, kp, f"k{kp}", n.source)
        if np_ != cols:
            b = pad(b, bt.rank - 1, np_, f"n{np_}", n.source)
        out = y
        if np_ != cols:
            out = f"{y}/padded"
            g.types[out] = TensorType(yt.shape[:-1] + (np_,), yt.dtype)
        nodes.append(Node(n.name, n.op, (a, b, *n.inputs[2:]), (out, *n.outputs[1:]), dict(n.attrs), n.domain,
                          n.source))
        if out != y:
            nodes.append(_cut_back(g, out, y, f"{n.name}/unpad", n.source))
        count += 1
    g.nodes = nodes
    if count:
        g.remove_dead()
    return count


# A reduction over strided rows (H and W of an NHWC tensor) is fast only with many rows side by
# side in a block, and InstanceNorm has N*C rows (32 in candy): one or two programs for the whole
# GPU. Below MIN_ROWS rows such a reduction is split in two levels.
# Thresholds from candy fp16 on the H100 (scripts/results/layout_probe/): splitting its 56x56 norms
# too (MIN_ROW 8192 -> 2048, MIN_PART 64 -> 32) took its generated kernels from 202 to 141 µs.
MIN_ROWS = 2048
MIN_ROW = 2048  # elements per row worth splitting
TARGET_ROWS = 4096  # rows of the first level
MIN_PART = 32  # elements each first-level row still reduces


def _split_strided_reductions(g: Graph) -> int:
    """Split each long reduction over strided rows with few rows: the outermost reduced dim in
    storage order, D, becomes (s, D/s); a first reduction leaves s partial results per row (many
    rows, each still read coalesced across its neighbours), a second reduces those. Sums, maxima
    and minima are associative, so the result is the same up to rounding order."""
    nodes: list[Node] = []
    count = 0
    for n in g.nodes:
        plan = _split_plan(g, n)
        if plan is None:
            nodes.append(n)
            continue
        d, s = plan
        x, y = n.inputs[0], n.outputs[0]
        xt = g.types[x]
        shape5 = xt.shape[:d] + (s, xt.shape[d] // s) + xt.shape[d + 1:]
        # Dims after d move up by one; d's storage slot holds (s, D/s) in that order.
        order = []
        for dim in xt.layout:
            order += [d, d + 1] if dim == d else [dim if dim < d else dim + 1]
        axes = sorted(a if a < d else a + 1 for a in n.attrs["axes"] if a != d) + [d + 1]
        axes = sorted(axes)
        xs = f"{x}/{n.name}/split"
        part = f"{y}/partial"
        whole = f"{y}/split"
        g.types[xs] = TensorType(shape5, xt.dtype, tuple(order))
        part_shape = tuple(1 if i in axes else v for i, v in enumerate(shape5))
        g.types[part] = TensorType(part_shape, xt.dtype, tuple(order))
        g.types[whole] = TensorType(tuple(1 if i in axes or i == d else v for i, v in enumerate(shape5)), xt.dtype,
                                    tuple(order))
        nodes += [
            Node(f"{n.name}/split", Prim.RESHAPE.value, (x,), (xs,), {"shape": shape5}, source=n.source),
            Node(f"{n.name}/partial", n.op, (xs,), (part,), {**n.attrs, "axes": tuple(axes)}, source=n.source),
            Node(f"{n.name}/whole", n.op, (part,), (whole,), {**n.attrs, "axes": tuple(sorted({d, *axes}))},
                 source=n.source),
            Node(n.name, Prim.RESHAPE.value, (whole,), (y,), {"shape": g.types[y].shape}, source=n.source)]
        count += 1
    g.nodes = nodes
    return count


def _split_plan(g: Graph, n: Node) -> tuple[int, int] | None:
    """(dim to split, parts) for a reduction worth splitting, else None."""
    if n.op not in {p.value for p in REDUCTIONS}:
        return None
    t = g.types[n.inputs[0]]
    if t.plain or not t.dtype.is_float:
        return None
    axes = [a for a in n.attrs["axes"] if t.shape[a] != 1]
    if not axes or t.rows_contiguous(axes):
        return None  # rows are contiguous: the ordinary row kernel reads them well
    order = [dim for dim in t.layout if t.shape[dim] != 1]
    row = math.prod(t.shape[a] for a in axes)
    rows = t.numel // row
    if rows >= MIN_ROWS or row < MIN_ROW:
        return None
    d = next(dim for dim in order if dim in axes)  # the outermost reduced dim in storage
    size = t.shape[d]
    for s in range(2, size + 1):
        if size % s == 0 and rows * s >= TARGET_ROWS:
            return (d, s) if row // s >= MIN_PART else None
    return None
