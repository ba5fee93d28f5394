"""Merged projections: matmuls that read one left operand through constant weights become one.

    x @ w1, x @ w2  ->  slices of x @ concat(w1, w2)      (w1, w2 constants)

The `matmuls_sharing_left` rule (`rules/merge_matmul.py`), applied wherever both right operands
are constants, until nothing matches: the QKV projections of BERT's attention, three 768 x 768
GEMMs, become one 768 x 2304 GEMM. Not left to the search (`search.py`): the merged product has
the same work and bytes, the weights are joined once at compile time, and a small-M GEMM fills
the GPU better as one launch than as several (bert_base tf32 on the H200: one 9.5 µs kernel per
layer where three took 6.8 µs each; session 28). The search's budget reached only BERT's first
layer (session 23).
"""
from __future__ import annotations

from tessera.ir.graph import Graph
from tessera.rewrite.rules import View, apply
from tessera.rewrite.rules.merge_matmul import MATMULS_SHARING_LEFT
from tessera.rewrite.search import Applied


def merge_weight_matmuls(graph: Graph) -> tuple[Graph, list[dict]]:
    """`graph` with every group of matmuls that read one left operand through constant right
    operands merged into one, and the steps applied as the search records them
    (`Applied.to_json`), so an artifact replays them (`search.replay`)."""
    steps: list[dict] = []
    while True:
        view = View(graph)
        found = next((m for n in graph.nodes if (m := MATMULS_SHARING_LEFT.match(view, n)) is not None
                      and all(w in graph.constants for w in m.data["w"])), None)
        if found is None:
            return graph, steps
        graph = apply(graph, MATMULS_SHARING_LEFT, found)
        steps.append(Applied(MATMULS_SHARING_LEFT.name, list(found.roots), 0.0, 0).to_json())
