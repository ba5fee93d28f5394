"""Verification against onnxruntime: the model vs what a tessera stage computes.

`verify(model, stage="fission")` runs the original model in onnxruntime and the
primitive graph in the float64 reference interpreter on the same fresh random
inputs, and reports the relative L2 error of every output.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from tessera.errors import TesseraError
from tessera.fission import OpaqueOp, fission
from tessera.frontend import LoadedModel, load
from tessera.ir import interp
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph
from tessera.ir.indices import index_bounds
from tessera.ir.onnx_export import to_onnx
from tessera.tolerance import TOLERANCE, passes, rel_l2

STAGES = ("frontend", "fission")

# Ops through which an integer tensor keeps its meaning as an index.
@dataclass
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    rel_l2: float
    passed: bool


@dataclass
class VerifyReport:
    model: str
    stage: str
    precision: str
    seed: int
    outputs: list[OutputCheck] = field(default_factory=list)
    opaque: list[OpaqueOp] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "stage": self.stage, "precision": self.precision, "seed": self.seed,
                "tolerance": TOLERANCE[self.precision], "passed": self.passed, "seconds": round(self.seconds, 3),
                "outputs": [{"name": o.name, "shape": list(o.shape), "rel_l2": o.rel_l2, "passed": o.passed}
                            for o in self.outputs],
                "opaque": [{"node": o.node, "op": o.op_type, "reason": o.reason} for o in self.opaque]}


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Fresh random inputs: floats ~ N(0, 1); integers in their valid index range, else {0, 1}."""
    rng = np.random.default_rng(seed)
    bounds = index_bounds(graph)
    feeds = {}
    for name in graph.inputs:
        t = graph.types[name]
        if t.dtype.is_float:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype.to_numpy())
        elif t.dtype is DType.BOOL:
            feeds[name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            feeds[name] = rng.integers(0, bounds.get(name, 2), t.shape).astype(t.dtype.to_numpy())
    return feeds


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference: the model as-is in onnxruntime's CPU provider, graph optimizations off."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise TesseraError(f"onnxruntime cannot load the model to produce a reference: {e}") from None
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, dict(feeds))))


def verify(source: Any, stage: str = "fission", input_shapes: Mapping[str, Sequence[int]] | None = None,
           seed: int | None = None, precision: str = "fp32") -> VerifyReport:
    """Compare one stage's output with onnxruntime on fresh random inputs."""
    if stage not in STAGES:
        raise TesseraError(f"unknown stage '{stage}'; choose one of {', '.join(STAGES)}")
    start = time.perf_counter()
    loaded = source if isinstance(source, LoadedModel) else load(source, input_shapes)
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    feeds = random_inputs(loaded.graph, seed)
    ref = run_onnxruntime(loaded.model, feeds)
    report = VerifyReport(model=loaded.label, stage=stage, precision=precision, seed=seed)
    if stage == "frontend":
        got = run_onnxruntime(to_onnx(loaded.graph), feeds)
    else:
        result = fission(loaded.graph)
        report.opaque = result.opaque
        got = interp.run(result.graph, feeds, exact=True)
    for name in loaded.graph.outputs:
        err = rel_l2(got[name], ref[name])
        report.outputs.append(OutputCheck(name, tuple(np.shape(ref[name])), err, passes(err, precision)))
    report.seconds = time.perf_counter() - start
    return report
