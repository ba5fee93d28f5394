"""`OGraph`: the primitive graph as orchestration sees it.

Orchestration chooses kernels over *orchestrated nodes*: every primitive except
the free ones. A primitive is free when it reads only constants or other free
primitives (a FILL, the reshape and broadcast of a bias, a cast of a weight):
every kernel that needs it recomputes it from index arithmetic, so it is never
a kernel of its own and never written to memory. Each orchestrated node knows
its free prologue and the constant or graph-input tensors it reads.

Sets of nodes are Python ints used as bitsets (bit i = node i), which keeps
the convexity checks and state enumeration fast.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Sequence

from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Category, Prim


def bits(mask: int) -> tuple[int, ...]:
    """The indices of the set bits of `mask`, ascending. A candidate-sized set is cached:
    enumeration and costing ask for the members of the same candidates again and again (2.3 million
    calls while planning GPT-2, each walking a 1500-bit int); a tuple cannot be changed by a caller.
    Large sets (a subgraph's members) are not kept, so the cache stays small."""
    return _few_bits(mask) if mask.bit_count() <= 64 else _bits(mask)


def _bits(mask: int) -> tuple[int, ...]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


_few_bits = lru_cache(maxsize=1 << 16)(_bits)


@dataclass
class OGraph:
    """Orchestrated nodes of a primitive graph, in topological order, with bitset relations."""

    graph: Graph
    nodes: list[Node] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)  # node name -> position
    preds: list[int] = field(default_factory=list)  # direct producers among orchestrated nodes
    succs: list[int] = field(default_factory=list)
    anc: list[int] = field(default_factory=list)  # transitive producers
    desc: list[int] = field(default_factory=list)
    siblings: list[int] = field(default_factory=list)  # nodes sharing a non-constant input tensor
    free: dict[str, list[Node]] = field(default_factory=dict)  # node name -> free prologue, in order
    position: dict[str, int] = field(default_factory=dict)  # any node's name -> its place in graph.nodes
    external: list[frozenset[str]] = field(default_factory=list)  # graph inputs and constants read
    out_bytes: list[int] = field(default_factory=list)
    graph_outputs: int = 0  # nodes whose output is a graph output
    memo: dict = field(default_factory=dict)  # facts about the graph computed once (`orchestrate/rotary.py`)

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def all(self) -> int:
        return (1 << self.n) - 1

    def is_convex(self, mask: int) -> bool:
        """No node outside `mask` lies on a path between two nodes inside it."""
        below = above = 0
        for i in bits(mask):
            below |= self.anc[i]
            above |= self.desc[i]
        return (below & above & ~mask) == 0

    def consumers_outside(self, mask: int) -> int:
        """Nodes inside `mask` whose value is needed outside it (or is a graph output)."""
        out = 0
        for i in bits(mask):
            if self.succs[i] & ~mask or (self.graph_outputs >> i) & 1:
                out |= 1 << i
        return out

    def readers_of(self, mask: int) -> int:
        """Nodes that read a value of `mask` (inside it too)."""
        out = 0
        for i in bits(mask):
            out |= self.succs[i]
        return out

    def inputs_of(self, mask: int) -> int:
        """Orchestrated nodes outside `mask` that nodes inside read."""
        inp = 0
        for i in bits(mask):
            inp |= self.preds[i]
        return inp & ~mask

    def sinks(self, mask: int) -> int:
        return sum(1 << i for i in bits(mask) if not self.succs[i] & mask)


def is_view(graph: Graph, node: Node) -> bool:
    """A row-major reshape of a row-major tensor: an alias of its input at run time (no kernel, no
    launch; `codegen/select.py` runs a kernel of these as a view)."""
    return node.op == Prim.RESHAPE.value and all(graph.types[t].plain for t in (*node.inputs, *node.outputs))


def concat_aliasable(graph: Graph, node: Node) -> bool:
    """A concatenation whose inputs can be written straight into its output's buffer, so that it
    copies nothing (`runtime.concat_alias.concat_aliases`): row-major tensors, each input a
    contiguous piece of the output (the dims before the axis all 1), computed by the plan (not a
    graph input, constant or output) and named once, all stored tf32-rounded or none."""
    if node.op != Prim.CONCAT.value:
        return False
    ins = [t for t in node.inputs if t]
    tensors = [*ins, node.outputs[0]]
    out = graph.types[node.outputs[0]]
    axis = node.attrs["axis"] % max(1, len(out.shape))
    if len(set(ins)) != len(ins) or not all(graph.types[t].plain for t in tensors):
        return False
    if any(t in graph.constants or t in graph.inputs or t in graph.outputs for t in ins):
        return False
    return prod(out.shape[:axis]) == 1 and len({t in graph.tf32_rounded for t in tensors}) == 1


