"""Verification against onnxruntime: the model vs what a tessera stage computes.

`verify(model, stage="fission", precision=P)` runs the original model in onnxruntime and the
primitive graph in the reference interpreter at precision P on the same fresh random inputs,
and reports the relative L2 error of every output against P's tolerance. What runs at each P
(`ARITHMETIC`):
- fp32: the primitive graph in float64 (the exact reference; float32's rounding is far below
  the fp32 tolerance);
- tf32: float64, with the operands of every conv and matmul rounded to TF32 (10 mantissa bits),
  as tensor cores read them;
- fp16: the graph after the precision pass (`rewrite/precision.py`), every tensor it stores in
  float16 held in float16 (sums and products accumulate in float32). That rounds every
  intermediate value, where a compiled kernel keeps the values inside it in float32: it is
  the precision's floor for this model, stricter than any plan;
- bf16: likewise in bfloat16 (values computed in float32, every stored tensor rounded).

`verify_kernels(exe, feeds)` checks a compiled executable kernel by kernel (`tessera verify
ARTIFACT --per-kernel`): every kernel's outputs against the float64 reference interpreter's
values of the same tensors, in plan order, naming the first kernel that diverges.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from tessera.errors import TesseraError
from tessera.fission import OpaqueOp, fission
from tessera.frontend import LoadedModel, load
from tessera.ir import aten_call, interp, interp_linear
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.indices import index_bounds
from tessera.ir.onnx_export import to_onnx
from tessera.ir.prims import Prim
from tessera.log import logger
from tessera.rewrite import convert_precision
from tessera.tolerance import TOLERANCE, passes, rel_l2, weak_reference

if TYPE_CHECKING:
    from tessera.runtime.executable import Executable

STAGES = ("frontend", "fission", "rewrites")

# What the reference interpreter computes at each --precision (see the module doc).
ARITHMETIC = {
    "fp32": "float64 (exact reference)",
    "tf32": "float64, conv/matmul operands rounded to TF32",
    "fp16": "float16 storage after the precision pass: every stored tensor rounded to float16",
    "bf16": "bfloat16 storage after the precision pass: every stored tensor rounded to bfloat16",
}

# Ops through which an integer tensor keeps its meaning as an index.
@dataclass
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    rel_l2: float
    passed: bool
    note: str = ""  # why the check shows little (`tolerance.weak_reference`), or ""


@dataclass
class VerifyReport:
    model: str
    stage: str
    precision: str
    seed: int
    outputs: list[OutputCheck] = field(default_factory=list)
    opaque: list[OpaqueOp] = field(default_factory=list)
    seconds: float = 0.0
    arithmetic: str = ""  # what computed the stage's outputs

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "stage": self.stage, "precision": self.precision, "seed": self.seed,
                "arithmetic": self.arithmetic,
                "tolerance": TOLERANCE[self.precision], "passed": self.passed, "seconds": round(self.seconds, 3),
                "outputs": [{"name": o.name, "shape": list(o.shape), "rel_l2": o.rel_l2, "passed": o.passed,
                             **({"note": o.note} if o.note else {})} for o in self.outputs],
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


def rewritten(graph: Graph, precision: str) -> Graph:
    """`graph` after the rewrite search of a compile with `--rewrites on`, analytical cost."""
    from tessera.compiler import CompileOptions, preset_device, window_cost
    from tessera.rewrite.search import search

    opt = CompileOptions(cost="analytical", precision=precision, rewrites="on")
    return search(graph, window_cost(opt, "analytical", preset_device(opt.gpu), None, None)).graph


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference: the model as-is in onnxruntime's CPU provider, graph optimizations off. A
    model from the PyTorch frontend that keeps ATen calls whole (which onnxruntime cannot run)
    runs in onnx's reference evaluator instead, the ATen calls in torch."""
    if any(n.domain == aten_call.ATEN_DOMAIN for n in model.graph.node):
        return _run_reference_evaluator(model, feeds)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
            older = _older_ir(model, str(e))
            if older is None:
                raise
            sess = ort.InferenceSession(older.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        raise TesseraError(f"onnxruntime cannot load the model to produce a reference: {e}") from None
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, dict(feeds))))


