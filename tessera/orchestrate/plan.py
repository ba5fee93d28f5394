"""The plan: which kernels run, in which order, and where values live."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Kernel:
    """One kernel of the plan."""

    id: int
    name: str
    subgraph: int
    prims: list[str]  # orchestrated primitives, in topological order
    prologue: list[str]  # free primitives it recomputes (fills, bias broadcasts)
    outputs: list[str]  # tensors it writes
    inputs: list[str]  # tensors it reads: other kernels' outputs, graph inputs, constants
    cost_s: float
    source_nodes: list[str]  # ONNX nodes its primitives came from
    categories: dict[str, int]
    recomputed: list[str] = field(default_factory=list)  # prims another kernel also computes
    conversion: bool = False  # it only changes storage order (identity transposes: `layout.is_conversion`)


@dataclass
class Buffer:
    """A tensor in memory: written by kernel `first` (-1: a graph input), last read by `last`."""

    tensor: str
    bytes: int
    first: int
    last: int
    graph_output: bool = False
    layout: list[int] = field(default_factory=list)  # storage order, a permutation of the logical dims


@dataclass
class SubgraphReport:
    index: int
    nodes: int
    states: int
    candidates: int
    kernels: int
    optimal_s: float
    greedy_s: float
    solver: dict[str, Any]


@dataclass
class Plan:
    model: str
    strategy: str
    device: str
    precision: str
    cost_model: str
    kernels: list[Kernel]  # in execution order
    buffers: list[Buffer]
    subgraphs: list[SubgraphReport]
    cuts: list[dict[str, Any]]
    estimated_total_s: float
    greedy_total_s: float
    orchestrate_s: float
    primitives: int
    orchestrated_nodes: int
    # The rewrite search before orchestration (`rewrite/search.py`, `SearchResult.summary`): each
    # rewrite applied with its window's estimated saving, and what was tried; empty when off
    rewrites: dict[str, Any] = field(default_factory=dict)
    # Kernels taken into the GEMM chain they alone fed, after the solve (`post_fusion.py`)
    absorbed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def greedy_in_subgraphs_s(self) -> float:
        """The greedy plan within the same subgraphs: what the binary program improved on. The
        whole-graph greedy (`greedy_total_s`) also fuses across the partition's cuts."""
        return sum(s.greedy_s for s in self.subgraphs)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
