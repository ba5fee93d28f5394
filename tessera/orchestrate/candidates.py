"""Candidate kernels: which sets of primitives may form one GPU kernel.

A candidate is a convex, connected set of orchestrated nodes plus the subset
of them it writes to memory. Convex sets are exactly the differences S' \\ S of
two comparable execution states (Korch); this module enumerates them directly
as connected sets (ESU: each connected set once, by extension from its
lowest node) filtered for convexity, which avoids visiting the same difference
from many state pairs. Connected means linked by a dataflow edge or by reading
a common tensor (sibling fusion, e.g. three projections of one input).

This module decides legality only; it never looks at costs. Pruning rules:
- size: at most `max_nodes` nodes;
- at most `max_linear` linear primitives per kernel (two where GEMM chains are
  enabled: `StructuralLegality(chains=True)` says which pairs form one);
- an opaque primitive is a kernel of its own;
- the code generator's verdict, through `KernelLegality`.
The first three are monotone (no superset of an illegal set is legal), so the
enumeration prunes on them; the code generator's verdict is asked last. Then a
legal set that stops one free node short of another legal set (`stops_short`: a
lone reshape of its value, a bias add after a slice of its product) is dropped,
with what could only read the value it wrote. A cold compile of segformer_b0,
whose merged key and value projections have such tails, timed 8976 kernels
without this and 4692 with it.

One exception to the size rule: a GEMM chain also comes grown (`grow_chain`) by
its operands' layout prologue and by the elementwise nodes computed from its
values alone, up to `max_chain_growth` more nodes. Attention's chain alone
fills the size (GPT-2's: 16 nodes from the scale to the second product), so
without it the head split of a fused QKV projection (three slices, reshapes and
transposes) would stay a copy kernel of its own, though the chain template reads
through it at index arithmetic, and the deferred division with its NaN guard
(`rewrite/deferred.py`) would leave the chain's row sums to another kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import prod
from typing import Protocol

from tessera.ir.dtype import DType
from tessera.ir.graph import Node
from tessera.ir.prims import CATEGORY_OF, Category, Prim
from tessera.orchestrate.graphview import OGraph, bits
from tessera.orchestrate.rotary import rotary_epilogues, rotary_nodes


_REDUCE_OPS = {Prim.REDUCE_SUM.value, Prim.REDUCE_MAX.value, Prim.REDUCE_MIN.value}
# Layout primitives an operand prologue may hold: a template loads the operand at index arithmetic
# through them (attention's K transpose, a head split, a padded or concatenated operand), so they
# cost no copy kernel. An epilogue holds none: its values are stored at the product's indices.
_PROLOGUE_LAYOUT = {Prim.TRANSPOSE.value, Prim.SLICE.value, Prim.PAD.value, Prim.CONCAT.value}
_POINTWISE = {Prim.RESHAPE.value, Prim.BROADCAST.value}  # layout primitives that act element by element


def _pointwise(op: str) -> bool:
    """Element by element: an elementwise primitive, or a reshape or broadcast."""
    return CATEGORY_OF[op] is Category.ELEMENTWISE or op in _POINTWISE


def prologue_op(op: str) -> bool:
    """Work a template can do where it loads an operand tile: elementwise and operand-layout primitives."""
    return _pointwise(op) or op in _PROLOGUE_LAYOUT


def moves_columns(node: Node) -> bool:
    """A transpose that moves its input's last axis (a GEMM chain's columns) inward: a 1x1
    convolution pair's result, computed over pixel rows, put back in NCHW order
    (`rewrite/rules/pointwise_conv.py`). A chain stores its tile at the permuted indices
    (`codegen/tile.store_outputs`). Transposes that keep the last axis last (attention's head merge)
    are not taken in: admitting every transpose into chain and GEMM epilogues made 27% more kernels
    to time in segformer_b0's cold compile (6633 against 5213, `scripts/tuning_jobs.py`)."""
    perm = node.attrs.get("perm") if node.op == Prim.TRANSPOSE.value else None
    return perm is not None and perm[-1] != len(perm) - 1


def transposes_matrix(node: Node) -> bool:
    """A transpose of the last two axes only: what a library matmul takes as a strided view of its
    operand (cuBLAS's transposed-operand mode, as PyTorch passes `k.transpose(-1, -2)`), so
    joining the matmul's kernel costs no copy and no launch."""
    perm = tuple(node.attrs.get("perm", ())) if node.op == Prim.TRANSPOSE.value else ()
    r = len(perm)
    return r >= 2 and perm == (*range(r - 2), r - 1, r - 2)


class TooManyCandidates(Exception):
    """A subgraph has more candidates than allowed; the caller splits it."""


class KernelLegality(Protocol):
    """The code generator's say: None if it can generate `mask` as one kernel, else why not."""

    def check(self, og: OGraph, mask: int) -> str | None: ...


# Primitives per candidate kernel. 16 admits candy's InstanceNorm -> ReLU -> Pad (16 primitives)
# and a layernorm with the residual add before it. Against 12, the old value, candidates grow
# 5-16% and wide subgraphs split more often, but no analytical plan checked got dearer and most
# got cheaper, with fewer kernels (scripts/cap_check.py, scripts/results/cap_check_cpu.md).
MAX_KERNEL_NODES = 16


@dataclass(frozen=True)
class CandidateRules:
    max_nodes: int = MAX_KERNEL_NODES
    max_linear: int = 1
    # Optional outputs (nodes read outside the kernel that are not its sinks):
    # up to this many, every subset is a variant; more, only none or all.
    output_subset_limit: int = 2
    max_candidates: int = 40_000
    max_chain_growth: int = 16  # nodes a GEMM chain may add past max_nodes (`grow_chain`)
    max_chain_prologue: int = 32  # and then computed prologue nodes (`compute_prologue`)
    max_norm_prologue: int = 32  # nodes a one-matmul candidate may add past max_nodes: a norm before it
    max_rotary_epilogue: int = 32  # and the rotations of q and k after it (`orchestrate/rotary.py`)


@dataclass(frozen=True)
class Candidate:
    """One candidate kernel: the nodes it computes and those it writes."""

    nodes: int
    outputs: int
    inputs: int  # orchestrated nodes outside the kernel that it reads

    @property
    def size(self) -> int:
        return self.nodes.bit_count()


class StructuralLegality:
    """What any backend can generate, judged from the primitives alone.

    A kernel with a linear primitive holds only that primitive and an epilogue
    computed from its result (elementwise, reshape and unit-step slice primitives
    that read it, directly or through each other), as GEMM/conv templates with fused
    epilogues allow; with `prologues`, also elementwise and layout primitives
    (reshape, broadcast, transpose, slice, pad, concat) that feed its operands
    (a template computes them while it loads the operand tile; the library
    cannot), and before a matmul the row statistics of a norm that read only
    what the operand reads (`_statistic_check`; a GEMM template computes them
    in loops before its K loop). Reductions in one kernel share one shape
    and one set of axes (one reduction loop), and a pooling window does not mix
    with them. Everything else (elementwise, layout) may mix.

    With `chains`, a kernel may hold two matmuls where the second's left operand
    is computed from the first's result (a GEMM chain, `codegen/chain.py`): the
    middle between them is elementwise, broadcast, reshape and row reductions,
    the operands of both may have a prologue, and what follows the second is
    its epilogue.
    """

    def __init__(self, prologues: bool = False, chains: bool = False) -> None:
        self.prologues = prologues
        self.chains = chains

    def check(self, og: OGraph, mask: int) -> str | None:
        g = og.graph
        loops = {(g.types[og.nodes[i].inputs[0]].shape, og.nodes[i].attrs["axes"])
                 for i in bits(mask) if og.nodes[i].op in _REDUCE_OPS}
        windows = sum(1 for i in bits(mask) if og.nodes[i].op == Prim.WINDOW_REDUCE.value)
        if len(loops) > 1 or windows > 1 or (windows and loops):
            return "reductions over different shapes or axes need separate loops"
        linear = [i for i in bits(mask) if CATEGORY_OF[og.nodes[i].op] is Category.LINEAR]
        if not linear:
            return None
        if len(linear) == 2 and self.chains:
            return _chain_check(og, mask, *linear)
        if len(linear) > 1:
            return "two linear primitives share a kernel only as a GEMM chain"
        (root,) = linear
        rotary = rotary_nodes(og, mask, root) if og.nodes[root].op == Prim.MATMUL.value else 0
        for i in bits(mask & ~(1 << root)):
            op = og.nodes[i].op
            pointwise = _pointwise(op)
            if (rotary >> i) & 1:
                continue  # a rotation in the epilogue, from the accumulator's registers (`orchestrate/rotary.py`)
            if self.prologues and (og.desc[i] >> root) & 1:
                if pointwise or op in _PROLOGUE_LAYOUT:
                    continue  # an operand prologue: computed where the template loads the operand
                if op in _REDUCE_OPS and og.nodes[root].op == Prim.MATMUL.value:
                    why = _statistic_check(og, mask, root, i)
                    if why:
                        return why
                    continue  # a row statistic (a norm's): a GEMM template computes it before its K loop
                return f"{op} cannot join a linear kernel's operand prologue"
            if og.nodes[root].op == Prim.MATMUL.value and transposes_matrix(og.nodes[i]) \
                    and og.succs[i] == 1 << root and not (og.graph_outputs >> i) & 1:
                continue  # the library call reads it as a transposed view
            if op == Prim.SLICE.value and (og.anc[i] >> root) & 1 \
                    and all(step == 1 for step in og.nodes[i].attrs["steps"]):
                continue  # an epilogue that writes part of the product (`codegen/tile.partial_outputs`)
            if not pointwise:
                return f"{op} cannot join a linear kernel"
            if (og.anc[i] >> root) & 1:
                continue  # an epilogue
            if epilogue_view(og, mask, root, i):
                continue  # a value the epilogue reads through a broadcast or reshape: index arithmetic there
            return f"{og.nodes[i].name} is neither computed from the linear result nor feeds its operands"
        return None


def epilogue_view(og: OGraph, mask: int, root: int, i: int) -> bool:
    """Whether node `i` of linear kernel `mask` is a broadcast or reshape of a value from outside that
    only the kernel's epilogue reads, through views alone (a rotary embedding's cos and sin gathered
    at runtime positions, broadcast over the heads): the epilogue reads the smaller tensor at the view's
    indices, so the view is never written. It must not feed the product nor be read outside."""
    todo, seen = [i], 0
    while todo:
        j = todo.pop()
        if (seen >> j) & 1:
            continue
        seen |= 1 << j
        if og.nodes[j].op not in _POINTWISE or (og.desc[j] >> root) & 1 or og.succs[j] & ~mask \
                or (og.graph_outputs >> j) & 1:
            return False
        for k in bits(og.succs[j]):
            if not (og.anc[k] >> root) & 1:
                todo.append(k)  # another view on the way to the epilogue
    return True


def _reads(og: OGraph, mask: int, start: int) -> tuple[int, frozenset[str]]:
    """What `start` and the nodes of `mask` it is computed from read from outside `mask`: the
    orchestrated producers and the graph inputs. The walk stops at the kernel's reductions (their own
    reads are theirs) other than `start`."""
    outside, inputs = 0, set()
    seen, todo = 0, [start]
    while todo:
        i = todo.pop()
        if (seen >> i) & 1:
            continue
        seen |= 1 << i
        outside |= og.preds[i] & ~mask
        inputs |= {t for t in og.external[i] if t not in og.graph.constants}
        todo.extend(j for j in bits(og.preds[i] & mask) if og.nodes[j].op not in _REDUCE_OPS)
    return outside, frozenset(inputs)


def _statistic_check(og: OGraph, mask: int, root: int, stat: int) -> str | None:
    """Why reduction `stat` is no row statistic of GEMM kernel `mask`'s operand prologue (None: it
    is). It must read nothing that the operands' own computation does not read: its loop before the
    K loop then only reads again, from L2, rows the K loop loads anyway (a LayerNorm's mean and
    variance of the x it normalizes). A statistic of something else (the squares of a norm cut
    apart, read back from memory) would add a stream of its own, and kernels of such partial norms
    would only multiply the candidates. Nor may it reduce more elements per row than the K loop
    walks: a statistic over other axes (an InstanceNorm's, over the pixels that are the product's
    rows) is recomputed by every program for each of its rows, thousands of times the norm's own
    work (the fuzzer's fake-tuned Einsum of a 32 x 128 x 32 InstanceNorm, session 57)."""
    node, g = og.nodes[stat], og.graph
    shape, k = g.types[node.inputs[0]].shape, g.types[og.nodes[root].inputs[0]].shape[-1]
    if prod(shape[d] for d in node.attrs["axes"]) > k:
        return (f"{node.name}: a GEMM prologue's row statistic reduces at most the {k} elements of a row that "
                f"the K loop walks")
    need_nodes, need_inputs = _reads(og, mask, stat)
    have_nodes, have_inputs = _reads(og, mask, root)
    if need_nodes & ~have_nodes or need_inputs - have_inputs:
        return f"{og.nodes[stat].name}: a GEMM prologue's row statistic reads only what its operand reads"
    return None


def _chain_check(og: OGraph, mask: int, a: int, b: int) -> str | None:
    """Why nodes `mask` with matmuls `a` and `b` are no GEMM chain (None: they may be one)."""
    if not all(og.nodes[i].op == Prim.MATMUL.value for i in (a, b)):
        return "a GEMM chain joins two matmuls"
    first, second = (a, b) if (og.desc[a] >> b) & 1 else (b, a)
    if not (og.desc[first] >> second) & 1:
        return "two matmuls share a kernel only when one is computed from the other"
    for i in bits(mask & ~(1 << first) & ~(1 << second)):
        op = og.nodes[i].op
        pointwise = _pointwise(op)
        if (og.anc[i] >> second) & 1:  # the second product's epilogue (a column transpose: a permuted store)
            if not (pointwise or moves_columns(og.nodes[i])):
                return f"{op} cannot join a GEMM chain's epilogue"
        elif (og.anc[i] >> first) & 1:  # the middle: computed from the first product, before the second
            if not (pointwise or op in _REDUCE_OPS):
                return f"{op} cannot sit between a GEMM chain's products"
        elif not (pointwise or op in _PROLOGUE_LAYOUT):  # an operand prologue
            return f"{op} cannot join a GEMM chain's operand prologue"
    return None


def bias_groups(og: OGraph, members: int, legality: KernelLegality) -> list[int]:
    """In a float16/bfloat16 graph, each linear primitive of `members` with the bias add of its own
    ONNX node (a Gemm's or a Conv's: `Node.same_source`), joined through the reshapes, unit-step
    slices and the node's own scale (a Gemm's alpha) between them, as one node set. Such a product
    is never written: stored, it rounds to the narrow type before its bias is added, where
    onnxruntime rounds once, after the add, and a bias that nearly cancels the product amplifies the
    difference (the fuzzer's fp16 `Relu(Gemm(x, c, b))`, 1.2% off). In one kernel the bias is added
    in float32, by a template's epilogue or by the library call
    (`codegen/select._library_epilogue`). A pair that cannot be one kernel (`legality`) or that
    other nodes also read between is left alone."""
    groups = []
    for i in bits(members):
        node = og.nodes[i]
        if CATEGORY_OF[node.op] is not Category.LINEAR or not node.source \
                or og.graph.types[node.outputs[0]].dtype not in (DType.FLOAT16, DType.BFLOAT16):
            continue
        group, cur = 1 << i, i
        while og.succs[cur].bit_count() == 1 and not (og.graph_outputs >> cur) & 1:
            nxt = og.succs[cur].bit_length() - 1
            op = og.nodes[nxt].op
            if op == Prim.ADD.value and node.same_source(og.nodes[nxt]) and (members >> nxt) & 1:
                group |= 1 << nxt
                if og.is_convex(group) and legality.check(og, group) is None:
                    groups.append(group)
                break
            scale = op == Prim.MUL.value and node.same_source(og.nodes[nxt]) and og.preds[nxt] == 1 << cur
            if not (op == Prim.RESHAPE.value or scale or (op == Prim.SLICE.value and all(
                    step == 1 for step in og.nodes[nxt].attrs["steps"]))) or not (members >> nxt) & 1:
                break
            group, cur = group | (1 << nxt), nxt
    return groups


def unwritten(groups: list[int]) -> int:
    """The nodes of `bias_groups` that no kernel may write: all but each group's add."""
    out = 0
    for g in groups:
        out |= g & ~(1 << (g.bit_length() - 1))  # the add comes last in topological order
    return out


def _monotone_ok(og: OGraph, mask: int, rules: CandidateRules, linear: int, opaque: int) -> bool:
    if mask.bit_count() > rules.max_nodes:
        return False
    if (mask & linear).bit_count() > rules.max_linear:
        return False
    return not (mask & opaque) or mask.bit_count() == 1


def _output_variants(og: OGraph, mask: int, rules: CandidateRules) -> list[int]:
    """Sinks are always written; other nodes read outside may be written or recomputed by readers."""
    needed = og.consumers_outside(mask)
    sinks = og.sinks(mask) & needed
    optional = bits(needed & ~sinks)
    if len(optional) <= rules.output_subset_limit:
        subsets = [c for r in range(len(optional) + 1) for c in combinations(optional, r)]
    else:
        subsets = [(), tuple(optional)]
    return [sinks | sum(1 << i for i in s) for s in subsets]


_LAYOUT = _POINTWISE | {Prim.TRANSPOSE.value, Prim.SLICE.value}  # pure re-indexing: no padding or joining


def layout_prologue(og: OGraph, mask: int, members: int, limit: int) -> int:
    """Layout nodes of `members` outside `mask` that feed it through layout nodes only and are read
    nowhere else (at most `limit`, nearest first): what a template reads through as index
    arithmetic, so taking them in removes their copy without adding an output."""
    taken = 0
    frontier = mask
    while frontier:
        preds = 0
        for i in bits(frontier):
            preds |= og.preds[i]
        new = 0
        for i in bits(preds & members & ~mask & ~taken):
            if og.nodes[i].op in _LAYOUT and not og.succs[i] & ~(mask | taken | (1 << i)) \
                    and not (og.graph_outputs >> i) & 1:
                if (taken | new).bit_count() == limit:
                    return taken | new
                new |= 1 << i
        taken |= new
        frontier = new
    return taken


def pointwise_epilogue(og: OGraph, mask: int, members: int, limit: int, transposes: bool = False) -> int:
    """Elementwise nodes of `members` outside `mask` computed from its values (and constants)
    alone, repeatedly (at most `limit`): a template computes them where it holds those values.
    With `transposes`, column transposes too (`moves_columns`: a chain stores its tile permuted)."""
    taken = 0
    grew = True
    while grew:
        grew = False
        inside = mask | taken
        for i in bits(og.readers_of(inside) & members & ~inside):
            op = og.nodes[i].op
            if (_pointwise(op) or (transposes and moves_columns(og.nodes[i]))) and not og.preds[i] & ~(inside | taken):
                if taken.bit_count() == limit:
                    return taken
                taken |= 1 << i
                grew = True
    return taken


def compute_prologue(og: OGraph, mask: int, members: int, limit: int, statistics: bool = False) -> int:
    """Elementwise and operand-layout nodes of `members` outside `mask` that feed it and are read
    nowhere else (at most `limit`): what a template computes where it loads an operand tile (a
    rotary embedding's products, negation and concatenation of halves before attention), so taking
    them in removes their kernel and the round trip of its result. Repeated until nothing more
    joins: a value read twice inside (q, by the product with cos and by the halves rotated) joins
    once both readers have. With `statistics`, reductions too (a norm's row statistics, which a GEMM
    template computes before its K loop)."""
    taken = 0
    grew = True
    while grew:
        grew = False
        inside = mask | taken
        preds = 0
        for i in bits(inside):
            preds |= og.preds[i]
        for i in bits(preds & members & ~inside):
            op = og.nodes[i].op
            if (prologue_op(op) or (statistics and op in _REDUCE_OPS)) and not og.succs[i] & ~(mask | taken) \
                    and not (og.graph_outputs >> i) & 1:
                if taken.bit_count() == limit:
                    return taken
                taken |= 1 << i
                grew = True
    return taken


def grow_chain(og: OGraph, mask: int, members: int, limit: int) -> int:
    """What a GEMM chain candidate takes in past the size rule: its elementwise epilogue and column
    transposes computed from its own values (`pointwise_epilogue`: a 1x1 convolution pair's result
    back in NCHW order), then the layout prologue of its operands (`layout_prologue`), `limit` nodes
    at most."""
    epi = pointwise_epilogue(og, mask, members, limit, transposes=True)
    return epi | layout_prologue(og, mask | epi, members, limit - epi.bit_count())


def norm_prologues(og: OGraph, sets: list[int], members: int, linear: int, limit: int) -> list[int]:
    """One-matmul sets of `sets` grown by the computed prologue of their operands, row statistics
    included (`compute_prologue` with `statistics`), where that takes in a reduction: a LayerNorm or
    RMSNorm whose only reader is the projection after it, which a GEMM template computes where it
    loads its left operand (`codegen/gemm.py`). The norm with the residual add before it is 16
    primitives, the size rule's whole budget, so these sets exceed it. New sets only."""
    seen = set(sets)
    out = []
    for mask in sets:
        roots = mask & linear
        if roots.bit_count() != 1 or og.nodes[roots.bit_length() - 1].op != Prim.MATMUL.value:
            continue
        pro = compute_prologue(og, mask, members, limit, statistics=True)
        if pro and any(og.nodes[i].op in _REDUCE_OPS for i in bits(pro)) and mask | pro not in seen:
            seen.add(mask | pro)
            out.append(mask | pro)
    return out


def stops_short(og: OGraph, mask: int, members: int, linear: int) -> int:
    """Nodes of `members` that `mask` stops just short of, where taking each in costs the kernel
    nothing or nearly nothing (a bitmask; `enumerate_candidates` drops `mask` where that larger
    kernel is a legal candidate too):
    - a reshape that only re-indexes a value of `mask` read nowhere else: both kernels store the same
      bytes (a reshape is index arithmetic in any kernel), so timing both only doubles the work;
    - in a linear kernel's epilogue, an element-by-element node after a slice of the product, computed
      from the kernel's values alone (a split projection's bias add). A merged Q, K and V projection
      has three slices with a bias add and reshapes after each; stopping every tail anywhere gave one
      of segformer_b0's merged projections 298 candidates, each timed per schedule family. Which
      slices the kernel writes stays free (GPT-2's plan writes one of three, and its attention reads
      the others through the whole product)."""
    short = 0
    for t in bits(og.readers_of(mask) & members & ~mask):
        if og.nodes[t].op == Prim.RESHAPE.value and not og.preds[t] & ~mask \
                and all(not og.succs[p] & ~mask & ~(1 << t) and not (og.graph_outputs >> p) & 1
                        for p in bits(og.preds[t])):
            short |= 1 << t
    roots = mask & linear
    if roots.bit_count() == 1:
        root = roots.bit_length() - 1
        slices = sum(1 << i for i in bits(mask) if og.nodes[i].op == Prim.SLICE.value and (og.anc[i] >> root) & 1)
        after = sum(1 << i for i in bits(mask) if (slices >> i) & 1 or og.anc[i] & slices)
        for t in bits(og.readers_of(after) & members & ~mask):
            if _pointwise(og.nodes[t].op) and not og.preds[t] & ~mask:
                short |= 1 << t
    return short


# Primitives that read their input at index arithmetic: a kernel that takes one in loads what the
# primitive would have stored (a gather also loads its indices), so it reads about the bytes it would
# have read from the primitive's stored value.
_INDEXING = {Prim.GATHER.value, Prim.RESHAPE.value, Prim.BROADCAST.value, Prim.SLICE.value}


def starts_short(og: OGraph, mask: int, members: int, linear: int) -> int:
    """Nodes of `members` that memory-bound kernel `mask` reads, where taking each in costs the kernel
    nearly nothing (a bitmask; `enumerate_candidates` drops `mask` where that larger kernel is a legal
    candidate too): an indexing primitive (`_INDEXING`) whose own inputs all come from outside the
    subgraph, so the larger kernel needs nothing more in memory than `mask` does. CANINE sums eight
    hashed embedding lookups: leaving each lookup in or out made 2^8 variants of the kernel after them,
    5404 candidates in one subgraph, and 24 s in the solver to prove which of their near-equal plans
    is cheapest. Kernels with a linear primitive keep their variants: a template would gather its
    operand once per output tile."""
    if mask & linear:
        return 0
    short = 0
    for u in bits(og.inputs_of(mask) & members):
        if og.nodes[u].op in _INDEXING and not og.preds[u] & members:
            short |= 1 << u
    return short


def enumerate_candidates(og: OGraph, members: int, rules: CandidateRules,
                         legality: KernelLegality) -> list[Candidate]:
    """Every legal candidate kernel inside subgraph `members`, with its output variants."""
    linear = opaque = 0
    for i in bits(members):
        cat = CATEGORY_OF[og.nodes[i].op]
        if cat is Category.LINEAR:
            linear |= 1 << i
        elif cat is Category.OPAQUE:
            opaque |= 1 << i
    adj = [(og.preds[i] | og.succs[i] | og.siblings[i]) & members if (members >> i) & 1 else 0
           for i in range(og.n)]
    sets: list[int] = []

    # A convex superset of `sub` contains its hull sub | (anc(sub) & desc(sub)),
    # so a hull that breaks a monotone rule prunes the whole branch.
    def extend(sub: int, ext: int, nbhd: int, v: int, below: int, above: int) -> None:
        sets.append(sub)
        if len(sets) > rules.max_candidates:
            raise TooManyCandidates(f"more than {rules.max_candidates} connected sets")
        while ext:
            w = (ext & -ext).bit_length() - 1
            ext &= ~(1 << w)
            grown = sub | (1 << w)
            b2, a2 = below | og.anc[w], above | og.desc[w]
            if not _monotone_ok(og, grown | (b2 & a2), rules, linear, opaque):
                continue
            excl = adj[w] & ~grown & ~nbhd & ~((1 << (v + 1)) - 1)
            extend(grown, ext | excl, nbhd | adj[w], v, b2, a2)

    for v in bits(members):
        later = adj[v] & ~((1 << (v + 1)) - 1)
        extend(1 << v, later, adj[v] | (1 << v), v, og.anc[v], og.desc[v])

    if rules.max_linear >= 2 and rules.max_chain_growth:
        seen = set(sets)
        for mask in list(sets):
            if (mask & linear).bit_count() < 2:
                continue
            grown = mask | grow_chain(og, mask, members, rules.max_chain_growth)
            if grown not in seen:
                seen.add(grown)
                sets.append(grown)
            computed = grown | compute_prologue(og, grown, members, rules.max_chain_prologue)
            if computed not in seen:
                seen.add(computed)
                sets.append(computed)

    if rules.max_norm_prologue:
        sets.extend(norm_prologues(og, sets, members, linear, rules.max_norm_prologue))
    if rules.max_rotary_epilogue:
        sets.extend(rotary_epilogues(og, sets, members, linear, rules.max_rotary_epilogue))

    legal = [mask for mask in sets if og.is_convex(mask) and legality.check(og, mask) is None]
    kept = set(legal)
    masks = [m for m in legal if not any(m | (1 << t) in kept for t in
                                         bits(stops_short(og, m, members, linear) | starts_short(og, m, members, linear)))]
    # The twin of a dropped kernel writes the reshape, so whatever read the value through that
    # reshape must exist without it too, reading the twin's output. ESU enumerated that smaller set
    # already where it is connected; a GEMM chain grown past the size rule by its operands' layout
    # prologue (`grow_chain`) has no such twin: add it.
    have = set(masks)
    for m in [m for m in masks if m.bit_count() > rules.max_nodes]:
        lead = sum(1 << r for r in bits(m) if og.nodes[r].op == Prim.RESHAPE.value and not og.preds[r] & m)
        bare = m & ~lead
        if lead and bare and bare not in have and og.is_convex(bare) and legality.check(og, bare) is None:
            have.add(bare)
            masks.append(bare)
    keep = unwritten(bias_groups(og, members, legality))
    out = [Candidate(m, o, og.inputs_of(m)) for m in masks for o in _output_variants(og, m, rules) if not o & keep]
    return _runnable(og, members, rules, legality, out, have, keep)


def _runnable(og: OGraph, members: int, rules: CandidateRules, legality: KernelLegality,
              out: list[Candidate], have: set[int], keep: int = 0) -> list[Candidate]:
    """`out` less the candidates that read a value no candidate writes any more: the kernel that
    stopped just before the reshape of that value is gone (`stops_short`), its larger twin writes
    the reshape instead. A kernel that read the value through the same reshape (a GEMM chain grown
    by its operands' layout prologue) comes back without the reshape, reading what the twin writes."""
    while True:
        written = 0
        for c in out:
            written |= c.outputs
        runnable = [c for c in out if not c.inputs & members & ~written]
        if len(runnable) == len(out):
            return out
        stuck, out = [c for c in out if c.inputs & members & ~written], runnable
        for c in stuck:
            reshapes = 0
            for u in bits(c.inputs & members & ~written):
                reshapes |= og.succs[u] & c.nodes
            mask = c.nodes & ~reshapes
            if mask in have or not mask or any(og.nodes[i].op != Prim.RESHAPE.value for i in bits(reshapes)) \
                    or not og.is_convex(mask) or legality.check(og, mask) is not None:
                continue
            have.add(mask)
            out.extend(Candidate(mask, o, og.inputs_of(mask)) for o in _output_variants(og, mask, rules)
                       if not o & keep)
