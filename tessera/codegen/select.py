"""Which backend runs each kernel, and the code generator's say in legality.

The fallback chain is explicit:

1. a memory-intensive kernel is one generated Triton kernel;
2. a kernel with a linear primitive runs it through torch (cuBLAS/cuDNN on
   the GPU) and its epilogue as one generated Triton kernel reading the result;
3. an opaque primitive, or a single primitive the generator cannot handle,
   runs through torch (`runtime/torch_prims.py`).

So every single primitive is a legal kernel, and a group of several is legal
only when the generator can produce it (`TritonLegality`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tessera.codegen.kernels import KernelSource, Schedule, generate
from tessera.codegen.triton_ops import Unsupported
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Category, Prim
from tessera.orchestrate.candidates import StructuralLegality
from tessera.orchestrate.graphview import OGraph, bits


@dataclass
class KernelImpl:
    """How one plan kernel runs.

    backend: "triton" (`triton` computes everything), "linear" (`linear`
    through torch, then `triton` for the epilogue if any), or "torch" (`prims`
    through torch; `reason` says why not Triton). `folded` are free prologue
    nodes only torch reads: they depend on constants alone, so the runtime
    computes them once.
    """

    name: str
    backend: str
    prims: list[Node]
    prologue: list[Node]
    outputs: list[str]
    triton: KernelSource | None = None
    linear: Node | None = None
    reason: str = ""
    folded: list[Node] = field(default_factory=list)

    @property
    def nodes(self) -> list[Node]:
        return self.prologue + self.prims


def _linear_root(nodes: Sequence[Node]) -> Node | None:
    lin = [n for n in nodes if Prim(n.op).category is Category.LINEAR]
    return lin[0] if lin else None


def _epilogue(graph: Graph, nodes: Sequence[Node], root: Node) -> list[Node]:
    """The nodes computed from the linear result; the rest (free prologue of the root) stays with torch."""
    reach = set(root.outputs)
    epi = []
    for n in nodes:
        if n is not root and any(t in reach for t in n.inputs):
            reach.update(n.outputs)
            epi.append(n)
    needed: dict[str, Node] = {o: n for n in nodes for o in n.outputs}
    # Free prologue nodes the epilogue reads (bias reshapes/broadcasts) come along.
    todo = [t for n in epi for t in n.inputs]
    extra: dict[str, Node] = {}
    while todo:
        t = todo.pop()
        p = needed.get(t)
        if p is None or p is root or p in epi or p.name in extra:
            continue
        extra[p.name] = p
        todo.extend(p.inputs)
    return list(extra.values()) + epi


def implement(graph: Graph, prims: Sequence[Node], prologue: Sequence[Node], outputs: Sequence[str], name: str,
              sources: Sequence[str] = (), schedule: Schedule | None = None) -> KernelImpl:
    """Choose the backend of one kernel (its orchestrated `prims` and free `prologue`) and generate its code.

    Raises `Unsupported` for a group of several primitives that has no Triton form.
    """
    prims, prologue = list(prims), list(prologue)
    nodes = prologue + prims
    if any(n.op == Prim.OPAQUE.value for n in prims):
        return KernelImpl(name, "torch", prims, prologue, list(outputs), reason="opaque operator", folded=prologue)
    root = _linear_root(prims)
    if root is not None:
        epi = _epilogue(graph, nodes, root)
        impl = KernelImpl(name, "linear", prims, prologue, list(outputs), linear=root,
                          folded=[n for n in prologue if n not in epi])
        epi_out = [o for o in outputs if o not in root.outputs]
        if epi_out:
            impl.triton = generate(graph, epi, epi_out, name, schedule, sources)
        return impl
    try:
        return KernelImpl(name, "triton", prims, prologue, list(outputs),
                          triton=generate(graph, nodes, outputs, name, schedule, sources))
    except Unsupported as e:
        if len(prims) > 1:
            raise
        return KernelImpl(name, "torch", prims, prologue, list(outputs), reason=str(e), folded=prologue)


def prologue_of(og: OGraph, prims: Sequence[Node]) -> list[Node]:
    """The free nodes `prims` recompute, in topological order, each once."""
    out: dict[str, Node] = {}
    for n in prims:
        out.update((f.name, f) for f in og.free[n.name])
    order = {n.name: i for i, n in enumerate(og.graph.nodes)}
    return sorted(out.values(), key=lambda n: order[n.name])


class TritonLegality:
    """StructuralLegality, then: a kernel of several primitives must have a Triton form."""

    def __init__(self) -> None:
        self.structural = StructuralLegality()
        self.cache: dict[int, str | None] = {}

    def check(self, og: OGraph, mask: int) -> str | None:
        if mask in self.cache:
            return self.cache[mask]
        why = self.structural.check(og, mask)
        if why is None and mask.bit_count() > 1:
            why = self._generate(og, mask)
        self.cache[mask] = why
        return why

    def _generate(self, og: OGraph, mask: int) -> str | None:
        prims = [og.nodes[i] for i in bits(mask)]
        outputs = [o for i in bits(og.consumers_outside(mask) | og.sinks(mask)) for o in og.nodes[i].outputs if o]
        try:
            implement(og.graph, prims, prologue_of(og, prims), outputs, "legality")
        except Unsupported as e:
            return str(e)
        return None
