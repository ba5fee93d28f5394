"""Stage `frontend`: an ONNX model -> a folded, statically typed operator graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import onnx

from tessera.frontend.infer import FoldSummary, fold_and_infer
from tessera.frontend.reader import check_model, read_model, to_operator_graph
from tessera.errors import ShapeError
from tessera.ir.graph import Graph


@dataclass
class LoadedModel:
    """The operator graph, the checked ONNX model it came from, and what folding did."""

    graph: Graph
    model: onnx.ModelProto
    label: str
    folding: FoldSummary
    input_shapes: dict[str, tuple[int, ...]]


def load(source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None, checker: bool = True) -> LoadedModel:
    """Load an ONNX file, bytes or ModelProto into a folded operator graph.

    `input_shapes` fixes symbolic input dims (name -> full shape). Raises a
    `TesseraError` subclass naming the problem for any bad input. `checker=False` skips onnx's
    checker, for a model tessera built itself (`reader.check_model`).
    """
    model, label = read_model(source)
    model = check_model(model, label, checker, source)
    graph, declared = to_operator_graph(model, label, input_shapes)
    summary = fold_and_infer(graph, declared, label, check_declared=not input_shapes)
    graph.validate()
    # An empty input makes every kernel empty (grids of zero programs, divisions by a zero
    # extent). Empty constants (Resize's unused roi, ReduceSum's empty axes) and an empty slice
    # in the middle of a graph (it runs as opaque) are fine.
    empty = next((t for t in graph.inputs if graph.types[t].numel == 0), None)
    if empty is not None:
        raise ShapeError(f"{label}: input '{empty}' has shape {list(graph.types[empty].shape)}, with no elements; "
                         "tessera compiles no zero-sized inputs")
    shapes = {i: graph.types[i].shape for i in graph.inputs}
    return LoadedModel(graph, model, label, summary, shapes)


__all__ = ["FoldSummary", "LoadedModel", "load"]