def _older_ir(model: onnx.ModelProto, error: str) -> onnx.ModelProto | None:
    """`model` stamped with the IR version that onnxruntime names as its newest, where it refused a newer
    one: a model saved by an onnx newer than the onnxruntime installed beside it (the GPU machine's
    onnx writes IR 14, its onnxruntime reads 13). Operators are versioned by the opsets, which
    onnxruntime still checks, so only the stamp changes. None for any other error."""
    found = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", error)
    if found is None or int(found[1]) != model.ir_version:
        return None
    older = onnx.ModelProto()
    older.CopyFrom(model)
    older.ir_version = int(found[2])
    logger.info("onnxruntime reads IR versions up to %s; the reference runs the model (IR %s) stamped so",
                found[2], found[1])
    return older


def _run_reference_evaluator(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    def aten_op(op_type: str) -> type:
        def _run(self: OpRun, *inputs: np.ndarray, call: str = "", out_types: str = "") -> tuple[np.ndarray, ...]:
            outs = aten_call.run(op_type, call, [torch.from_numpy(np.array(x)) for x in inputs])
            return tuple(o.detach().cpu().numpy() for o in outs)
        return type(op_type, (OpRun,), {"op_domain": aten_call.ATEN_DOMAIN, "_run": _run})

    ops = sorted({n.op_type for n in model.graph.node if n.domain == aten_call.ATEN_DOMAIN})
    try:
        sess = ReferenceEvaluator(model, new_ops=[aten_op(o) for o in ops])
        outs = sess.run(None, dict(feeds))
    except Exception as e:  # noqa: BLE001 - the evaluator raises its own exception types
        raise TesseraError(f"onnx's reference evaluator cannot run the model to produce a reference: {e}") from None
    return {o.name: np.asarray(v) for o, v in zip(model.graph.output, outs)}


def verify(source: Any, stage: str = "fission", input_shapes: Mapping[str, Sequence[int]] | None = None,
           seed: int | None = None, precision: str = "fp32") -> VerifyReport:
    """Compare one stage's output with onnxruntime on fresh random inputs; the fission stage runs
    at `precision` (see the module doc), the frontend stage in onnxruntime (fp32 only)."""
    if stage not in STAGES:
        raise TesseraError(f"unknown stage '{stage}'; choose one of {', '.join(STAGES)}")
    if precision not in TOLERANCE:
        raise TesseraError(f"unknown precision '{precision}'; choose one of {', '.join(TOLERANCE)}")
    if stage == "frontend" and precision != "fp32":
        raise TesseraError(f"--precision {precision} runs the primitive graph at {precision} (--stage fission); "
                           "--stage frontend runs the operator graph in onnxruntime at the model's own dtypes")
    start = time.perf_counter()
    loaded = source if isinstance(source, LoadedModel) else load(source, input_shapes)
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    feeds = random_inputs(loaded.graph, seed)
    ref = run_onnxruntime(loaded.model, feeds)
    report = VerifyReport(model=loaded.label, stage=stage, precision=precision, seed=seed)
    if stage == "frontend":
        report.arithmetic = "onnxruntime (the folded operator graph)"
        got = run_onnxruntime(to_onnx(loaded.graph), feeds)
    else:
        result = fission(loaded.graph)
        report.opaque = result.opaque
        report.arithmetic = ARITHMETIC[precision]
        graph = result.graph
        if stage == "rewrites":  # the graph as the rewrite search leaves it, priced analytically
            graph = rewritten(graph, precision)
        got = run_at_precision(graph, feeds, precision)
    for name in loaded.graph.outputs:
        err = rel_l2(got[name], ref[name])
        report.outputs.append(OutputCheck(name, tuple(np.shape(ref[name])), err, passes(err, precision),
                                          weak_reference(ref[name])))
    report.seconds = time.perf_counter() - start
    return report


def run_at_precision(graph: Graph, feeds: Mapping[str, np.ndarray], precision: str,
                     keep_all: bool = False) -> dict[str, np.ndarray]:
    """The outputs of a primitive graph (before the precision pass) computed at `precision` by the
    reference interpreter, as `ARITHMETIC` says; with `keep_all`, every tensor's value."""
    if precision == "fp32":
        return interp.run(graph, feeds, exact=True, keep_all=keep_all)
    if precision == "tf32":
        with _tf32_operands():
            return interp.run(graph, feeds, exact=True, keep_all=keep_all)
    narrow = convert_precision(graph, precision)
    if precision == "bf16":
        narrow = _round_bf16_storage(narrow)
    return interp.run(narrow, feeds, exact=False, keep_all=keep_all)


def precision_floor(loaded: LoadedModel, feeds: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
                    precision: str) -> dict[str, float]:
    """Each output's error against `ref` when the reference interpreter runs the model storing every tensor
    at 16-bit `precision` (`run_at_precision`): what the precision itself costs this model. A plan keeps the
    values inside each kernel in float32, so a correct one is usually closer; where this floor exceeds the
    tolerance no plan can be trusted to meet it (twelve llama layers in bf16 on the H100: tessera 1.18e-2,
    eager PyTorch 1.25e-2, against 1e-2)."""
    got = run_at_precision(fission(loaded.graph).graph, feeds, precision)
    return {name: rel_l2(got[name], ref[name]) for name in loaded.graph.outputs}


def to_tf32(a: np.ndarray) -> np.ndarray:
    """Values rounded to TF32 (float32 with 10 mantissa bits; to nearest, ties away), as float64."""
    b = np.asarray(a, np.float32).copy().view(np.uint32)
    b += np.uint32(0x1000)
    b &= np.uint32(0xFFFFE000)
    return b.view(np.float32).astype(np.float64)


_LINEAR_SWAP = threading.Lock()


@contextlib.contextmanager
def _tf32_operands() -> Iterator[None]:
    """The interpreter's conv and matmul kernels read their operands rounded to TF32 (one caller
    at a time: the kernels are module functions)."""
    conv, conv_t, matmul = interp_linear.conv, interp_linear.conv_transpose, interp_linear.matmul
    with _LINEAR_SWAP:
        interp_linear.conv = lambda x, w, *a: conv(to_tf32(x), to_tf32(w), *a)
        interp_linear.conv_transpose = lambda x, w, *a: conv_t(to_tf32(x), to_tf32(w), *a)
        interp_linear.matmul = lambda x, w: matmul(to_tf32(x), to_tf32(w))
        try:
            yield
        finally:
            interp_linear.conv, interp_linear.conv_transpose, interp_linear.matmul = conv, conv_t, matmul


def _round_bf16_storage(graph: Graph) -> Graph:
    """The interpreter holds bfloat16 tensors in float32 and rounds only at a CAST: give every
    node that writes a bfloat16 tensor a rounding CAST after it, and round the constants, so each
    stored value is one bfloat16 can hold (as in the executable's memory)."""
    g = graph.clone()
    bf16 = DType.BFLOAT16
    g.constants = {t: (v.astype(ml_dtypes.bfloat16).astype(np.float32) if g.types[t].dtype is bf16 else v)
                   for t, v in g.constants.items()}
    nodes: list[Node] = []
    for n in graph.nodes:
        rounds = n.op == Prim.CAST.value and n.attrs.get("dtype") == bf16.value
        raw = {t: f"{t}/unrounded" for t in n.outputs if t and not rounds and g.types[t].dtype is bf16}
        nodes.append(Node(n.name, n.op, n.inputs, tuple(raw.get(t, t) for t in n.outputs), n.attrs, n.domain,
                          n.source))
        for t, r in raw.items():
            g.types[r] = g.types[t]
            nodes.append(Node(f"{n.name}/round_bf16/{t}", Prim.CAST.value, (r,), (t,), {"dtype": bf16.value},
                              source=n.source))
    g.nodes = nodes
    return g


# ---- kernel by kernel (`tessera verify ARTIFACT --per-kernel`) ------------------------------
@dataclass
class TensorCheck:
    name: str
    rel_l2: float
    passed: bool


@dataclass
class KernelCheck:
    index: int
    name: str
    backend: str
    prims: list[str]
    source_nodes: list[str]
    tensors: list[TensorCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors)

    @property
    def worst(self) -> TensorCheck | None:
        """The output furthest from the reference (a failing one first)."""
        if not self.tensors:
            return None
        return max(self.tensors, key=lambda t: (not t.passed, t.rel_l2 if np.isfinite(t.rel_l2) else np.inf))


@dataclass
class KernelReport:
    model: str
    precision: str
    seed: int | None
    propagate: bool
    device: str
    kernels: list[KernelCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(k.passed for k in self.kernels)

    @property
    def first_failure(self) -> KernelCheck | None:
        return next((k for k in self.kernels if not k.passed), None)

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.precision]

    @property
    def mode(self) -> str:
        return "propagated" if self.propagate else "isolated"

    def as_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {"model": self.model, "precision": self.precision, "seed": self.seed, "mode": self.mode,
                "device": self.device, "tolerance": self.tolerance, "passed": self.passed,
                "seconds": round(self.seconds, 3),
                "first_failure": None if first is None else first.name,
                "kernels": [{"index": k.index, "name": k.name, "backend": k.backend, "prims": k.prims,
                             "source_nodes": k.source_nodes, "passed": k.passed,
                             "max_rel_l2": None if k.worst is None else k.worst.rel_l2,
                             "tensors": [{"name": t.name, "rel_l2": t.rel_l2, "passed": t.passed}
                                         for t in k.tensors]} for k in self.kernels]}


def _host(x: Any) -> np.ndarray:
    """A torch tensor as a NumPy array (floats in float64) that owns its memory."""
    import torch

    x = x.detach()
    if x.dtype.is_floating_point:
        return x.to("cpu", torch.float64).numpy()
    return x.cpu().numpy().copy()


def verify_kernels(exe: "Executable", feeds: Mapping[str, np.ndarray], precision: str | None = None,
                   propagate: bool = False, model: str = "", seed: int | None = None) -> KernelReport:
    """Run `exe` kernel by kernel in plan order and compare every kernel's outputs with the float64
    reference interpreter's values of the same tensors (`exe.graph`, the primitive graph the plan
    was made for, precision casts and storage layouts included).

    Isolated (the default): each kernel reads the reference's values of its inputs, stored in the
    dtypes and layouts the plan gives them, so only a kernel that computes wrongly diverges.
    Propagated: each kernel reads what the executable's earlier kernels wrote, as in a run, so
    errors accumulate as they would. Tolerance: the plan's precision, as `run --check` applies it.
    """
    import torch

    from tessera.runtime.buffers import as_layout
    from tessera.runtime.torch_prims import TORCH_DTYPES

    start = time.perf_counter()
    precision = precision or exe.plan.get("precision", "fp32")
    graph = exe.graph
    ref = interp.run(graph, feeds, exact=True, keep_all=True)

    def stored(t: str, v: np.ndarray) -> torch.Tensor:
        ty = graph.types[t]
        x = torch.from_numpy(np.asarray(v, order="C")).to(exe.device, TORCH_DTYPES[ty.dtype])
        return as_layout(x, ty.layout)

    report = KernelReport(model=model, precision=precision, seed=seed, propagate=propagate, device=str(exe.device))
    plan_kernels = {k["name"]: k for k in exe.plan["kernels"]}
    env: dict[str, torch.Tensor] = {**exe.constants, **{t: stored(t, np.asarray(feeds[t])) for t in graph.inputs}}
    with exe.precision_flags():
        for i, step in enumerate(exe.steps):
            impl = step.impl
            if not propagate:  # the reference's inputs: only this kernel's own error shows
                env = dict(exe.constants)
                for t in exe.reads(step):
                    if t not in env:
                        env[t] = stored(t, ref[t])
            exe.run_step(step, env)
            k = plan_kernels.get(impl.name, {})
            check = KernelCheck(i, impl.name, impl.backend, [n.name for n in impl.prims],
                                list(k.get("source_nodes", [])))
            for t in impl.outputs:
                err = rel_l2(_host(env[t]), ref[t])
                check.tensors.append(TensorCheck(t, err, passes(err, precision)))
            report.kernels.append(check)
            if propagate:
                for t in exe.free_after[i]:
                    env.pop(t, None)
    report.seconds = time.perf_counter() - start
    return report
