"""The graph IR shared by operator graphs and primitive graphs.

A `Graph` is a list of frozen `Node`s over named tensors. Every tensor has a
static `TensorType`; constants (initializers and folded values) are NumPy
arrays. In an operator graph `Node.op` is an ONNX op type with its raw ONNX
attributes; in a primitive graph it is a `Prim`.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from tessera.errors import MalformedModelError
from tessera.ir.dtype import DType
from tessera.ir.prims import Prim


@dataclass(frozen=True)
class TensorType:
    """A static shape, an element type and a memory layout.

    `layout` is the storage order as a permutation of the logical dims: memory holds the
    tensor transposed by it, row-major (NHWC storage of an NCHW tensor is (0, 2, 3, 1)).
    Empty means row-major in the logical order. Semantics never depend on it; kernels
    and the runtime read it to address memory (`orchestrate/layout.py` chooses it).
    """

    shape: tuple[int, ...]
    dtype: DType
    layout: tuple[int, ...] = ()

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape of the row-major array in memory: the logical shape permuted by the layout."""
        return tuple(self.shape[d] for d in self.layout) if self.layout else self.shape

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides of each logical dim."""
        return layout_strides(self.shape, self.layout)

    def rows_contiguous(self, axes: Iterable[int]) -> bool:
        """Are the reduced `axes` the innermost dims of the storage order (each row of a
        reduction over them one contiguous run)? Size-1 dims do not count."""
        order = [d for d in (self.layout or range(self.rank)) if self.shape[d] != 1]
        red = {d for d in axes if self.shape[d] != 1}
        return set(order[len(order) - len(red):]) == red

    @property
    def plain(self) -> bool:
        """Row-major in the logical order (or a layout that addresses memory the same way)."""
        return not self.layout or _same_memory_order(self.shape, self.layout)

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))  # np.prod took 2 s of GPT-2's orchestration

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        lay = "" if self.plain else "@" + "".join(map(str, self.layout))
        return f"{self.dtype.value}[{'x'.join(map(str, self.shape))}]{lay}"


def layout_strides(shape: Sequence[int], layout: Sequence[int] = ()) -> tuple[int, ...]:
    """Element strides of each logical dim of `shape` stored in the dim order `layout` (row-major when empty)."""
    out = [0] * len(shape)
    step = 1
    for d in reversed(tuple(layout) or range(len(shape))):
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _same_memory_order(shape: tuple[int, ...], layout: tuple[int, ...]) -> bool:
    """Size-1 dims move freely: (1, C, 1, 1) is stored the same in every order."""
    big = [d for d in layout if shape[d] != 1]
    return big == sorted(big)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True, eq=True)
class Node:
    """One operation. `inputs` may hold "" for an omitted optional ONNX input."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    domain: str = ""
    source: tuple[str, ...] = ()  # ONNX node names this node came from

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "source", tuple(self.source))
        frozen = {k: _freeze(v) for k, v in dict(self.attrs).items()}
        object.__setattr__(self, "attrs", MappingProxyType(frozen))

    @property
    def prim(self) -> Prim:
        return Prim(self.op)

    @property
    def is_prim(self) -> bool:
        return self.op in Prim._value2member_map_

    def same_source(self, other: "Node") -> bool:
        """Whether `other` came from this node's own ONNX node (a Gemm's C add or alpha scale beside its
        product): the rule by which the candidates keep a bias with its product and the runtime sums it
        before rounding (`orchestrate/candidates.bias_groups`, `runtime/executable.own_bias`)."""
        return bool(self.source) and other.source == self.source

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Node):
            return NotImplemented
        return (self.name, self.op, self.inputs, self.outputs, self.domain, self.source) == (
            other.name, other.op, other.inputs, other.outputs, other.domain, other.source
        ) and _attrs_equal(self.attrs, other.attrs)

    def __hash__(self) -> int:
        return hash((self.name, self.op, self.inputs, self.outputs))

    def __getstate__(self) -> dict:  # MappingProxyType does not pickle
        state = dict(self.__dict__)
        state["attrs"] = dict(self.attrs)
        return state

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "attrs", MappingProxyType(dict(state["attrs"])))


def _attrs_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
                    and x.dtype == y.dtype and np.array_equal(x, y)):
                return False
        elif x != y:
            return False
    return True


class GraphKind(enum.Enum):
    OPERATOR = "operator"
    PRIMITIVE = "primitive"


