"""One primitive for each distinct computation (common-subexpression elimination).

Operator lowering works one ONNX node at a time, so identical primitives repeat: every MatMul on a
3-D activation flattens it with its own reshape, so an attention layer's Q, K and V projections
read three copies of one view instead of one tensor. Rules that need a shared operand (the merge
of matmuls that share their left operand, `rewrite/rules/merge_matmul.py`) then never match.

Merging duplicates loses no freedom: the orchestrator may still compute a primitive in several
kernels where that saves memory traffic. Opaque operators are left alone (a fallback op may not be
a pure function of its inputs), and so is a node that writes a graph output (the output keeps its
name).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return tuple(sorted((k, _attr_key(v)) for k, v in value.items()))
    return value


def _key(node: Node, graph: Graph) -> tuple | None:
    """What makes two nodes compute the same values; None for a node that must stay itself."""
    if node.op == Prim.OPAQUE.value or not node.is_prim or len(node.outputs) != 1:
        return None
    try:
        attrs = _attr_key(dict(node.attrs))
        hash(attrs)
    except TypeError:  # an attribute with no stable value (left as it is)
        return None
    return (node.op, node.domain, node.inputs, attrs, graph.types[node.outputs[0]])


def eliminate_common(graph: Graph) -> int:
    """Replace, in place, every primitive that repeats an earlier one (same op, inputs, attributes
    and output type) by that one; return how many were removed. Chains of repeats collapse in one
    pass: nodes are visited in topological order and inputs renamed before they are keyed."""
    outputs = set(graph.outputs)
    seen: dict[tuple, Node] = {}
    alias: dict[str, str] = {}
    kept: list[Node] = []
    at: dict[str, int] = {}  # node name -> its place in `kept`
    for node in graph.topological_order():
        if any(alias.get(i, i) != i for i in node.inputs):
            node = replace(node, inputs=tuple(alias.get(i, i) for i in node.inputs))
        key = _key(node, graph) if node.outputs[0] not in outputs else None
        first = seen.get(key) if key is not None else None
        if first is None:
            if key is not None:
                seen[key] = node
            at[node.name] = len(kept)
            kept.append(node)
            continue
        alias[node.outputs[0]] = first.outputs[0]
        # The kept node now stands for both: name the sources of both in its kernels.
        merged = tuple(dict.fromkeys(first.source + node.source))
        if merged != first.source:
            kept[at[first.name]] = seen[key] = replace(first, source=merged)
    removed = len(graph.nodes) - len(kept)
    if removed:
        graph.nodes = kept
        for t in alias:
            graph.types.pop(t, None)
    return removed
