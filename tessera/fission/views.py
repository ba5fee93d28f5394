"""One reshape where two follow each other: reshape(reshape(x, a), b) is reshape(x, b).

Lowering works one operator at a time, so a view op's reshape and the next op's own reshape (a
MatMul flattening its 3-D operand, say) stack up: GPT-2 through the PyTorch frontend merges its
heads to [1, 128, 768] and its Conv1D then flattens that to [128, 768], where the ONNX export's
optimizer left one Reshape. Row-major reshapes compose, so the second reads x directly; one that
gives x's own shape back is x. The first stays only where something else reads it. This makes
the two frontends' primitives (and so their kernel signatures) agree, and spares the orchestrator
a view.
"""
from __future__ import annotations

from dataclasses import replace

from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim


def _is_reshape(node: Node | None) -> bool:
    return node is not None and node.op == Prim.RESHAPE.value and not node.domain


def collapse_reshapes(graph: Graph) -> int:
    """Rewrite, in place, each reshape of a reshape to read the first one's input (and drop one that
    restores that input's shape, unless it writes a graph output); return how many were rewritten.
    Visits in topological order, so a chain of any length collapses in one pass."""
    outputs = set(graph.outputs)
    producers: dict[str, Node] = {}
    alias: dict[str, str] = {}
    kept: list[Node] = []
    changed = 0
    for node in graph.topological_order():
        if any(i in alias for i in node.inputs):
            node = replace(node, inputs=tuple(alias.get(i, i) for i in node.inputs))
        src = producers.get(node.inputs[0]) if _is_reshape(node) else None
        if _is_reshape(src):
            x, y = src.inputs[0], node.outputs[0]
            changed += 1
            if graph.types[x] == graph.types[y] and y not in outputs:
                alias[y] = x
                graph.types.pop(y, None)
                continue
            node = replace(node, inputs=(x,))
        for o in node.outputs:
            producers[o] = node
        kept.append(node)
    if changed:
        graph.nodes = kept
        graph.remove_dead()
    return changed