@dataclass
class Graph:
    """A dataflow graph with static types.

    `types` holds the type of every tensor: graph inputs, node outputs and
    constants. `constants` holds the value of every constant tensor.
    `opsets` maps ONNX domains to versions ("" is ai.onnx).
    """

    name: str
    kind: GraphKind
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=lambda: {"": 20})
    # tf32 plans: activations that only tf32 products read, which their writer stores rounded to
    # tf32 so the products' kernels need not round them (rewrite/precision.py `mark_tf32_operands`)
    tf32_rounded: frozenset[str] = frozenset()
    # Float constants that fission made as coefficients of an operator's own arithmetic (a Resize's
    # blend weights), which a float16/bfloat16 plan keeps in float32 as PyTorch and onnxruntime
    # compute them (rewrite/precision.py); a model's own weights are not among them
    wide_constants: frozenset[str] = frozenset()

    # ---- queries -----------------------------------------------------------
    @property
    def opset(self) -> int:
        return self.opsets.get("", 20)

    def scalar_constant(self, tensor: str) -> float | None:
        """The value of a one-element float constant, which generated kernels write into their
        source (no load, and `pow(x, 3.0)` as products), and kernel signatures therefore include."""
        c = self.constants.get(tensor)
        if c is None or c.size != 1 or not self.types[tensor].dtype.is_float:
            return None
        return float(c.reshape(-1)[0])

    def producers(self) -> dict[str, Node]:
        """Tensor name -> the node that writes it."""
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        """Tensor name -> the nodes that read it, in node order."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # ---- structure ---------------------------------------------------------
    def topological_order(self) -> list[Node]:
        """Nodes in an order where producers precede consumers (stable: keeps
        the stored order where it is already valid). Raises on a cycle."""
        prod = self.producers()
        state: dict[str, int] = {}  # node name -> 1 visiting, 2 done
        order: list[Node] = []
        by_name = {n.name: n for n in self.nodes}
        for root in self.nodes:
            if state.get(root.name) == 2:
                continue
            stack: list[tuple[Node, Iterator[str]]] = [(root, iter(root.inputs))]
            state[root.name] = 1
            while stack:
                node, it = stack[-1]
                advanced = False
                for t in it:
                    p = prod.get(t)
                    if p is None:
                        continue
                    s = state.get(p.name)
                    if s == 1:
                        raise MalformedModelError(
                            f"the graph has a cycle through node '{p.name}' ({p.op}) "
                            f"and node '{node.name}' ({node.op}) via tensor '{t}'")
                    if s is None:
                        state[p.name] = 1
                        stack.append((by_name[p.name], iter(p.inputs)))
                        advanced = True
                        break
                if not advanced:
                    state[node.name] = 2
                    order.append(node)
                    stack.pop()
        return order

    def sort(self) -> None:
        self.nodes = self.topological_order()

    def validate(self) -> None:
        """Check the invariants every stage relies on; raise MalformedModelError."""
        names = set()
        written: set[str] = set(self.inputs) | set(self.constants)
        for n in self.nodes:
            if n.name in names:
                raise MalformedModelError(f"two nodes are named '{n.name}'")
            names.add(n.name)
            for o in n.outputs:
                if not o:
                    continue
                if o in written:
                    raise MalformedModelError(f"tensor '{o}' is written twice (node '{n.name}')")
                written.add(o)
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in written:
                    raise MalformedModelError(
                        f"node '{n.name}' ({n.op}) reads tensor '{i}', which nothing produces")
        for o in self.outputs:
            if o not in written:
                raise MalformedModelError(f"graph output '{o}' is never produced")
        for t in written:
            if t not in self.types:
                raise MalformedModelError(f"tensor '{t}' has no type")
        self.topological_order()

    def clone(self, copy_constants: bool = True) -> "Graph":
        """A deep copy: nodes are immutable and shared, containers and constants copied.
        `copy_constants=False` shares the constants' arrays, for a pass that replaces constants
        but never writes into one (copying a transformer's weights takes a second)."""
        return Graph(
            name=self.name, kind=self.kind, inputs=list(self.inputs), outputs=list(self.outputs),
            nodes=list(self.nodes), types=dict(self.types),
            constants={k: v.copy() if copy_constants else v for k, v in self.constants.items()},
            opsets=dict(self.opsets), tf32_rounded=self.tf32_rounded, wide_constants=self.wide_constants,
        )

    def same_as(self, other: "Graph") -> bool:
        """Structural equality: same nodes in the same order, types and constant values."""
        if (self.kind, self.inputs, self.outputs, self.nodes, self.types, self.opsets, self.tf32_rounded,
                self.wide_constants) != (other.kind, other.inputs, other.outputs, other.nodes, other.types,
                                         other.opsets, other.tf32_rounded, other.wide_constants):
            return False
        if self.constants.keys() != other.constants.keys():
            return False
        return all(
            self.constants[k].dtype == other.constants[k].dtype
            and np.array_equal(self.constants[k], other.constants[k], equal_nan=self.constants[k].dtype.kind == "f")
            for k in self.constants)

    def remove_dead(self) -> int:
        """Drop nodes and constants that no graph output depends on; return nodes dropped."""
        prod = self.producers()
        live: set[str] = set()
        todo = list(self.outputs)
        while todo:
            t = todo.pop()
            if t in live:
                continue
            live.add(t)
            p = prod.get(t)
            if p is not None:
                todo.extend(i for i in p.inputs if i)
        keep = [n for n in self.nodes if any(o in live for o in n.outputs)]
        dropped = len(self.nodes) - len(keep)
        self.nodes = keep
        used = {i for n in keep for i in n.inputs} | set(self.outputs) | set(self.inputs)
        for c in [c for c in self.constants if c not in used]:
            del self.constants[c]
        for t in [t for t in self.types if t not in used and t not in {o for n in keep for o in n.outputs}]:
            del self.types[t]
        return dropped

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))


def unique_name(base: str, taken: Iterable[str] | set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... whichever is not in `taken`."""
    taken = taken if isinstance(taken, set) else set(taken)
    if base not in taken:
        return base
    i = 1
    while f"{base}_{i}" in taken:
        i += 1
    return f"{base}_{i}"


def scalar_constant(graph: Graph, producer: Mapping[str, Node], t: str) -> float | None:
    """The one value a constant tensor holds (through reshapes and broadcasts, or a fill), as its
    dtype stores it; None if it varies or comes from anything else."""
    while t not in graph.constants:
        n = producer.get(t)
        if n is None:
            return None
        if n.op == Prim.FILL.value:
            return float(np.asarray(n.attrs["value"]).astype(graph.types[t].dtype.to_numpy()))
        if n.op not in (Prim.RESHAPE.value, Prim.BROADCAST.value):
            return None
        t = n.inputs[0]
    v = np.asarray(graph.constants[t])
    if v.size == 0 or v.dtype.kind != "f" or not np.all(v == v.flat[0]):
        return None
    return float(v.flat[0])
