"""Rotary positions in a GEMM template's epilogue: the halves of a head swapped in registers.

Llama-family attention rotates q and k right after their projection: `q * cos + rotate_half(q) * sin`,
where rotate_half(q) = concat(-q[..., s:], q[..., :s]) over a head of 2s values. Element d of the result
reads q at d + s or d - s: the other half of the same head. A GEMM template holds q as the accumulator of its
tile, where a head's 2s columns lie side by side in one tile when the tile is a whole number of heads
wide. So the partner of every lane is another lane of the same tile, and rotate_half is a permutation of
the accumulator's registers (`swap_halves`), not a read of the product at other indices, which a template
cannot do. This moves the rotary kernels of a Llama layer (q's and k's) into the projection before them.

GPT-J and CodeGen rotate interleaved pairs instead: rotate_every_two(q) = stack(-q[..., 1::2], q[..., ::2])
flattened, element d reads q at d + 1 or d - 1, the same swap over runs of two columns (`pairs_swap`, at the
reshape that flattens the stack).

`halves_swap` recognises the concat; `partner_columns` checks, on the index map of the layout primitives
between the product and q, that q's element d ± s is the product's column n ± s of the same row, so
the permutation within the tile is exact; the template (`codegen/gemm.py`) then reads q at the tile's
lanes and emits the swap. Any other kernel computes the concat as before, by reading at other indices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tessera.codegen.triton_ops import Val
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import CATEGORY_OF, Category, Prim


@dataclass(frozen=True)
class HalvesSwap:
    """concat(±x[..., s:2s], ±x[..., :s]) along `axis`: element d is sign(d) * x at d + s (d < s) or d - s.
    With `pairs`, the interleaved form over runs of two (s = 1): element d is sign * x at d + 1 (d even) or
    d - 1 (d odd), along an axis of any even length."""

    x: str
    axis: int
    half: int  # s
    signs: tuple[int, int]  # of the first half's elements (d < s) and of the second's
    pairs: bool = False


def _signed_slice(producer: dict[str, Node], t: str) -> tuple[int, Node] | None:
    """(sign, slice node) where t is a slice, or the negation of one."""
    n = producer.get(t)
    sign = 1
    if n is not None and n.op == Prim.NEG.value:
        sign, n = -1, producer.get(n.inputs[0])
    if n is None or n.op != Prim.SLICE.value:
        return None
    return sign, n


def halves_swap(graph: Graph, producer: dict[str, Node], node: Node) -> HalvesSwap | None:
    """The concat `node` as a swap of the two halves of one tensor's axis, or None."""
    if node.op != Prim.CONCAT.value or len(node.inputs) != 2:
        return None
    parts = [_signed_slice(producer, t) for t in node.inputs]
    if None in parts:
        return None
    (s0, a), (s1, b) = parts  # type: ignore[misc]
    x = a.inputs[0]
    shape = graph.types[x].shape
    axis = node.attrs["axis"] % len(shape)
    if b.inputs[0] != x or shape[axis] % 2:
        return None
    half = shape[axis] // 2
    for sl, start in ((a, half), (b, 0)):
        out = graph.types[sl.outputs[0]].shape
        if any(step != 1 for step in sl.attrs["steps"]) or out[axis] != half \
                or any(st != (start if d == axis else 0) for d, st in enumerate(sl.attrs["starts"])) \
                or any(o != (half if d == axis else n) for d, (o, n) in enumerate(zip(out, shape))):
            return None
    return HalvesSwap(x, axis, half, (s0, s1))


def _unsqueezed(graph: Graph, producer: dict[str, Node], t: str) -> tuple[int, Node] | None:
    """(sign, step-2 slice of the last axis) where t is that slice, negated or not, with a unit axis added
    last (in either order: -x.unsqueeze(-1) or (-x).unsqueeze(-1))."""
    n = producer.get(t)
    sign = 1
    if n is not None and n.op == Prim.NEG.value:
        sign, n = -1, producer.get(n.inputs[0])
    if n is None or n.op != Prim.RESHAPE.value or graph.types[t].shape != graph.types[n.inputs[0]].shape + (1,):
        return None
    got = _signed_slice(producer, n.inputs[0])
    if got is None:
        return None
    s2, sl = got
    return sign * s2, sl


