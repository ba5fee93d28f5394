"""Which epilogue nodes compute the tanh GELU, so a library GEMM can take them in its epilogue.

cuBLASLt's GELU_BIAS epilogue computes `0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3)))`. Models
write that function out in many ways (GPT-2: Pow, Mul, Add, Tanh, Mul; others through Sigmoid),
which fission turns into elementwise primitives. Rather than match one spelling, `gelu_tanh_nodes`
finds the elementwise nodes that compute a function of the bias add's result alone and
evaluates them on sample points with the reference interpreter: they are fused only where they
agree with the formula to within what the tensors' precision explains. The erf GELU (BERT's)
differs from the tanh form by up to 1.8e-4 |x|, which the check refuses: cuBLASLt has no erf
epilogue.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from tessera.ir import interp
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType, scalar_constant
from tessera.ir.prims import Prim

GELU_TANH = "gelu_tanh"

# Smooth float-valued primitives only: max/min/abs/where could make a piecewise function that
# agrees with the GELU on the sample points and differs between them.
_SMOOTH = frozenset(p.value for p in (
    Prim.NEG, Prim.EXP, Prim.LOG, Prim.SQRT, Prim.RECIPROCAL, Prim.TANH, Prim.ERF, Prim.SIGMOID,
    Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.POW, Prim.CAST))
# 64 points over the GELU's bend, 0, and far points where x^3 dominates (or would overflow float16).
_SAMPLES = np.concatenate([np.linspace(-6.0, 6.0, 64), [0.0, -10.0, 10.0, -50.0, 50.0, -500.0, 500.0]])
# Error allowed relative to |x|. float32 spellings agree to ~1e-8; float16-rounded constants
# (0.044715, sqrt(2/pi)) move the function by ~1.1e-5 |x|; the erf GELU differs by 1.8e-4 |x|.
_TOL_32 = 1e-6
_TOL_16 = 4e-5

# A tensor reference in a signature: ("x",) the GELU's input, ("v", i) step i's output,
# ("k", value, dtype) a constant scalar.
Ref = tuple


def gelu_tanh_nodes(graph: Graph, nodes: Sequence[Node], prologue: Sequence[Node], a: str,
                    outputs: Sequence[str]) -> list[Node]:
    """The nodes of `nodes` (a kernel, in topological order) that compute the tanh GELU of `a`,
    in order, ending at the node that writes the result; [] if there are none.

    They read only `a`, each other and constants; `a` and every tensor they compute but the last
    are read by none but them and are not kernel `outputs` (the library call writes only the
    last). Of the sets that pass the numeric check, the one that ends furthest along wins."""
    if a in outputs:
        return []
    const = _constant_tensors(graph, nodes, prologue)
    chain = _derived(graph, nodes, const, a)
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for t in dict.fromkeys(n.inputs):
            readers.setdefault(t, []).append(n)
    in_chain = {n.name for n in chain}
    if not chain or any(r.name not in in_chain for r in readers.get(a, [])):
        return []
    producer = {o: n for n in nodes for o in n.outputs}
    want = graph.types[a].dtype
    for last in reversed(chain):
        group = _ancestors(chain, last)
        members = {n.name for n in group}
        inner = [a] + [n.outputs[0] for n in group if n is not last]
        if graph.types[last.outputs[0]].dtype != want or any(
                t in outputs or any(r.name not in members for r in readers.get(t, [])) for t in inner):
            continue
        sig = _signature(graph, producer, group, a)
        if sig is not None and _computes_gelu_tanh(sig):
            return group
    return []


def _constant_tensors(graph: Graph, nodes: Sequence[Node], prologue: Sequence[Node]) -> set[str]:
    """Tensors that hold constants: initializers, fills, and the free prologue (it reads only constants)."""
    const = set(graph.constants)
    const.update(o for n in prologue for o in n.outputs)
    const.update(o for n in nodes if n.op == Prim.FILL.value for o in n.outputs)
    return const


def _derived(graph: Graph, nodes: Sequence[Node], const: set[str], a: str) -> list[Node]:
    """Smooth float nodes that compute from `a` and constants alone (transitively), in order."""
    derived = {a}
    chain: list[Node] = []
    for n in nodes:
        out = n.outputs[0]
        if n.op not in _SMOOTH or out in const or not graph.types[out].dtype.is_float:
            continue
        if any(t in derived for t in n.inputs) and all(t in derived or t in const for t in n.inputs):
            derived.add(out)
            chain.append(n)
    return chain


def _ancestors(chain: list[Node], last: Node) -> list[Node]:
    """The nodes of `chain` that `last` needs, itself included, in chain order."""
    producer = {n.outputs[0]: n for n in chain}
    keep = {last.name}
    todo = list(last.inputs)
    while todo:
        p = producer.get(todo.pop())
        if p is not None and p.name not in keep:
            keep.add(p.name)
            todo.extend(p.inputs)
    return [n for n in chain if n.name in keep]


def _signature(graph: Graph, producer: dict[str, Node], group: list[Node], a: str) -> tuple | None:
    """What `group` computes, independent of names and shapes: (dtype of `a`, steps), a step
    being (op, argument refs, output dtype, cast target). None if a constant is not one scalar."""
    refs: dict[str, Ref] = {a: ("x",)}
    steps = []
    for i, n in enumerate(group):
        args = []
        for t in n.inputs:
            if t not in refs:
                v = scalar_constant(graph, producer, t)
                if v is None:
                    return None
                refs[t] = ("k", v, graph.types[t].dtype.value)
            args.append(refs[t])
        steps.append((n.op, tuple(args), graph.types[n.outputs[0]].dtype.value, n.attrs.get("dtype")))
        refs[n.outputs[0]] = ("v", i)
    return graph.types[a].dtype.value, tuple(steps)


@lru_cache(maxsize=256)
def _computes_gelu_tanh(sig: tuple) -> bool:
    """Does the signature's function equal the tanh GELU on the sample points? Evaluated in
    float64 (its constants as their dtypes store them), compared with the formula relative to |x|."""
    a_dtype, steps = sig
    g = _sample_graph(DType(a_dtype), steps)
    got = interp.run(g, {"x": _SAMPLES}, exact=True)[g.outputs[0]]
    x = _SAMPLES
    want = 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    narrow = any(DType(d).itemsize < 4 for d in _dtypes(sig))
    tol = _TOL_16 if narrow else _TOL_32
    return bool(np.all(np.abs(got - want) <= tol * np.maximum(np.abs(x), 1e-6)))


def _dtypes(sig: tuple) -> list[str]:
    a_dtype, steps = sig
    out = [a_dtype]
    for _op, args, dt, cast in steps:
        out += [dt] + [r[2] for r in args if r[0] == "k"] + ([cast] if cast else [])
    return out


def _sample_graph(a_dtype: DType, steps: tuple) -> Graph:
    """The signature's steps as a primitive graph over one vector of sample points."""
    shape = (len(_SAMPLES),)
    g = Graph(name="gelu_check", kind=GraphKind.PRIMITIVE, inputs=["x"], types={"x": TensorType(shape, a_dtype)})
    names = {("x",): "x"}
    for i, (op, args, dt, cast) in enumerate(steps):
        ins = []
        for r in args:
            if r not in names:  # a constant: one fill per distinct scalar
                names[r] = f"k{len(names)}"
                g.types[names[r]] = TensorType(shape, DType(r[2]))
                g.nodes.append(Node(names[r], Prim.FILL.value, (), (names[r],),
                                    {"value": r[1], "shape": shape, "dtype": r[2]}))
            ins.append(names[r])
        out = names[("v", i)] = f"v{i}"
        g.types[out] = TensorType(shape, DType(dt))
        g.nodes.append(Node(out, op, tuple(ins), (out,), {"dtype": cast} if cast else {}))
    g.outputs = [f"v{len(steps) - 1}"]
    return g
