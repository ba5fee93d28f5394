"""OPAQUE primitives in the reference interpreter: the original ONNX operator,
run by onnxruntime as a one-node model.

The node's attrs say what to run (op_type, domain, opset, onnx_attrs); the
graph's types give the model its input and output types. bfloat16 has no NumPy
type, so a bfloat16 input is fed as float32 and cast inside the model (and a
bfloat16 output cast back to float32). Sessions are cached by the serialized
model, so running a graph again, or another node with the same signature,
builds no new session.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tessera.errors import UnsupportedError, node_ref
from tessera.ir import aten_call
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType
from tessera.ir.onnx_export import ir_version_for, make_onnx_node, opaque_onnx_attrs

_CACHE_SIZE = 256
_F32 = "/as_float32"  # suffix of the float32 twin of a bfloat16 tensor
_sessions: "OrderedDict[bytes, ort.InferenceSession]" = OrderedDict()


def run_opaque(graph: Graph, node: Node, args: Sequence[np.ndarray], in_types: Sequence[TensorType],
               exact: bool) -> list[np.ndarray]:
    """Outputs of OPAQUE `node` on `args` (its non-omitted inputs, in order).

    In exact mode the float inputs are rounded to their declared types for
    onnxruntime, and its float outputs widened back to float64.
    """
    present = [t for t in node.inputs if t]
    out_types = [graph.types[o] for o in node.outputs if o]
    if node.attrs.get("domain") == aten_call.ATEN_DOMAIN:
        return _run_aten(node, args, in_types, out_types, exact)
    sess = _session(graph, node, in_types, out_types)
    feeds = {}
    for name, value, t in zip(present, args, in_types):
        if t.dtype is DType.BFLOAT16:  # fed as float32, cast inside the model
            feeds[name + _F32] = np.asarray(value, dtype=np.float32, order="C")
        else:
            feeds[name] = np.asarray(value, dtype=t.dtype.to_numpy(), order="C")
    outs = sess.run(None, feeds)
    result = []
    for o, t in zip(outs, out_types):
        o = np.asarray(o)
        if exact and t.dtype.is_float:
            o = o.astype(np.float64)
        result.append(o)
    return result


def _run_aten(node: Node, args: Sequence[np.ndarray], in_types: Sequence[TensorType],
              out_types: Sequence[TensorType], exact: bool) -> list[np.ndarray]:
    """An ATen call kept whole (ir/aten_call.py), run by torch on the CPU in the declared types."""
    import torch

    ins = [torch.from_numpy(np.array(a, dtype=np.float32 if t.dtype is DType.BFLOAT16 else t.dtype.to_numpy(),
                                     order="C", copy=True)).to(aten_call.torch_dtype(t.dtype))
           for a, t in zip(args, in_types)]
    outs = aten_call.run(str(node.attrs["op_type"]), node.attrs["onnx_attrs"]["call"], ins)
    result = []
    for o, t in zip(outs, out_types):
        o = o.detach().cpu()
        o = o.float() if o.dtype == torch.bfloat16 else o
        arr = o.numpy()
        result.append(arr.astype(np.float64) if exact and t.dtype.is_float else arr)
    return result


def _session(graph: Graph, node: Node, in_types: Sequence[TensorType],
             out_types: Sequence[TensorType]) -> ort.InferenceSession:
    model = _one_node_model(graph, node, in_types, out_types)
    key = model.SerializeToString()
    sess = _sessions.get(key)
    if sess is not None:
        _sessions.move_to_end(key)
        return sess
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(key, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        raise UnsupportedError(f"{node_ref(node.name, str(node.attrs.get('op_type')))}: "
                               f"onnxruntime cannot run this opaque operator: {e}") from None
    _sessions[key] = sess
    if len(_sessions) > _CACHE_SIZE:
        _sessions.popitem(last=False)
    return sess


def _one_node_model(graph: Graph, node: Node, in_types: Sequence[TensorType],
                    out_types: Sequence[TensorType]) -> onnx.ModelProto:
    a = node.attrs
    op_type, domain, opset = a["op_type"], a.get("domain", "") or "", int(a["opset"])
    nodes, g_in, g_out = [], [], []
    inputs = list(node.inputs)
    typed = dict(zip([t for t in node.inputs if t], in_types))
    for name, t in typed.items():  # dict: an input read twice is declared once
        if t.dtype is DType.BFLOAT16:
            g_in.append(helper.make_tensor_value_info(name + _F32, TensorProto.FLOAT, t.shape))
            nodes.append(helper.make_node("Cast", [name + _F32], [name], to=TensorProto.BFLOAT16))
        else:
            g_in.append(helper.make_tensor_value_info(name, t.dtype.to_onnx(), t.shape))
    outputs = list(node.outputs)
    casts = []
    for name, t in zip([o for o in outputs if o], out_types):
        if t.dtype is DType.BFLOAT16:
            g_out.append(helper.make_tensor_value_info(name + _F32, TensorProto.FLOAT, t.shape))
            casts.append(helper.make_node("Cast", [name], [name + _F32], to=TensorProto.FLOAT))
        else:
            g_out.append(helper.make_tensor_value_info(name, t.dtype.to_onnx(), t.shape))
    nodes.append(make_onnx_node(op_type, inputs, outputs, opaque_onnx_attrs(a),
                                domain=domain, opset=opset, name="opaque"))
    nodes.extend(casts)
    opsets = {"": opset}
    if domain and domain not in ("", "ai.onnx"):
        opsets[domain] = graph.opsets.get(domain, 1)
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    g = helper.make_graph(nodes, "opaque", g_in, g_out)
    return helper.make_model(g, opset_imports=imports, ir_version=ir_version_for(imports))
