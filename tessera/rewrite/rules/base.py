"""What a rewrite rule is, and how one is applied to a primitive graph.

A `Rule` is an equation between two primitive subgraphs, read left to right:
- `match(view, node)`: the pattern and its precondition, anchored at one node; a `Match` or None.
- `build(view, match, builder)`: the right-hand side, emitted with `PrimBuilder`; it returns, for
  each tensor the left-hand side's roots wrote, the tensor that now holds its value.
- `instance(rng)`: a random graph holding the left-hand side (random shapes inside the
  precondition, odd sizes), which `tests/test_rewrite_rules.py` uses to prove the equation in the
  float64 interpreter. `register` refuses a rule without one.

`apply` keeps every name outside the match: a root's output tensor is written by the new node
that computes it, so consumers and graph outputs read the same names. Nodes of the left-hand
side that nothing reads any more are dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, GraphKind, Node
from tessera.ir.prims import Prim


class View:
    """A graph with its producer and consumer maps (built once per graph version)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    @cached_property
    def producers(self) -> dict[str, Node]:
        return self.graph.producers()

    @cached_property
    def consumers(self) -> dict[str, list[Node]]:
        return self.graph.consumers()

    @cached_property
    def nodes(self) -> dict[str, Node]:
        return {n.name: n for n in self.graph.nodes}

    def made_by(self, t: str, op: Prim) -> Node | None:
        """The node that writes tensor `t`, if it is an `op`."""
        p = self.producers.get(t)
        return p if p is not None and p.op == op.value else None

    def shape(self, t: str) -> tuple[int, ...]:
        return self.graph.types[t].shape

    def private(self, t: str) -> bool:
        """Read by one node alone and no graph output: a rewrite may take it away."""
        return t not in self.graph.outputs and len(self.consumers.get(t, [])) == 1


@dataclass(frozen=True)
class Match:
    """Where a rule applies: the nodes whose outputs it replaces (`roots`, the anchor first),
    every node of the left-hand side, and what `build` needs."""

    rule: str
    roots: tuple[str, ...]
    nodes: tuple[str, ...]
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    name: str  # snake case, recorded in plan.json and artifacts
    equation: str  # the equation the rule applies, as a reader would write it
    match: Callable[[View, Node], Match | None]
    build: Callable[[View, Match, PrimBuilder], list[str]]
    instance: Callable[[np.random.Generator], Graph]
    # The relative rounding the right-hand side may add: 0 for an exact equation; a constant computed
    # at compile time is rounded once to its tensor's dtype (float32: 2^-24), and proven to that.
    rounding: float = 0.0


class NotApplicable(Exception):
    """`build` found the match cannot be rewritten after all (the graph changed)."""


def apply(graph: Graph, rule: Rule, m: Match, reserved: set[str] | None = None) -> Graph:
    """`graph` with `m` rewritten by `rule`: a new graph sharing the constant arrays (rules never
    change an array in place). Raises NotApplicable where the result would lose a name.

    `reserved`: names the new nodes and tensors must avoid besides the graph's own (a window of a
    larger graph names what it creates as the whole graph would)."""
    g = graph.clone(copy_constants=False)
    view = View(g)
    roots = [view.nodes[r] for r in m.roots]
    b = PrimBuilder(g, reserved)
    b.source = tuple(dict.fromkeys(s for n in m.nodes for s in view.nodes[n].source))
    b.context = f"rewrite {rule.name} at node '{m.roots[0]}'"
    start = len(g.nodes)
    results = rule.build(view, m, b)
    olds = [o for r in roots for o in r.outputs]
    if len(results) != len(olds):
        raise AssertionError(f"rule {rule.name} returned {len(results)} tensors for {len(olds)}")
    created = {o: i for i, n in enumerate(g.nodes[start:], start) for o in n.outputs}
    rename: dict[str, str] = {}  # a new node's output -> the old name it takes over
    redirect: dict[str, str] = {}  # an old name -> an existing tensor now holding its value
    for old, new in zip(olds, results):
        if g.types[new].shape != g.types[old].shape or g.types[new].dtype != g.types[old].dtype:
            raise AssertionError(f"rule {rule.name} changed {old}'s type: {g.types[old]} -> {g.types[new]}")
        if new in created and new not in rename:
            rename[new] = old
        elif old in g.outputs:
            raise NotApplicable(f"{old} is a graph output and would become another tensor")
        else:
            redirect[old] = new
    gone = set(m.roots)
    nodes = [n for n in g.nodes if n.name not in gone]
    for old, new in redirect.items():
        del g.types[old]
    for new, old in rename.items():
        g.types[old] = g.types.pop(new)

    def name(t: str) -> str:
        return rename.get(t) or redirect.get(t) or t

    g.nodes = [Node(n.name, n.op, tuple(name(t) for t in n.inputs), tuple(rename.get(t, t) for t in n.outputs),
                    dict(n.attrs), n.domain, n.source) if any(t in rename or t in redirect for t in n.inputs)
               or any(t in rename for t in n.outputs) else n for n in nodes]
    g.sort()
    g.remove_dead()
    return g


def find(graph: Graph, rules: Mapping[str, Rule], view: View | None = None) -> list[Match]:
    """Every match of every rule in `graph`, in node order."""
    view = view or View(graph)
    out = []
    for n in graph.nodes:
        for rule in rules.values():
            m = rule.match(view, n)
            if m is not None:
                out.append(m)
    return out


# ---- helpers for rules ---------------------------------------------------------------------------

def new_graph(inputs: Mapping[str, tuple[int, ...]]) -> tuple[Graph, PrimBuilder]:
    """A primitive graph with float32 `inputs` (name -> shape) and a builder over it, for
    `Rule.instance`; the caller sets `graph.outputs`."""
    from tessera.ir.dtype import DType
    from tessera.ir.graph import TensorType

    g = Graph("instance", GraphKind.PRIMITIVE, inputs=list(inputs))
    g.types.update({k: TensorType(tuple(v), DType.FLOAT32) for k, v in inputs.items()})
    return g, PrimBuilder(g)


def odd_shape(rng: np.random.Generator, rank: int, low: int = 1, high: int = 7) -> tuple[int, ...]:
    """Small random sizes, mostly odd or prime."""
    sizes = [1, 2, 3, 5, 7, 11]
    return tuple(int(rng.choice([s for s in sizes if low <= s <= max(high, low)])) for _ in range(rank))


def is_float(view: View, t: str) -> bool:
    return view.graph.types[t].dtype.is_float
