"""Operator graph -> primitive graph, one fission rule per operator node."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from tessera.errors import ShapeError, node_ref
from tessera.fission.cse import eliminate_common
from tessera.fission.views import collapse_reshapes
from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ir.prims import Prim
from tessera.ops.registry import Unsupported, lower_node


@dataclass(frozen=True)
class OpaqueOp:
    """An operator node that fission left whole, and why."""

    node: str
    op_type: str
    reason: str


@dataclass
class FissionResult:
    graph: Graph
    opaque: list[OpaqueOp] = field(default_factory=list)


def emit_opaque(b: PrimBuilder, node: Node, out_types: list[TensorType], opset: int) -> list[str]:
    """One OPAQUE primitive that runs `node` as-is through the fallback."""
    b.source = (node.name,)
    attrs = {"op_type": node.op, "domain": node.domain, "opset": opset, "onnx_attrs": dict(node.attrs)}
    if len(node.outputs) == 1:
        return [b.emit(Prim.OPAQUE, node.inputs, attrs, out_type=out_types[0], hint=node.op.lower())]
    # Several outputs: the node writes them all, each with its own type. An
    # omitted output keeps its place as "" so the rest keep their ONNX positions.
    name = b.fresh(f"{node.name}/opaque")
    outs = [b.fresh(f"{name}:{i}") if o else "" for i, o in enumerate(node.outputs)]
    b.graph.nodes.append(Node(name=name, op=Prim.OPAQUE.value, inputs=node.inputs, outputs=tuple(outs),
                              attrs=attrs, source=(node.name,)))
    named = [o for o in outs if o]
    for o, t in zip(named, out_types):
        b.graph.types[o] = t
    return named


def fission(opg: Graph) -> FissionResult:
    """Split every operator of `opg` into primitives.

    An operator without a rule, or whose rule raises `Unsupported`, becomes
    one OPAQUE primitive. Graph inputs and outputs keep their names.
    """
    pg = Graph(name=opg.name, kind=GraphKind.PRIMITIVE, inputs=list(opg.inputs),
               types={t: opg.types[t] for t in list(opg.inputs) + list(opg.constants)},
               constants={k: v for k, v in opg.constants.items()}, opsets=dict(opg.opsets))
    b = PrimBuilder(pg)
    alias: dict[str, str] = {}
    opaque: list[OpaqueOp] = []
    for node in opg.topological_order():
        node_in = replace(node, inputs=tuple(alias.get(i, i) for i in node.inputs))
        mark = (len(pg.nodes), set(pg.types), set(pg.constants))
        try:
            outs = lower_node(b, node_in, opg.opset)
        except Unsupported as e:
            _rollback(pg, mark)
            outs = emit_opaque(b, node_in, [opg.types[o] for o in node.outputs if o], opg.opset)
            opaque.append(OpaqueOp(node.name, node.op, str(e)))
        for o, p in zip([o for o in node.outputs if o], outs):
            if pg.types[p] != opg.types[o]:
                raise ShapeError(f"{node_ref(node.name, node.op)}: output '{o}' is {opg.types[o]} "
                                 f"in the model but fission made {pg.types[p]}")
            alias[o] = p
    _name_outputs(pg, b, opg.outputs, alias)
    pg.remove_dead()
    collapse_reshapes(pg)
    eliminate_common(pg)
    return FissionResult(pg, opaque)


def _rollback(pg: Graph, mark: tuple[int, set[str], set[str]]) -> None:
    n, types, consts = mark
    del pg.nodes[n:]
    for t in set(pg.types) - types:
        del pg.types[t]
    for c in set(pg.constants) - consts:
        del pg.constants[c]


def _name_outputs(pg: Graph, b: PrimBuilder, outputs: list[str], alias: dict[str, str]) -> None:
    """Make the primitive graph's outputs carry the model's output names."""
    producers = pg.producers()
    claimed: set[str] = set()
    for o in outputs:
        p = alias.get(o, o)
        node = producers.get(p)
        renamable = (p != o and node is not None and len(node.outputs) == 1 and p not in claimed
                     and p not in pg.inputs and o not in pg.types)
        if renamable:
            _rename(pg, p, o)
            for k, v in alias.items():
                if v == p:
                    alias[k] = o
            producers = pg.producers()
            p = o
        elif p != o or p in claimed:
            # The output is an input, a constant, or another output: copy it.
            b.source = ()
            b.emit(Prim.RESHAPE, [p], {"shape": pg.types[p].shape}, name=o)
        claimed.add(o)
    pg.outputs = list(outputs)


def _rename(pg: Graph, old: str, new: str) -> None:
    def sub(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(new if x == old else x for x in names)

    pg.nodes = [replace(n, name=new if n.name == old else n.name, inputs=sub(n.inputs), outputs=sub(n.outputs))
                for n in pg.nodes]
    pg.types[new] = pg.types.pop(old)
