"""What a rewrite that replaces nodes one by one needs: a copy of the graph, its producers and
readers, fresh node and tensor names, and the replacement applied in order at the end. The rules
that move work across a matmul (`deferred.py`, `bias_after.py`) build on it."""
from __future__ import annotations

from typing import Any

from tessera.ir.graph import Graph, Node, TensorType, unique_name


class NodeEdit:
    """A graph being rewritten: `replaced[name] = nodes` puts `nodes` where node `name` was."""

    def __init__(self, graph: Graph) -> None:
        self.source = graph
        self.g = graph.clone(copy_constants=False)  # constants are replaced or added, never written
        self.producers = self.g.producers()
        self.consumers = self.g.consumers()
        self._names = {n.name for n in self.g.nodes}
        self.replaced: dict[str, list[Node]] = {}

    def private(self, t: str) -> bool:
        """Read by one node alone, and no graph output: a value a rewrite may make disappear."""
        return t not in self.g.outputs and len(self.consumers.get(t, [])) == 1

    def node(self, base: str, op: str, inputs: tuple[str, ...], out: str, attrs: dict[str, Any],
             source: tuple[str, ...]) -> Node:
        """A new node of one output, named after `base` (made unique)."""
        name = unique_name(base, self._names)
        self._names.add(name)
        return Node(name, op, inputs, (out,), attrs, "", source)

    def tensor(self, base: str, ty: TensorType) -> str:
        """A new tensor of type `ty`, named after `base` (made unique)."""
        name = unique_name(base, self.g.types)
        self.g.types[name] = ty
        return name

    def finish(self) -> tuple[Graph, int]:
        """The rewritten graph (the original where nothing was replaced), sorted and without dead
        nodes, and how many nodes were replaced."""
        if not self.replaced:
            return self.source, 0
        nodes: list[Node] = []
        for n in self.g.nodes:
            nodes.extend(self.replaced.get(n.name, [n]))
        self.g.nodes = nodes
        self.g.sort()
        self.g.remove_dead()
        return self.g, len(self.replaced)
