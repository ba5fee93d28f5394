"""ONNX export of any graph: `to_onnx(graph) -> onnx.ModelProto`.

An operator graph is written back node for node. A primitive graph maps each
primitive to one or a few standard ONNX operators (opset 20 unless it holds
OPAQUE nodes, see `to_onnx`), so that a primitive graph can be checked by
onnx.checker and run by onnxruntime against the reference interpreter.

Every exported node's doc_string names the ONNX nodes it came from (Node.source),
so a node in a dumped model can be traced back to the input model.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from tessera.errors import UnsupportedError
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, unique_name
from tessera.ir.prims import Prim

PRIMITIVE_OPSET = 20  # the opset primitives are exported at
MIN_PRIMITIVE_OPSET = 11  # Slice steps, Pad with input pads, GatherElements, Where ...
_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training")


# ---- attributes and nodes ------------------------------------------------------------
def ir_version_for(imports: Sequence[onnx.OperatorSetIdProto]) -> int:
    """The oldest IR version that knows these opsets (onnxruntime may not read the newest)."""
    std = [i for i in imports if i.domain in _STANDARD_DOMAINS]
    try:
        return max(8, helper.find_min_ir_version_for(std))
    except Exception:  # an opset newer than onnx's table: let onnx pick
        return onnx.IR_VERSION


def _schema_attr_types(op_type: str, domain: str, opset: int) -> dict[str, int]:
    """Attribute name -> AttributeProto type from the operator's schema, if onnx knows it."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # unknown operator or custom domain
        return {}
    return {name: int(a.type) for name, a in schema.attributes.items()}


def _np_tensor(value: np.ndarray, name: str = "") -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def onnx_attribute(key: str, value: Any, attr_type: int | None = None) -> AttributeProto:
    """One ONNX attribute from a Python value or NumPy array.

    `attr_type` (from the operator's schema when known) settles what the value
    alone cannot: an int given for a float attribute, an empty list, an array
    that holds a list of ints.
    """
    if isinstance(value, AttributeProto):
        a = AttributeProto()
        a.CopyFrom(value)
        a.name = key
        return a
    A = AttributeProto
    if attr_type == A.FLOAT:
        return helper.make_attribute(key, float(value), attr_type=A.FLOAT)
    if attr_type == A.INT:
        return helper.make_attribute(key, int(value), attr_type=A.INT)
    if attr_type == A.FLOATS:
        return helper.make_attribute(key, [float(v) for v in np.ravel(value)], attr_type=A.FLOATS)
    if attr_type == A.INTS:
        return helper.make_attribute(key, [int(v) for v in np.ravel(value)], attr_type=A.INTS)
    if attr_type == A.STRINGS:
        return helper.make_attribute(key, list(value), attr_type=A.STRINGS)
    if attr_type == A.TENSOR and isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        return helper.make_attribute(key, _np_tensor(np.asarray(value)), attr_type=A.TENSOR)
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, _np_tensor(value), attr_type=A.TENSOR)
    if isinstance(value, (bool, np.bool_)):
        return helper.make_attribute(key, int(value), attr_type=A.INT)
    if isinstance(value, (int, np.integer)):
        return helper.make_attribute(key, int(value), attr_type=A.INT)
    if isinstance(value, (float, np.floating)):
        return helper.make_attribute(key, float(value), attr_type=A.FLOAT)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            return helper.make_attribute(key, [], attr_type=attr_type or A.INTS)
        if all(isinstance(v, (bool, int, np.integer)) for v in items):
            return helper.make_attribute(key, [int(v) for v in items], attr_type=A.INTS)
        if all(isinstance(v, (bool, int, float, np.integer, np.floating)) for v in items):
            return helper.make_attribute(key, [float(v) for v in items], attr_type=A.FLOATS)
        if all(isinstance(v, np.ndarray) for v in items):
            return helper.make_attribute(key, [_np_tensor(v) for v in items], attr_type=A.TENSORS)
    return helper.make_attribute(key, value, attr_type=attr_type)


