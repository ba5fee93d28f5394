"""Graph IR: order, cycles, validation, cloning, comparison, dead-code removal."""
from __future__ import annotations

import numpy as np
import pytest

from tessera.errors import MalformedModelError, ShapeError
from tessera.ir import DType, Graph, GraphKind, Node, Prim, TensorType
from tessera.ir.builder import PrimBuilder
from tessera.ir.prims import Category

F32 = DType.FLOAT32


def _graph() -> Graph:
    g = Graph("g", GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType((2, 3), F32)})
    b = PrimBuilder(g)
    y = b.unary(Prim.EXP, "x")
    z = b.add(y, b.const(np.arange(3, dtype=np.float32)))
    g.outputs = [z]
    return g


def test_every_prim_has_a_category():
    assert {p.category for p in Prim} == set(Category)
    assert Prim.MATMUL.category is Category.LINEAR and Prim.BROADCAST.category is Category.REDUCE


def test_builder_makes_broadcast_explicit():
    g = _graph()
    ops = [n.op for n in g.nodes]
    assert ops == ["exp", "reshape", "broadcast", "add"]
    assert g.types[g.outputs[0]] == TensorType((2, 3), F32)
    g.validate()


def test_topological_order_repairs_and_detects_cycles():
    g = _graph()
    g.nodes.reverse()
    assert [n.op for n in g.topological_order()] == ["exp", "reshape", "broadcast", "add"]
    a = Node("a", "exp", ("b",), ("a",))
    b = Node("b", "exp", ("a",), ("b",))
    cyc = Graph("c", GraphKind.PRIMITIVE, nodes=[a, b], types={"a": TensorType((1,), F32), "b": TensorType((1,), F32)})
    with pytest.raises(MalformedModelError, match="cycle"):
        cyc.topological_order()


def test_validate_names_the_dangling_read():
    g = _graph()
    g.nodes.append(Node("bad", "exp", ("nowhere",), ("out2",)))
    g.types["out2"] = TensorType((1,), F32)
    with pytest.raises(MalformedModelError, match="'bad'.*'nowhere'"):
        g.validate()


def test_clone_is_independent_and_equal():
    g = _graph()
    c = g.clone()
    assert c.same_as(g)
    c.constants[next(iter(c.constants))][0] = 42.0
    assert not c.same_as(g)
    c2 = g.clone()
    c2.nodes.pop()
    assert not c2.same_as(g)


def test_remove_dead():
    g = _graph()
    b = PrimBuilder(g)
    b.unary(Prim.TANH, "x")  # never used
    assert g.remove_dead() == 1
    assert all(n.op != "tanh" for n in g.nodes)


def test_type_rules_reject_implied_broadcast():
    g = Graph("g", GraphKind.PRIMITIVE, inputs=["x", "y"],
              types={"x": TensorType((2, 3), F32), "y": TensorType((1, 3), F32)})
    b = PrimBuilder(g)
    with pytest.raises(ShapeError, match="equal shapes"):
        b.emit(Prim.ADD, ["x", "y"])
    with pytest.raises(ShapeError, match="matmul"):
        b.emit(Prim.MATMUL, ["x", "y"])


def test_scalar_constants_and_the_erf_operand_keep_no_dimensions():
    # numpy's ascontiguousarray returns at least one dimension; a 0-d constant or operand must stay 0-d
    from tessera.ir.interp import _erf

    g = Graph(name="g", kind=GraphKind.PRIMITIVE)
    name = PrimBuilder(g).const(np.float32(2.0))
    assert g.constants[name].shape == () == g.types[name].shape
    assert _erf(np.array(0.5)).shape == ()
