"""Test harness: one ONNX operator through frontend -> fission -> reference
interpreter, compared with onnxruntime on random inputs.

`check_op` also exports the primitive graph back to ONNX and runs it in
onnxruntime, so each rule tests the interpreter and the exporter too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph
from tessera.ir.onnx_export import to_onnx
from tessera.tolerance import rel_l2


def models_dir() -> Path:
    """../shared/models; on the device machine, where ../shared does not travel, carry/a or carry/gpu."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "models"
    carried = [Path(__file__).resolve().parents[1] / "carry" / s for s in ("a", "gpu")]
    return next((d for d in [shared, *carried] if d.is_dir()), shared)


class Const:
    """Marks an input of `check_op` as an initializer (constant) instead of a graph input."""

    def __init__(self, value: Any, dtype: Any = None) -> None:
        self.value = np.asarray(value, dtype=dtype)


def rand(*shape: int, seed: int | None = None, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def build_model(op_type: str, inputs: Mapping[str, Any], attrs: Mapping[str, Any] | None = None,
                n_outputs: int = 1, opset: int = 20, domain: str = "") -> onnx.ModelProto:
    """A one-node model. An input named "" or "__omit..." is an omitted optional input."""
    graph_inputs, inits, names = [], [], []
    for name, v in inputs.items():
        names.append(name)
        if name == "" or name.startswith("__omit"):
            names[-1] = ""
            continue
        if isinstance(v, Const):
            inits.append(numpy_helper.from_array(v.value, name))
        else:
            arr = np.asarray(v)
            graph_inputs.append(helper.make_tensor_value_info(
                name, DType.from_numpy(arr.dtype).to_onnx(), list(arr.shape)))
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}_0", domain=domain, **(attrs or {}))
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    # Output types come from ONNX shape inference: onnxruntime rejects undefined
    # output types and the checker rejects missing ones.
    g = helper.make_graph([node], "one_op", graph_inputs, [], initializer=inits)
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=opsets, ir_version=8))
    types = {vi.name: vi for vi in inferred.graph.value_info}
    for o in outs:
        vi = types.get(o)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            # ONNX cannot infer it (e.g. a function op): assume input 0's type;
            # tessera's own shape check reports a contradiction if that is wrong.
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(graph_inputs[0])
            vi.name = o
        g.output.append(vi)
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def check_op(op_type: str, inputs: Mapping[str, Any], attrs: Mapping[str, Any] | None = None,
             n_outputs: int = 1, opset: int = 20, tol: float = 1e-5,
             expect_prims: Sequence[str] | None = None, allow_opaque: bool = False) -> Graph:
    """Assert that tessera computes `op_type` like onnxruntime; return the primitive graph.

    `expect_prims`, if given, lists primitive ops that must appear in the graph.
    Unless `allow_opaque`, the primitive graph must contain no OPAQUE node.
    """
    model = build_model(op_type, inputs, attrs, n_outputs, opset)
    feeds = {k: np.asarray(v) for k, v in inputs.items()
             if k and not k.startswith("__omit") and not isinstance(v, Const)}
    ref = run_ort(model, feeds)
    pg = fission(load(model).graph).graph
    if not allow_opaque:
        assert all(n.op != "opaque" for n in pg.nodes), f"{op_type} became opaque"
    if expect_prims:
        present = {n.op for n in pg.nodes}
        assert set(expect_prims) <= present, f"missing {set(expect_prims) - present} in {present}"
    got = interp.run(pg, feeds)
    exported = run_ort(to_onnx(pg), feeds)
    for i, r in enumerate(ref):
        out = got[pg.outputs[i]]
        assert out.shape == r.shape, f"output {i}: shape {out.shape} != {r.shape}"
        assert out.dtype == r.dtype, f"output {i}: dtype {out.dtype} != {r.dtype}"
        err = rel_l2(out, r)
        assert err < tol, f"output {i}: interpreter rel L2 {err:.3g} >= {tol}"
        err = rel_l2(exported[i], r)
        assert err < tol, f"output {i}: exported primitive graph rel L2 {err:.3g} >= {tol}"
    return pg


def graph_model(nodes: list, inputs: dict, outputs: list[str], opset: int = 20) -> onnx.ModelProto:
    """A model of several nodes; output types come from ONNX shape inference."""
    gi, inits = [], []
    for name, v in inputs.items():
        if isinstance(v, Const):
            inits.append(numpy_helper.from_array(v.value, name))
        else:
            gi.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
    g = helper.make_graph(nodes, "g", gi, [], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(m).graph.value_info}
    m.graph.output.extend(inferred[o] for o in outputs)
    return m