def make_onnx_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], attrs: Mapping[str, Any],
                   domain: str = "", opset: int = PRIMITIVE_OPSET, name: str = "",
                   doc_string: str = "") -> onnx.NodeProto:
    """A NodeProto whose attributes are converted by `onnx_attribute` using the schema at `opset`."""
    types = _schema_attr_types(op_type, domain, opset)
    node = helper.make_node(op_type, list(inputs), list(outputs), name=name, domain=domain or None,
                            doc_string=doc_string or None)
    node.attribute.extend(onnx_attribute(k, v, types.get(k)) for k, v in attrs.items() if v is not None)
    return node


def opaque_onnx_attrs(attrs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ONNX attributes of an OPAQUE primitive."""
    return attrs.get("onnx_attrs", {})


def _doc(node: Node, what: str) -> str:
    src = ", ".join(node.source) if node.source else "none (added by tessera)"
    return f"{what} '{node.name}'; source ONNX nodes: {src}"


def _storage_dtype(dt: DType) -> np.dtype:
    """NumPy type of an ONNX tensor of `dt` (bfloat16 through ml_dtypes)."""
    return np.dtype(ml_dtypes.bfloat16) if dt is DType.BFLOAT16 else dt.to_numpy()


# ---- the exporter ------------------------------------------------------------------
class _Exporter:
    """Collects nodes, initializers and fresh names for one exported model."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.tensors: set[str] = set(graph.types) | set(graph.inputs) | set(graph.outputs)
        for n in graph.nodes:
            self.tensors.update(t for t in (*n.inputs, *n.outputs) if t)
        self.node_names: set[str] = set()
        self.domains: dict[str, int] = {}

    def fresh_tensor(self, hint: str) -> str:
        name = unique_name(hint, self.tensors)
        self.tensors.add(name)
        return name

    def node_name(self, hint: str) -> str:
        hint = hint.strip() or "node"
        name = unique_name(re.sub(r"\s+", "_", hint), self.node_names)
        self.node_names.add(name)
        return name

    def const(self, hint: str, value: np.ndarray, dtype: DType | None = None) -> str:
        name = self.fresh_tensor(hint)
        dt = dtype or DType.from_numpy(np.asarray(value).dtype)
        self.inits.append(_np_tensor(np.asarray(value).astype(_storage_dtype(dt)), name))
        return name

    def ints(self, hint: str, values: Sequence[int]) -> str:
        return self.const(hint, np.asarray(list(values), dtype=np.int64))

    def add(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], hint: str, doc: str,
            domain: str = "", opset: int | None = None, attrs: Mapping[str, Any] | None = None,
            **kw: Any) -> None:
        """Append one node; ONNX attributes come from `attrs` (raw, any names) and `kw`."""
        attrs = {**(attrs or {}), **kw}
        self.nodes.append(make_onnx_node(op_type, inputs, outputs, attrs, domain=domain,
                                         opset=opset or self.opset, name=self.node_name(hint), doc_string=doc))

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        t = self.graph.types[name]
        return helper.make_tensor_value_info(name, t.dtype.to_onnx(), list(t.shape))