def pairs_swap(graph: Graph, producer: dict[str, Node], node: Node) -> HalvesSwap | None:
    """The reshape `node` as a swap of neighbouring elements of one tensor's last axis, or None:
    reshape(concat([±x[..., 1::2, None], ±x[..., ::2, None]], -1)) back to x's shape (GPT-J's
    rotate_every_two), so element d is sign * x[d + 1] for even d and sign * x[d - 1] for odd d."""
    if node.op != Prim.RESHAPE.value:
        return None
    cat = producer.get(node.inputs[0])
    if cat is None or cat.op != Prim.CONCAT.value or len(cat.inputs) != 2:
        return None
    stacked = graph.types[cat.outputs[0]].shape
    if cat.attrs["axis"] % len(stacked) != len(stacked) - 1 or stacked[-1] != 2:
        return None
    parts = [_unsqueezed(graph, producer, t) for t in cat.inputs]
    if None in parts:
        return None
    (s0, a), (s1, b) = parts  # type: ignore[misc]
    x = a.inputs[0]
    shape = graph.types[x].shape
    if b.inputs[0] != x or graph.types[node.outputs[0]].shape != shape or shape[-1] % 2:
        return None
    last = len(shape) - 1
    for sl, start in ((a, 1), (b, 0)):  # even elements read the odd ones, odd elements the even ones
        if list(sl.attrs["steps"]) != [1] * last + [2] or list(sl.attrs["starts"]) != [0] * last + [start] \
                or graph.types[sl.outputs[0]].shape != shape[:-1] + (shape[-1] // 2,):
            return None
    return HalvesSwap(x, last, 1, (s0, s1), pairs=True)


def swap_of(graph: Graph, producer: dict[str, Node], node: Node) -> HalvesSwap | None:
    """`node` as a swap of its tensor's elements (`halves_swap` at a concat, `pairs_swap` at a reshape)."""
    if node.op == Prim.CONCAT.value:
        return halves_swap(graph, producer, node)
    if node.op == Prim.RESHAPE.value:
        return pairs_swap(graph, producer, node)
    return None


def swap_nodes(producer: dict[str, Node], node: Node, sw: HalvesSwap) -> list[Node]:
    """The nodes between the swapped tensor and swap `node` of the pairs form (its slices, negations,
    added axes and stack), which the template never computes: it reads the swap from its registers. The
    halves form's slices and negation are element-wise or unit-step slices, admitted as any epilogue's."""
    if not sw.pairs:
        return []
    out: list[Node] = []
    todo = [node.inputs[0]]
    while todo:
        n = producer.get(todo.pop())
        if n is None or n.outputs[0] == sw.x or n in out:
            continue
        out.append(n)
        todo.extend(n.inputs)
    return out


_DEPTH = 12  # nodes between a product and the tensor rotated: Qwen2's is 4 (bias, reshape, transpose, slice)


def mapped_input(graph: Graph, producer: dict[str, Node], product: str, n: Node,
                 depth: int = _DEPTH, memo: dict | None = None) -> str | None:
    """The input of `n` through which n's output is the product at other positions: a layout node's only
    input, or an element-wise node's one input of its own shape that is (a bias added to q: Qwen2's,
    Phi's). None where there is no such input, or more than one, or the product is over `depth` nodes up."""
    if n.op in (Prim.RESHAPE.value, Prim.TRANSPOSE.value, Prim.SLICE.value):
        return n.inputs[0]
    if CATEGORY_OF[n.op] is not Category.ELEMENTWISE:
        return None
    out = graph.types[n.outputs[0]].shape
    mapped = [i for i in dict.fromkeys(n.inputs)
              if graph.types[i].shape == out and _index_map(graph, producer, product, i, depth - 1, memo) is not None]
    return mapped[0] if len(mapped) == 1 else None


def _index_map(graph: Graph, producer: dict[str, Node], product: str, t: str,
               depth: int = _DEPTH, memo: dict | None = None) -> np.ndarray | None:
    """For each element of t, the flat index of the product element it stands at, where t is the product
    through reshapes, transposes, unit-step slices and element-wise nodes (`mapped_input`), at most `depth`
    nodes down, else None."""
    memo = {} if memo is None else memo  # (tensor, depth) -> map: a residual stream's adds branch twice a node
    if (t, depth) in memo:
        return memo[(t, depth)]
    memo[(t, depth)] = got = _compute_map(graph, producer, product, t, depth, memo)
    return got


def _compute_map(graph: Graph, producer: dict[str, Node], product: str, t: str, depth: int,
                 memo: dict) -> np.ndarray | None:
    if t == product:
        shape = graph.types[product].shape
        return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    n = producer.get(t)
    if n is None or depth <= 0:
        return None
    src_name = mapped_input(graph, producer, product, n, depth, memo)
    src = _index_map(graph, producer, product, src_name, depth - 1, memo) if src_name is not None else None
    if src is None:
        return None
    if n.op == Prim.RESHAPE.value:
        return src.reshape(graph.types[t].shape)
    if n.op == Prim.TRANSPOSE.value:
        return src.transpose(n.attrs["perm"])
    if n.op != Prim.SLICE.value:  # element-wise
        return src
    if any(step != 1 for step in n.attrs["steps"]):
        return None
    out = graph.types[t].shape
    return src[tuple(slice(st, st + o) for st, o in zip(n.attrs["starts"], out))]


def path_from(graph: Graph, producer: dict[str, Node], product: str, t: str) -> list[Node] | None:
    """The nodes through which t is the product at other positions (`mapped_input`, from t back to the
    product), or None where t is not."""
    path: list[Node] = []
    while t != product:
        n = producer.get(t)
        up = mapped_input(graph, producer, product, n) if n is not None else None
        if up is None:
            return None
        path.append(n)
        t = up
    return path


def put_back(graph: Graph, producer: dict[str, Node], node: Node) -> str | None:
    """The tensor t that concat `node` puts back together as cat(f(t[..., :r]), t[..., r:]) over the last
    axis, at t's shape (partial rotary, GPT-NeoX's and Phi's: each head's rotated part beside the rest):
    element j is f's where j < r and t's own element j otherwise. None for any other node."""
    out = graph.types[node.outputs[0]].shape
    if node.op != Prim.CONCAT.value or len(node.inputs) != 2 or node.attrs["axis"] % len(out) != len(out) - 1:
        return None
    rest = producer.get(node.inputs[1])
    if rest is None or rest.op != Prim.SLICE.value:
        return None
    t, cut = rest.inputs[0], graph.types[node.inputs[0]].shape[-1]
    ok = graph.types[t].shape == out and list(rest.attrs["starts"]) == [0] * (len(out) - 1) + [cut] \
        and all(step == 1 for step in rest.attrs["steps"])
    return t if ok else None


def partner_columns(graph: Graph, producer: dict[str, Node], product: str, sw: HalvesSwap) -> bool:
    """Whether x's partner along the swap's axis (element d + s, or d - s in the second half) is, for every
    element, the product's element of the same row whose column is the partner within an aligned run of
    2s columns (n + s where n mod 2s < s, else n - s): the swap is then one of columns within any tile
    whose width is a multiple of 2s."""
    idx = _index_map(graph, producer, product, sw.x)
    if idx is None:
        return False
    s, width = sw.half, graph.types[product].shape[-1]
    d = np.arange(idx.shape[sw.axis])  # 2s long for halves; any even length for pairs
    partner = np.take(idx, np.where(d % (2 * s) < s, d + s, d - s), axis=sw.axis)
    col = idx % width
    swapped = np.where(col % (2 * s) < s, col + s, col - s)
    return bool(np.array_equal(partner, idx - col + swapped))


def swap_halves(emit: Callable[[str, frozenset[str]], str], v: Val, half: int) -> Val:
    """v, a [BLOCK_M, BLOCK_N] tile, with each run of 2 * half columns' halves exchanged: column j holds
    v's column j XOR half (j ± half: 2 * half divides BLOCK_N, a power of two). Triton splits and joins a trailing axis of 2, so the halves go there first."""
    deps = v.deps
    runs = f"[BLOCK_M, BLOCK_N // {2 * half}, 2, {half}]"
    pairs = emit(f"tl.split(tl.permute(tl.reshape({v.expr}, {runs}), (0, 1, 3, 2)))", deps)
    joined = emit(f"tl.join({pairs}[1], {pairs}[0])", deps)
    return Val(emit(f"tl.reshape(tl.permute({joined}, (0, 1, 3, 2)), [BLOCK_M, BLOCK_N])", deps), v.dtype, deps)


def swap_width(graph: Graph, nodes: Sequence[Node], root: Node) -> int:
    """The widest run of columns (2s) whose halves a template holding `nodes` swaps in its epilogue: its
    tile must be a multiple of it wide (1 where it swaps none). The path from the product to each swapped
    tensor lies in `nodes`, as the template's emitter sees them."""
    width = 1
    if not any(n.op == Prim.CONCAT.value for n in nodes):  # (ranked for every template candidate)
        return width
    producer = {o: n for n in nodes for o in n.outputs}
    for n in nodes:
        sw = swap_of(graph, producer, n)
        if sw is not None and partner_columns(graph, producer, root.outputs[0], sw):
            width = max(width, 2 * sw.half)
    return width
