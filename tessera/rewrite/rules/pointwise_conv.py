"""Two 1x1 convolutions joined through elementwise work become an MLP over pixels.

    conv1x1(f(conv1x1(x, w1)), w2)  =  T⁻¹( f'(X @ W1) @ W2 )

with X = reshape(transpose(x, NHWC), [N·H·W, C]), Wi = the weight as a [C_in, C_out] matrix (a
constant, transposed at compile time), f' = f with each per-channel operand (a bias, a batch-norm
scale) read as a [1, C] row instead of [1, C, 1, 1], and T⁻¹ the reshape and transpose back to
NCHW. A 1x1 convolution (stride 1, no padding, one group) computes out[n, o, p] = Σ_c w[o, c] x[n, c, p]
for every pixel p: the same product for each pixel row. Written this way the pair is a GEMM chain
(linear → elementwise → linear, `codegen/chain.py`), so the intermediate need not reach memory
(issue 15's 1x1-convolution pairs; mobilenet_v2 has two, segformer_b0's decode head one).

The middle may be any elementwise subgraph whose only reads from outside are fills and broadcasts
of per-channel values, and whose tensors nothing else reads (a DAG: HardSwish reads its input twice).
Exact: the same products and sums per output element.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.builder import PrimBuilder
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import CATEGORY_OF, Category, Prim
from tessera.rewrite.rules.base import Match, Rule, View, new_graph, odd_shape


def _is_1x1(view: View, node: Node) -> bool:
    """A 1x1 convolution over float NCHW data with a constant weight, stride 1, no padding and
    one group."""
    if node.op != Prim.CONV.value or len(node.inputs) != 2:
        return False
    x, w = node.inputs
    a = node.attrs
    return (w in view.graph.constants and len(view.shape(x)) == 4 and tuple(view.shape(w)[2:]) == (1, 1)
            and a.get("group", 1) == 1 and all(s == 1 for s in a.get("strides", (1, 1)))
            and not any(a.get("pads", (0,) * 4)) and view.graph.types[x].dtype.is_float)


def _per_channel(view: View, t: str, channels: int) -> str | None:
    """The [1, C, 1, 1] tensor a side input broadcasts (a bias), or None."""
    bc = view.made_by(t, Prim.BROADCAST)
    if bc is None:
        return None
    small = view.shape(bc.inputs[0])
    return bc.inputs[0] if tuple(small) == (1, channels, 1, 1) else None


def _middle(view: View, start: str, channels: int, shape: tuple[int, ...]) -> tuple[Node, list[Node]] | None:
    """The first convolution and the elementwise nodes between it and the tensor `start` (graph
    order), or None unless every tensor in between is read inside alone and every outside read is
    a fill or a per-channel broadcast."""
    nodes: dict[str, Node] = {}
    first: Node | None = None
    todo = [start]
    while todo:
        t = todo.pop()
        p = view.producers.get(t)
        if p is None:
            return None
        if p.op == Prim.CONV.value:
            if (first is not None and first is not p) or not _is_1x1(view, p):
                return None
            first = p
            continue
        if p.name in nodes:
            continue
        if CATEGORY_OF.get(p.op) is not Category.ELEMENTWISE or p.op == Prim.FILL.value \
                or len(p.outputs) != 1 or tuple(view.shape(p.outputs[0])) != shape:
            return None
        nodes[p.name] = p
        for i in p.inputs:
            fill = view.made_by(i, Prim.FILL)
            if fill is not None or _per_channel(view, i, channels) is not None:
                continue
            todo.append(i)
    if first is None:
        return None
    inside = set(nodes) | {first.name}
    for n in [first, *nodes.values()]:
        for o in n.outputs:
            readers = view.consumers.get(o, [])
            if o in view.graph.outputs or (o != start and any(r.name not in inside for r in readers)):
                return None
            if o == start and len(readers) != 1:
                return None
    order = [n for n in view.graph.nodes if n.name in nodes]
    return first, order


def _match(view: View, node: Node) -> Match | None:
    if not _is_1x1(view, node):
        return None
    t = node.inputs[0]
    shape = tuple(view.shape(t))
    found = _middle(view, t, shape[1], shape)
    if found is None:
        return None
    first, middle = found
    if tuple(view.shape(first.outputs[0])) != shape or view.graph.types[first.outputs[0]].dtype != view.graph.types[t].dtype:
        return None
    return Match("conv1x1_pair_as_mlp", (node.name,), (first.name, *(n.name for n in middle), node.name),
                 {"first": first.name, "middle": tuple(n.name for n in middle), "second": node.name})


def _matrix(b: PrimBuilder, view: View, w: str) -> str:
    """A [C_out, C_in, 1, 1] weight as the [C_in, C_out] right operand, computed now."""
    value = view.graph.constants[w]
    return b.const(np.ascontiguousarray(value.reshape(value.shape[0], value.shape[1]).T), "weight_matrix",
                   view.graph.types[w].dtype)


def _build(view: View, m: Match, b: PrimBuilder) -> list[str]:
    first, second = view.nodes[m.data["first"]], view.nodes[m.data["second"]]
    x = first.inputs[0]
    n, c, h, w = view.shape(x)
    rows = n * h * w
    pixels = b.reshape(b.transpose(x, (0, 2, 3, 1)), (rows, c))
    new = {first.outputs[0]: b.matmul(pixels, _matrix(b, view, first.inputs[1]))}
    channels = view.shape(first.outputs[0])[1]
    for node in (view.nodes[k] for k in m.data["middle"]):
        args = []
        for i in node.inputs:
            if i in new:
                args.append(new[i])
            elif (fill := view.made_by(i, Prim.FILL)) is not None:
                args.append(b.emit(Prim.FILL, [], {**fill.attrs, "shape": (rows, channels)}))
            else:  # a per-channel broadcast (the matcher admitted nothing else)
                row = b.reshape(_per_channel(view, i, channels), (1, channels))
                args.append(b.emit(Prim.BROADCAST, [row], {"shape": (rows, channels)}))
        new[node.outputs[0]] = b.emit(Prim(node.op), args, dict(node.attrs))
    y = b.matmul(new[second.inputs[0]], _matrix(b, view, second.inputs[1]))
    o = view.shape(second.outputs[0])[1]
    return [b.transpose(b.reshape(y, (n, h, w, o)), (0, 3, 1, 2))]


def _instance(rng: np.random.Generator) -> Graph:
    """conv1x1 -> bias -> ReLU, sigmoid, or HardSwish (a DAG) -> conv1x1, odd sizes."""
    n, h, w = odd_shape(rng, 3, 1, 5)
    c, mid, o = odd_shape(rng, 3, 1, 7)
    g, b = new_graph({"x": (n, c, h, w)})
    attrs = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1}
    w1 = b.const(rng.standard_normal((mid, c, 1, 1)).astype(np.float32), "w1")
    w2 = b.const(rng.standard_normal((o, mid, 1, 1)).astype(np.float32), "w2")
    bias = b.const(rng.standard_normal((1, mid, 1, 1)).astype(np.float32), "bias")
    y = b.emit(Prim.CONV, [b.unary(Prim.TANH, "x"), w1], attrs)  # the pair reads a computed tensor
    t = b.add(y, b.emit(Prim.BROADCAST, [bias], {"shape": (n, mid, h, w)}))
    kind = int(rng.integers(3))
    if kind == 0:
        t = b.binary(Prim.MAX, t, b.scalar(0.0, t))
    elif kind == 1:
        t = b.unary(Prim.SIGMOID, t)
    else:  # x * min(max(x + 3, 0), 6) / 6
        r = b.binary(Prim.MIN, b.binary(Prim.MAX, b.add(t, b.scalar(3.0, t)), b.scalar(0.0, t)), b.scalar(6.0, t))
        t = b.mul(t, b.div(r, b.scalar(6.0, t)))
    g.outputs = [b.emit(Prim.CONV, [t, w2], attrs)]
    return g


CONV1X1_PAIR_AS_MLP = Rule("conv1x1_pair_as_mlp", "conv1x1(f(conv1x1(x, w1)), w2) = T'(f'(T(x) @ W1) @ W2)",
                           _match, _build, _instance)

RULES = (CONV1X1_PAIR_AS_MLP,)