def to_onnx(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """An ONNX model computing what `graph` computes.

    Operator graphs keep their opsets (`opset`, if given, replaces the default
    domain's version). Primitive graphs are written at `opset`, else at opset 20,
    unless they hold OPAQUE nodes: those are written as the original operator,
    whose meaning depends on the opset, so the model then takes the opaque
    nodes' opset (at least 11, the oldest the primitive mappings support).
    """
    if graph.kind is GraphKind.OPERATOR:
        ex = _Exporter(graph, opset or graph.opset)
        ex.domains = {d: v for d, v in graph.opsets.items() if d not in ("", "ai.onnx")}
        for node in graph.nodes:
            ex.add(node.op, node.inputs, node.outputs, node.name, _doc(node, node.op), domain=node.domain,
                   opset=ex.domains.get(node.domain, 1) if node.domain not in ("", "ai.onnx") else None,
                   attrs=node.attrs)
            if node.domain not in ("", "ai.onnx"):
                ex.domains.setdefault(node.domain, 1)
    else:
        ex = _Exporter(graph, opset or _primitive_opset(graph))
        if ex.opset < MIN_PRIMITIVE_OPSET:
            raise UnsupportedError(f"primitive graphs export at opset {MIN_PRIMITIVE_OPSET} or later, "
                                   f"not {ex.opset}")
        for node in graph.topological_order():
            try:
                prim = Prim(node.op)
            except ValueError:
                raise UnsupportedError(f"node '{node.name}' ({node.op}) is not a primitive") from None
            _EXPORTERS[prim](ex, node)
    return _model(graph, ex)


def _primitive_opset(graph: Graph) -> int:
    opaque = [int(n.attrs["opset"]) for n in graph.nodes if n.op == Prim.OPAQUE.value and "opset" in n.attrs]
    return max(MIN_PRIMITIVE_OPSET, max(opaque)) if opaque else PRIMITIVE_OPSET


def _model(graph: Graph, ex: _Exporter) -> onnx.ModelProto:
    for name, value in graph.constants.items():
        ex.inits.append(_np_tensor(np.asarray(value).astype(_storage_dtype(graph.types[name].dtype)), name))
    boundary = set(graph.inputs) | set(graph.outputs) | set(graph.constants)
    produced = [o for n in graph.nodes for o in n.outputs if o]
    value_info = [ex.value_info(t) for t in dict.fromkeys(produced) if t not in boundary and t in graph.types]
    g = helper.make_graph(
        ex.nodes, graph.name or "tessera",
        [ex.value_info(t) for t in graph.inputs], [ex.value_info(t) for t in graph.outputs],
        initializer=ex.inits, value_info=value_info)
    imports = [helper.make_opsetid("", ex.opset)] + [helper.make_opsetid(d, v) for d, v in ex.domains.items()]
    return helper.make_model(g, opset_imports=imports, ir_version=ir_version_for(imports),
                             producer_name="tessera")


# ---- primitive -> ONNX ------------------------------------------------------------
_SIMPLE: dict[Prim, str] = {
    Prim.NEG: "Neg", Prim.ABS: "Abs", Prim.EXP: "Exp", Prim.LOG: "Log", Prim.SQRT: "Sqrt",
    Prim.RECIPROCAL: "Reciprocal", Prim.TANH: "Tanh", Prim.ERF: "Erf", Prim.SIGMOID: "Sigmoid",
    Prim.SIN: "Sin", Prim.COS: "Cos", Prim.FLOOR: "Floor", Prim.ISNAN: "IsNaN", Prim.NOT: "Not",
    Prim.ADD: "Add", Prim.SUB: "Sub", Prim.MUL: "Mul", Prim.DIV: "Div", Prim.POW: "Pow",
    Prim.MAX: "Max", Prim.MIN: "Min", Prim.EQUAL: "Equal", Prim.GREATER: "Greater", Prim.LESS: "Less",
    Prim.AND: "And", Prim.OR: "Or", Prim.WHERE: "Where",
    Prim.CONCAT: "Concat", Prim.GATHER: "Gather", Prim.GATHER_ELEMENTS: "GatherElements",
    Prim.MATMUL: "MatMul", Prim.TRANSPOSE: "Transpose",
}
_SIMPLE_ATTRS: dict[Prim, tuple[str, ...]] = {
    Prim.CONCAT: ("axis",), Prim.GATHER: ("axis",), Prim.GATHER_ELEMENTS: ("axis",), Prim.TRANSPOSE: ("perm",),
}


def _simple(ex: _Exporter, n: Node) -> None:
    attrs = {k: n.attrs[k] for k in _SIMPLE_ATTRS.get(n.prim, ())}
    ex.add(_SIMPLE[n.prim], n.inputs, n.outputs, n.name, _doc(n, n.op), **attrs)


def _mod(ex: _Exporter, n: Node) -> None:
    ex.add("Mod", n.inputs, n.outputs, n.name, _doc(n, n.op), fmod=1)  # C's fmod, for floats and integers


def _fill(ex: _Exporter, n: Node) -> None:
    t = ex.graph.types[n.outputs[0]]
    value = helper.make_tensor("value", t.dtype.to_onnx(), [1], [n.attrs["value"]])
    ex.add("ConstantOfShape", [ex.ints(f"{n.name}/shape", t.shape)], n.outputs, n.name, _doc(n, n.op),
           value=value)


def _cast(ex: _Exporter, n: Node) -> None:
    ex.add("Cast", n.inputs, n.outputs, n.name, _doc(n, n.op), to=DType(n.attrs["dtype"]).to_onnx())


def _reduce(ex: _Exporter, n: Node) -> None:
    op = {Prim.REDUCE_SUM: "ReduceSum", Prim.REDUCE_MAX: "ReduceMax", Prim.REDUCE_MIN: "ReduceMin"}[n.prim]
    axes = [int(a) for a in n.attrs["axes"]]
    # ReduceSum takes axes as an input from opset 13, ReduceMax/Min from 18.
    as_input = ex.opset >= (13 if n.prim is Prim.REDUCE_SUM else 18)
    if as_input:
        ex.add(op, [n.inputs[0], ex.ints(f"{n.name}/axes", axes)], n.outputs, n.name, _doc(n, n.op), keepdims=1)
    else:
        ex.add(op, n.inputs, n.outputs, n.name, _doc(n, n.op), axes=axes, keepdims=1)


def _broadcast(ex: _Exporter, n: Node) -> None:
    ex.add("Expand", [n.inputs[0], ex.ints(f"{n.name}/shape", n.attrs["shape"])], n.outputs, n.name,
           _doc(n, n.op))


def _reshape_to(ex: _Exporter, n: Node, x: str, shape: Sequence[int], out: str | None, hint: str,
                node_name: str | None = None) -> str:
    out = out or ex.fresh_tensor(f"{n.name}/{hint}")
    attrs = {"allowzero": 1} if 0 in shape and ex.opset >= 14 else {}  # a 0 in shape is a 0, not "copy"
    ex.add("Reshape", [x, ex.ints(f"{n.name}/{hint}_shape", shape)], [out], node_name or f"{n.name}/{hint}",
           _doc(n, n.op), **attrs)
    return out


def _reshape(ex: _Exporter, n: Node) -> None:
    _reshape_to(ex, n, n.inputs[0], n.attrs["shape"], n.outputs[0], "reshape", node_name=n.name)


def _cast_to(ex: _Exporter, n: Node, x: str, dt: DType, hint: str) -> str:
    out = ex.fresh_tensor(f"{n.name}/{hint}")
    ex.add("Cast", [x], [out], f"{n.name}/{hint}", _doc(n, n.op), to=dt.to_onnx())
    return out


# The type a pooling operator runs a window reduction of a given type in
# (onnxruntime has MaxPool for these, Conv for float32/float16 only).
_POOL_TYPE: dict[str, dict[DType, DType]] = {
    "max": {DType.FLOAT32: DType.FLOAT32, DType.FLOAT64: DType.FLOAT64, DType.FLOAT16: DType.FLOAT16,
            DType.INT8: DType.INT8, DType.UINT8: DType.UINT8, DType.BFLOAT16: DType.FLOAT32,
            DType.BOOL: DType.UINT8},
    "sum": {DType.FLOAT32: DType.FLOAT32, DType.FLOAT16: DType.FLOAT32, DType.BFLOAT16: DType.FLOAT32},
}


def _window_reduce(ex: _Exporter, n: Node) -> None:
    kind = n.attrs["kind"]
    if kind not in _POOL_TYPE:
        raise UnsupportedError(f"node '{n.name}': window_reduce kind {kind!r}")
    kernel, pads = n.attrs["kernel"], n.attrs["pads"]
    # onnxruntime's MaxPool refuses pads as large as the kernel.
    small_pads = all(p < kernel[i % len(kernel)] for i, p in enumerate(pads))
    if ex.graph.types[n.inputs[0]].dtype in _POOL_TYPE[kind] and (kind == "sum" or small_pads):
        _window_pool(ex, n)
    else:
        _window_separable(ex, n)


def _window_pool(ex: _Exporter, n: Node) -> None:
    """max: MaxPool (padding never wins, as in the primitive). sum: a Conv with a
    ones kernel on one channel: exact up to float32 accumulation order.
    Both need [N, C, *spatial]: leading dims are folded by a Reshape."""
    x, out = n.inputs[0], n.outputs[0]
    a = n.attrs
    xt, ot = ex.graph.types[x], ex.graph.types[out]
    k = len(a["kernel"])
    lead = xt.shape[: xt.rank - k]
    count = int(np.prod(lead, dtype=np.int64))
    kind = a["kind"]
    if kind == "max":
        folded = lead if len(lead) == 2 else (1, count)
    else:
        folded = (count, 1)
    work = _POOL_TYPE[kind][xt.dtype]
    y = x
    if folded != lead:
        y = _reshape_to(ex, n, y, folded + xt.shape[xt.rank - k:], None, "fold")
    if work != xt.dtype:
        y = _cast_to(ex, n, y, work, "widen")
    last = folded == lead and work == xt.dtype
    pooled = out if last else ex.fresh_tensor(f"{n.name}/pooled")
    common = dict(strides=a["strides"], pads=a["pads"], dilations=a["dilations"], kernel_shape=a["kernel"])
    if kind == "max":
        ex.add("MaxPool", [y], [pooled], n.name, _doc(n, n.op), **common)
    else:
        ones = ex.const(f"{n.name}/ones", np.ones((1, 1) + tuple(a["kernel"])), work)
        ex.add("Conv", [y, ones], [pooled], n.name, _doc(n, n.op), group=1, **common)
    y = pooled
    if work != xt.dtype:
        y = out if folded == lead else ex.fresh_tensor(f"{n.name}/narrow")
        ex.add("Cast", [pooled], [y], f"{n.name}/narrow", _doc(n, n.op), to=xt.dtype.to_onnx())
    if folded != lead:
        _reshape_to(ex, n, y, ot.shape, out, "unfold")


def _window_separable(ex: _Exporter, n: Node) -> None:
    """Types without a pooling operator (float64 and integer sums, int32/int64
    max): a box window is separable, so pad with the reduction's identity, then
    per spatial dim combine the kernel's strided Slices with Add or Max. Exact."""
    x, out = n.inputs[0], n.outputs[0]
    a = n.attrs
    xt = ex.graph.types[x]
    kern, strides, dil, pads = a["kernel"], a["strides"], a["dilations"], a["pads"]
    k = len(kern)
    lead = xt.rank - k
    if a["kind"] == "sum":
        op, fill = "Add", 0
    else:
        op = "Max"
        fill = np.iinfo(xt.dtype.to_numpy()).min if xt.dtype.to_numpy().kind in "iu" else -np.inf
    y = x
    if any(pads):
        y = ex.fresh_tensor(f"{n.name}/padded")
        all_pads = [0] * lead + list(pads[:k]) + [0] * lead + list(pads[k:])
        value = ex.const(f"{n.name}/identity", np.asarray(fill).astype(_storage_dtype(xt.dtype)), xt.dtype)
        ex.add("Pad", [x, ex.ints(f"{n.name}/pads", all_pads), value], [y], f"{n.name}/pad", _doc(n, n.op),
               mode="constant")
    out_shape = ex.graph.types[out].shape
    for i in range(k):
        axis, o = lead + i, out_shape[lead + i]
        taps = []
        for j in range(kern[i]):
            t = ex.fresh_tensor(f"{n.name}/tap{i}_{j}")
            start = j * dil[i]
            ins = [y, ex.ints(f"{n.name}/start", [start]), ex.ints(f"{n.name}/end", [start + (o - 1) * strides[i] + 1]),
                   ex.ints(f"{n.name}/axis", [axis]), ex.ints(f"{n.name}/step", [strides[i]])]
            ex.add("Slice", ins, [t], f"{n.name}/tap{i}_{j}", _doc(n, n.op))
            taps.append(t)
        acc = taps[0]
        for j, t in enumerate(taps[1:], 1):
            final = i == k - 1 and j == len(taps) - 1
            nxt = out if final else ex.fresh_tensor(f"{n.name}/acc{i}_{j}")
            ex.add(op, [acc, t], [nxt], f"{n.name}/{op.lower()}{i}_{j}", _doc(n, n.op))
            acc = nxt
        y = acc
    if y != out:  # a 1-tap window in the last dim: nothing was combined there
        ex.add("Identity", [y], [out], f"{n.name}/out", _doc(n, n.op))


def _slice(ex: _Exporter, n: Node) -> None:
    x = n.inputs[0]
    dims = ex.graph.types[x].shape
    starts, ends, steps = [], [], []
    for d, (st, sp, cnt) in enumerate(zip(n.attrs["starts"], n.attrs["steps"], n.attrs["shape"])):
        if cnt == 0:
            starts.append(0), ends.append(0), steps.append(1)
            continue
        end = st + cnt * sp
        # A negative end counts from the back; -(dim+1) is "before index 0" for a negative step.
        starts.append(st), steps.append(sp), ends.append(end if end >= 0 else -(dims[d] + 1))
    ins = [x, ex.ints(f"{n.name}/starts", starts), ex.ints(f"{n.name}/ends", ends),
           ex.ints(f"{n.name}/axes", range(len(dims))), ex.ints(f"{n.name}/steps", steps)]
    ex.add("Slice", ins, n.outputs, n.name, _doc(n, n.op))


def _pad(ex: _Exporter, n: Node) -> None:
    x = n.inputs[0]
    dt = ex.graph.types[x].dtype
    mode = n.attrs["mode"]
    ins = [x, ex.ints(f"{n.name}/pads", n.attrs["pads"])]
    if mode == "constant":
        value = np.asarray(n.attrs.get("value", 0)).astype(_storage_dtype(dt))
        ins.append(ex.const(f"{n.name}/value", value, dt))
    ex.add("Pad", ins, n.outputs, n.name, _doc(n, n.op), mode=mode)


def _conv(ex: _Exporter, n: Node) -> None:
    a = n.attrs
    kernel = ex.graph.types[n.inputs[1]].shape[2:]
    extra = {"output_padding": a["output_padding"]} if n.prim is Prim.CONV_TRANSPOSE else {}
    ex.add("Conv" if n.prim is Prim.CONV else "ConvTranspose", n.inputs, n.outputs, n.name, _doc(n, n.op),
           kernel_shape=kernel, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
           group=a["group"], **extra)


def _opaque(ex: _Exporter, n: Node) -> None:
    a = n.attrs
    domain = a.get("domain", "") or ""
    opset = ex.opset
    if domain not in ("", "ai.onnx"):
        opset = ex.graph.opsets.get(domain, 1)
        ex.domains.setdefault(domain, opset)
    ex.add(a["op_type"], n.inputs, n.outputs, n.name, _doc(n, f"opaque {a['op_type']}"),
           domain=domain, opset=opset, attrs=opaque_onnx_attrs(a))


_EXPORTERS: dict[Prim, Callable[[_Exporter, Node], None]] = {
    **{p: _simple for p in _SIMPLE},
    Prim.FILL: _fill, Prim.CAST: _cast, Prim.MOD: _mod,
    Prim.REDUCE_SUM: _reduce, Prim.REDUCE_MAX: _reduce, Prim.REDUCE_MIN: _reduce,
    Prim.BROADCAST: _broadcast, Prim.WINDOW_REDUCE: _window_reduce,
    Prim.RESHAPE: _reshape, Prim.SLICE: _slice, Prim.PAD: _pad,
    Prim.CONV: _conv, Prim.CONV_TRANSPOSE: _conv, Prim.OPAQUE: _opaque,
}
assert set(_EXPORTERS) == set(Prim), "every primitive needs an ONNX mapping"
