"""Constant folding and static type inference over an operator graph.

One forward pass in topological order. A node whose inputs are all constants
is evaluated (onnx's reference implementation, onnxruntime as a second
chance) and becomes a constant; Shape and Size fold from static types. Every
other node gets its output types from its fission rule, run on a scratch
graph (so shapes and semantics share one definition); a node without a rule
gets them from ONNX shape inference, or failing that from running it once in
onnxruntime on random inputs.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tessera.errors import ShapeError, UnsupportedError, node_ref
from tessera.frontend.fold_bn import fold_batch_norms
from tessera.ir import aten_call
from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ir.onnx_export import make_onnx_node
from tessera.ops.registry import Unsupported, lower_node

# Ops whose value is not a function of their inputs; never folded.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"}


@dataclass
class FoldSummary:
    """What constant folding did, for `tessera inspect`."""

    folded_nodes: Counter = field(default_factory=Counter)  # op type -> nodes folded
    dead_nodes: int = 0
    constants: int = 0
    constant_bytes: int = 0
    # Declared shapes that disagree with what the inputs give. onnxruntime (the
    # reference) and ONNX shape inference differ on a few rounding cases (Resize
    # scales, ceil_mode pooling), so a stale declaration is reported, not fatal.
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"folded_nodes": dict(sorted(self.folded_nodes.items())),
                "folded_total": sum(self.folded_nodes.values()), "dead_nodes_removed": self.dead_nodes,
                "constants": self.constants, "constant_bytes": self.constant_bytes, "warnings": list(self.warnings)}


def _one_node_model(node: Node, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType | None],
                    opsets: Mapping[str, int], consts: Mapping[int, np.ndarray] | None = None) -> onnx.ModelProto:
    ins = [f"in{i}" if t is not None else "" for i, t in enumerate(in_types)]
    outs = [f"out{i}" for i in range(len(out_types))]
    consts = consts or {}
    g_in = [helper.make_tensor_value_info(ins[i], t.dtype.to_onnx(), list(t.shape))
            for i, t in enumerate(in_types) if t is not None and i not in consts]
    g_out = [helper.make_tensor_value_info(outs[i], t.dtype.to_onnx() if t else 0, list(t.shape) if t else None)
             for i, t in enumerate(out_types)]
    inits = [numpy_helper.from_array(np.asarray(v), ins[i]) for i, v in consts.items()]
    proto = make_onnx_node(node.op, ins, outs, node.attrs, domain=node.domain,
                           opset=opsets.get(node.domain, 1), name=node.name)
    g = helper.make_graph([proto], "node", g_in, g_out, initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = min(model.ir_version, 10)
    return model


def evaluate(node: Node, values: Sequence[np.ndarray | None], opsets: Mapping[str, int]) -> list[np.ndarray] | None:
    """Run one node on constant inputs; None if neither evaluator can."""
    in_types = [None if v is None else TensorType(v.shape, DType.from_numpy(v.dtype)) for v in values]
    model = _one_node_model(node, in_types, [None] * len(node.outputs), opsets,
                            {i: v for i, v in enumerate(values) if v is not None})
    try:
        # the values ONNX defines, silently: T5's relative position buckets take log(0) = -inf (and
        # cast it to an integer) in lanes that a later Where drops; NumPy would warn the user twice
        with np.errstate(all="ignore"):
            outs = ReferenceEvaluator(model).run(None, {})
        return [np.asarray(o) for o in outs]
    except Exception:  # noqa: BLE001 - any failure means "try the next evaluator"
        pass
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [np.asarray(o) for o in sess.run(None, {})]
    except Exception:  # noqa: BLE001
        return None


def rule_types(node: Node, graph: Graph) -> list[TensorType] | None:
    """Output types from the node's fission rule on a scratch graph; None if it has
    no rule or the rule does not lower this case."""
    scratch = Graph(name="scratch", kind=GraphKind.PRIMITIVE, opsets=dict(graph.opsets))
    for i in node.inputs:
        if i:
            scratch.types[i] = graph.types[i]
            if i in graph.constants:
                scratch.constants[i] = graph.constants[i]
    try:
        outs = lower_node(PrimBuilder(scratch), node, graph.opset)
    except Unsupported:
        return None
    return [scratch.types[o] for o in outs]


def onnx_types(node: Node, graph: Graph) -> list[TensorType] | None:
    """Output types by ONNX shape inference, or by one run in onnxruntime. An ATen call (from the
    PyTorch frontend) carries its output types."""
    if node.domain == aten_call.ATEN_DOMAIN:
        return _aten_types(node)
    in_types = [graph.types[i] if i else None for i in node.inputs]
    consts = {k: graph.constants[i] for k, i in enumerate(node.inputs) if i in graph.constants}
    model = _one_node_model(node, in_types, [None] * len(node.outputs), graph.opsets, consts)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        types = []
        for vi in inferred.graph.output:
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if not tt.HasField("shape") or None in dims:
                raise ValueError("incomplete")
            types.append(TensorType(tuple(dims), DType.from_onnx(tt.elem_type)))
        return types
    except Exception:  # noqa: BLE001 - fall through to a probe run
        pass
    rng = np.random.default_rng(0)
    feeds = {f"in{k}": _probe(t, rng) for k, t in enumerate(in_types) if t is not None and k not in consts}
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [TensorType(tuple(o.shape), DType.from_numpy(o.dtype)) for o in sess.run(None, feeds)]
    except Exception:  # noqa: BLE001
        return None


def _aten_types(node: Node) -> list[TensorType] | None:
    """The output types the PyTorch frontend recorded with the call (`out_types`: the values it
    computed while tracing; a meta kernel can differ, or be missing, as for cuDNN attention)."""
    if "out_types" not in node.attrs:
        return None
    return [TensorType(tuple(shape), DType(dt)) for shape, dt in json.loads(node.attrs["out_types"])]


def _probe(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    if t.dtype.is_float:
        return rng.standard_normal(t.shape).astype(t.dtype.to_numpy())
    if t.dtype is DType.BOOL:
        return rng.integers(0, 2, t.shape).astype(bool)
    return rng.integers(0, 2, t.shape).astype(t.dtype.to_numpy())


def _shape_node(node: Node, t: TensorType) -> np.ndarray:
    shape = np.array(t.shape, dtype=np.int64)
    if node.op == "Size":
        return np.array(t.numel, dtype=np.int64)
    r = len(shape)
    start = int(node.attrs.get("start", 0))
    end = int(node.attrs.get("end", r))
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return shape[start:end]


def fold_and_infer(graph: Graph, declared: Mapping[str, list], label: str, check_declared: bool) -> FoldSummary:
    """Fold constants and give every tensor a static type, in place."""
    summary = FoldSummary()
    keep: list[Node] = []
    for node in graph.topological_order():
        ins = [i for i in node.inputs if i]
        if node.domain == "" and node.op in ("Shape", "Size") and ins and ins[0] in graph.types:
            _set_constants(graph, node, [_shape_node(node, graph.types[ins[0]])])
            summary.folded_nodes[node.op] += 1
            continue
        if all(i in graph.constants for i in ins) and node.op not in _NONDETERMINISTIC and not _has_subgraph(node):
            values = evaluate(node, [graph.constants[i] if i else None for i in node.inputs], graph.opsets)
            if values is not None:
                _set_constants(graph, node, values)
                summary.folded_nodes[node.op] += 1
                continue
        types = rule_types(node, graph)
        if types is None:
            types = onnx_types(node, graph)
        if types is None:
            raise UnsupportedError(
                f"{label}: {node_ref(node.name, node.op)}{' in domain ' + node.domain if node.domain else ''}: "
                "tessera has no rule for it, and neither ONNX shape inference nor onnxruntime can run it, "
                "so its output shapes are unknown")
        for o, t in zip([o for o in node.outputs if o], types):
            if check_declared:
                warning = _check_declared(o, t, declared.get(o), node)
                if warning:
                    summary.warnings.append(warning)
            graph.types[o] = t
        keep.append(node)
    graph.nodes = keep
    for o in graph.outputs:
        if o not in graph.types:
            raise ShapeError(f"{label}: graph output '{o}' has no type")
    folded = fold_batch_norms(graph)  # what torch.onnx.export does; dynamo's graphs keep them
    if folded:
        summary.folded_nodes["BatchNormalization into Conv"] += folded
    summary.dead_nodes = graph.remove_dead()  # also the weights the folds replaced
    summary.constants = len(graph.constants)
    summary.constant_bytes = int(sum(v.nbytes for v in graph.constants.values()))
    return summary


def _has_subgraph(node: Node) -> bool:
    return any(isinstance(v, onnx.GraphProto) for v in node.attrs.values())


def _set_constants(graph: Graph, node: Node, values: Sequence[np.ndarray]) -> None:
    for o, v in zip(node.outputs, values):
        if o:
            v = np.asarray(v)
            graph.constants[o] = v
            graph.types[o] = TensorType(tuple(int(d) for d in v.shape), DType.from_numpy(v.dtype))


def _check_declared(name: str, t: TensorType, dims: list | None, node: Node) -> str | None:
    """A message if the model declares a static shape for `name` other than `t`'s."""
    if dims is None or dims == [None] or not all(isinstance(d, int) for d in dims):
        return None
    if tuple(dims) != t.shape:
        return (f"{node_ref(node.name, node.op)}: output '{name}' is declared {list(dims)} in the model, "
                f"but its inputs give {list(t.shape)} (as onnxruntime computes it); using {list(t.shape)}")
    return None