def free_concat(og: "OGraph", i: int) -> bool:
    """Node i is a concatenation the runtime skips, whatever the plan around it, as far as the graph
    tells: `concat_aliasable`, and its inputs come from kernels that write into the plan's buffers,
    directly or through reshapes that are views (no free prologue computes one; no library call or
    opaque operator writes one, and no concatenation that is free itself: nested, the runtime skips
    only the inner one)."""
    n = og.nodes[i]
    if not concat_aliasable(og.graph, n) or og.free.get(n.name) or og.external[i]:
        return False
    writers = list(bits(og.preds[i]))
    while writers:
        p = writers.pop()
        if is_view(og.graph, og.nodes[p]):  # a reshape runs as a view: what writes the tensor beneath
            if og.free.get(og.nodes[p].name) or og.external[p]:
                return False
            writers.extend(bits(og.preds[p]))
        elif Prim(og.nodes[p].op).category in (Category.LINEAR, Category.OPAQUE):
            return False
        elif og.nodes[p].op == Prim.CONCAT.value and free_concat(og, p):
            return False
    return True


def view_cost(og: "OGraph", nodes: int) -> float | None:
    """A candidate's cost if it only reshapes or is a concatenation written in place by its
    producers (a nanosecond per primitive breaks ties), else None."""
    members = bits(nodes)
    if all(is_view(og.graph, og.nodes[i]) for i in members) or (len(members) == 1 and free_concat(og, members[0])):
        return 1e-9 * len(members)
    return None


def _is_free(node: Node, free_or_const: set[str], outputs: set[str]) -> bool:
    if Prim(node.op).category in (Category.LINEAR, Category.OPAQUE) or any(o in outputs for o in node.outputs):
        return False
    return all(i in free_or_const for i in node.inputs if i)


def build_ograph(g: Graph) -> OGraph:
    """The orchestration view of primitive graph `g` (which must be topologically sorted)."""
    outputs = set(g.outputs)
    free_or_const: set[str] = set(g.constants)
    free_nodes: dict[str, Node] = {}
    og = OGraph(graph=g)
    for node in g.topological_order():
        if _is_free(node, free_or_const, outputs):
            free_or_const.update(node.outputs)
            free_nodes[node.outputs[0]] = node
        else:
            og.index[node.name] = len(og.nodes)
            og.nodes.append(node)
    producer = {o: og.index[n.name] for n in og.nodes for o in n.outputs}
    order = og.position = {n.name: k for k, n in enumerate(g.nodes)}
    readers: dict[str, int] = {}
    for i, node in enumerate(og.nodes):
        pred, ext, prologue = 0, set(), []
        todo = [t for t in node.inputs if t]
        seen: set[str] = set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in producer:
                pred |= 1 << producer[t]
                readers[t] = readers.get(t, 0) | (1 << i)
            elif t in free_nodes:
                prologue.append(free_nodes[t])
                todo.extend(x for x in free_nodes[t].inputs if x)
            else:  # a constant or a graph input
                ext.add(t)
                if t in g.inputs:
                    readers[t] = readers.get(t, 0) | (1 << i)
        og.preds.append(pred)
        og.external.append(frozenset(ext))
        og.free[node.name] = sorted(prologue, key=lambda n: order[n.name])
        og.out_bytes.append(sum(g.types[o].nbytes for o in node.outputs if o))
        if any(o in outputs for o in node.outputs):
            og.graph_outputs |= 1 << i
    og.succs = [0] * og.n
    for i, p in enumerate(og.preds):
        for j in bits(p):
            og.succs[j] |= 1 << i
    og.siblings = [0] * og.n
    for mask in readers.values():
        for i in bits(mask):
            og.siblings[i] |= mask & ~(1 << i)
    og.anc = [0] * og.n
    for i in range(og.n):  # topological order: producers come first
        a = og.preds[i]
        for j in bits(og.preds[i]):
            a |= og.anc[j]
        og.anc[i] = a
    og.desc = [0] * og.n
    for i in reversed(range(og.n)):
        d = og.succs[i]
        for j in bits(og.succs[i]):
            d |= og.desc[j]
        og.desc[i] = d
    return og


def prologue_of(og: OGraph, prims: Sequence[Node]) -> list[Node]:
    """The free nodes `prims` recompute, in topological order, each once (a kernel's prologue:
    the plan, signatures and code generation all list it this way)."""
    out: dict[str, Node] = {}
    for n in prims:
        out.update((f.name, f) for f in og.free[n.name])
    return sorted(out.values(), key=lambda n: og.position[n.name])
