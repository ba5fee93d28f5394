"""Concatenations that copy nothing: their producers write straight into the output's buffer.

A concatenation of row-major tensors along an axis with only size-1 dims before it lays each input
out as one contiguous piece of the output. Where a generated kernel (a step that writes into the
plan's buffers) computes every input, each input's buffer is that piece of the output's buffer, and
the concatenation's own step has nothing left to do. segformer_b0's decoder concatenates four
[1, 256, 128, 128] maps: a 33 MB copy, 15.6 µs of 427 on the H200 in fp16 (session 43).

The orchestrator prices such a concatenation as free where the graph allows it
(`orchestrate.graphview.free_concat`); this module decides from the plan itself, so a plan whose
producers turn out to be library calls or opaque operators still runs the copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence, Set

from tessera.ir.graph import Graph
from tessera.orchestrate.graphview import concat_aliasable

if TYPE_CHECKING:  # the executable imports this module
    from tessera.runtime.executable import Step


@dataclass(frozen=True)
class Piece:
    """An input of a skipped concatenation: its output, where in it the input starts (elements),
    the step of the concatenation and the step that writes the input."""

    concat: str
    offset: int
    step: int
    writer: int


def concat_aliases(graph: Graph, steps: Sequence[Step], views: Mapping[str, str],
                   kept: Set[str]) -> dict[str, Piece]:
    """The tensors that are pieces of a concatenation step's output, which then need not run. An
    input that a view step reshapes from another tensor (`views`: view -> the tensor beneath) is
    that tensor's piece; a tensor in `kept` (a graph output, or beneath one) never is one. A
    concatenation that reads another one's skipped output keeps its copy: nested, the inner one's
    pieces would live in the outer one's buffer from before the outer one's first write."""
    writer: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.kernel is not None:
            writer.update((t, i) for t in s.kernel.ks.outputs)
    pieces: dict[str, Piece] = {}
    skipped: set[str] = set()  # the outputs of the concatenations that copy nothing
    for i, s in enumerate(steps):
        prims = s.impl.prims
        if s.kernel is None or s.impl.prologue or len(prims) != 1 or not concat_aliasable(graph, prims[0]):
            continue
        node = prims[0]
        bases = [views.get(t, t) for t in node.inputs if t]
        rounded = node.outputs[0] in graph.tf32_rounded
        if any(b not in writer or writer[b] >= i or b in pieces or b in kept or b in skipped
               or (b in graph.tf32_rounded) != rounded for b in bases) or len(set(bases)) != len(bases):
            continue  # a library call, an opaque step or another concatenation writes one
        offset = 0
        for b in bases:
            pieces[b] = Piece(node.outputs[0], offset, i, writer[b])
            offset += graph.types[b].numel
        skipped.add(node.outputs[0])
    return pieces
