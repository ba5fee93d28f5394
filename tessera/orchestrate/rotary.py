"""Rotary positions as a projection's epilogue: which candidates may hold them, and the sets that do.

A Llama layer's q and k leave their projection, are cut into heads, transposed to [batch, heads, rows,
head] and rotated: `q * cos + rotate_half(q) * sin`. A GEMM template computes rotate_half from its
accumulator's registers (`codegen/rotary.py`), so the rotation, and the transposes on the way to it, may
join the projection's kernel. Epilogue transposes are otherwise kept out of single-matmul kernels (they
multiply the candidates, `candidates.moves_columns`); these are admitted only on the path to such a
rotation. A layer's projection with both rotations is about 24 primitives, past the size rule, so
`rotary_epilogues` grows each one-matmul candidate by the rotations after it. GPT-NeoX and Phi rotate
only each head's first r values and concatenate the rest back (`_selects`): the template computes that
concat as a select between two values it holds (`codegen/tile.partial_outputs`). GPT-J and CodeGen rotate
interleaved pairs (`codegen/rotary.pairs_swap`): the swap is the reshape ending the pattern, and its
step-2 slices and stack, which the template never computes, are admitted with it.
"""
from __future__ import annotations

from tessera.codegen.rotary import partner_columns, path_from, put_back, swap_nodes, swap_of
from tessera.ir.graph import Node
from tessera.ir.prims import CATEGORY_OF, Category, Prim
from tessera.orchestrate.graphview import OGraph, bits


def _producers(og: OGraph) -> dict[str, Node]:
    """The graph's tensor -> writer map, built once for the rotary helpers below."""
    if "producers" not in og.memo:
        og.memo["producers"] = og.graph.producers()
    return og.memo["producers"]


def _swaps(og: OGraph) -> dict[int, tuple[int, int]]:
    """Each node that a GEMM template can compute as a swap of its accumulator's columns (a rotate_half
    concat, or the reshape ending a rotate_every_two): node index -> (its matmul, the layout nodes between
    the matmul and the swapped tensor, and a pairs swap's own slices, negations and stack). Once per graph."""
    memo = og.memo.get("rotary")
    if memo is not None:
        return memo
    g = og.graph
    producer = _producers(og)
    out: dict[int, tuple[int, int]] = {}
    for c, node in enumerate(og.nodes):
        sw = swap_of(g, producer, node)
        if sw is None:
            continue
        inner = swap_nodes(producer, node, sw)
        own = sum(1 << og.index[n.name] for n in inner if n.name in og.index) | (1 << c)
        if any(og.succs[og.index[n.name]] & ~own or (og.graph_outputs >> og.index[n.name]) & 1
               for n in inner if n.name in og.index):
            continue  # a step-2 slice or the stack read elsewhere: the template would have to store it
        for r in bits(og.anc[c]):  # the matmul whose product the swapped tensor is, at other positions
            root = og.nodes[r]
            path = path_from(g, producer, root.outputs[0], sw.x) if root.op == Prim.MATMUL.value else None
            if path is not None and all(n.name in og.index for n in path + inner) \
                    and partner_columns(g, producer, root.outputs[0], sw):
                out[c] = (r, sum(1 << og.index[n.name] for n in path + inner))
                break
    og.memo["rotary"] = out
    return out


def _layouts(og: OGraph, root: int) -> int:
    """The transposes and reshapes through which a tensor is matmul `root`'s product at other positions
    (`codegen/rotary.path_from`): a head split of q, k or v ([rows, heads * d] to [heads, rows, d]),
    which the template stores at the permuted indices. Once per matmul."""
    memo = og.memo.setdefault("rotary_layouts", {})
    if root not in memo:
        g, producer = og.graph, _producers(og)
        product = og.nodes[root].outputs[0]
        memo[root] = sum(1 << t for t in bits(og.desc[root])
                         if og.nodes[t].op in (Prim.TRANSPOSE.value, Prim.RESHAPE.value)
                         and path_from(g, producer, product, og.nodes[t].outputs[0]) is not None)
    return memo[root]


def _selects(og: OGraph, root: int) -> int:
    """Concats that put a head's rotated part back beside the rest (`codegen/rotary.put_back`: partial
    rotary), of a tensor that is matmul `root`'s product at other positions: the template selects per
    column between two values it holds. Once per matmul."""
    memo = og.memo.setdefault("rotary_selects", {})
    if root not in memo:
        g, producer = og.graph, _producers(og)
        product = og.nodes[root].outputs[0]
        memo[root] = sum(1 << c for c in bits(og.desc[root])
                         if (t := put_back(g, producer, og.nodes[c])) is not None
                         and path_from(g, producer, product, t) is not None)
    return memo[root]


def rotary_nodes(og: OGraph, mask: int, root: int) -> int:
    """The nodes of candidate `mask` that its matmul `root`'s epilogue may hold as rotations only: each
    rotate_half concat whose swapped tensor the candidate computes from `root` through layout nodes, and
    those layout nodes (the transposes among them are admitted nowhere else). Beside a rotation, the
    kernel may also store other head splits of the product (v's, beside q's and k's rotations)."""
    allowed = 0
    for c, (r, chain) in _swaps(og).items():
        if r == root and (mask >> c) & 1 and chain & ~mask == 0:
            allowed |= (1 << c) | chain
    if allowed:
        allowed |= (_layouts(og, root) | _selects(og, root)) & mask
    return allowed


def rotary_epilogues(og: OGraph, sets: list[int], members: int, linear: int, limit: int) -> list[int]:
    """One-matmul sets of `sets` grown by the rotations after their matmul: the layout nodes down to each
    swapped tensor, the swap's slices, negations and concat, the other head splits of the product (v's),
    a partial rotation's concat putting the rest of the head back, and the element-wise nodes computed
    from the kernel's values alone (the products with cos and sin, their sum), `limit` nodes past the set
    at most. Nothing that grows a tensor (a broadcast of k to every query head) is taken. New sets only."""
    swaps = _swaps(og)
    if not swaps:
        return []
    seen, out = set(sets), []
    for mask in sets:
        roots = mask & linear
        if roots.bit_count() != 1:
            continue
        root = roots.bit_length() - 1
        mine = {c: chain for c, (r, chain) in swaps.items() if r == root and (members >> c) & 1}
        if not mine:
            continue
        grown, layouts = mask | (1 << root), _layouts(og, root) | _selects(og, root)
        for chain in mine.values():
            grown |= chain & members
        added = True
        while added and (grown & ~mask).bit_count() < limit:
            added = False
            for t in bits(og.readers_of(grown) & members & ~grown):
                node = og.nodes[t]
                swap = t in mine
                pointwise = CATEGORY_OF[node.op] is Category.ELEMENTWISE or node.op == Prim.RESHAPE.value \
                    or (node.op == Prim.SLICE.value and all(s == 1 for s in node.attrs["steps"])) \
                    or (layouts >> t) & 1
                if (swap or pointwise) and not og.preds[t] & ~grown and (og.anc[t] >> root) & 1:
                    grown |= 1 << t
                    added = True
        if any((grown >> c) & 1 for c in mine) and grown not in seen:
            seen.add(grown)
            out.append(grown)
    return out
