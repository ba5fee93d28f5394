"""The fuzzer's oracle: a `GraphSpec` as an ONNX model, compiled by tessera, judged against onnxruntime.

`check(spec)` returns an `Outcome`:
- **pass**: every output has onnxruntime's shape and dtype, and its relative L2 error is under
  the precision's tolerance (`tessera/tolerance.py`).
- **crash**: tessera raised while compiling, building or running a valid graph. Always a bug.
- **mismatch**: an output is wrong and the precision does not explain it. A bug.
- **skip** (counted by reason): an output missed the tolerance, but any compiler in this
  precision could miss it. The graph still compiled and ran (crashes are never skipped).

The reference and the honest oracle for fp16/bf16. tessera stores graph inputs and float
constants in the narrow type, so the reference is onnxruntime on the same graph with its inputs
and float constants rounded to the precision (computing in float32). An output that misses the
tolerance is then held against an *emulated* run: the same graph with every float intermediate
rounded to the precision (a Cast there and back after each node; under fp32, a relative noise
of 2**-21 per element instead). That emulation is an independent fp16/bf16/fp32 executor. If
tessera's error is within `FLOOR_FACTOR` times the emulation's, the graph sits on the precision's
floor: its intermediates leave fp16's range ("fp16-range"), or its output cancels ("precision-floor").
A discontinuous op (comparison, cast to an integer, Floor, ArgMax) whose operands lie within
rounding of a tie explains a flipped element ("near-tie").

A graph onnxruntime rejects, or whose shapes disagree with ONNX shape inference or with
onnxruntime's results, raises `GeneratorError`: the generator is wrong, not tessera.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import math
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import ml_dtypes

import numpy as np
import onnx
import onnxruntime as ort
import torch
from fuzzspec import BF16, BOOL, FLOAT, HALF, GraphSpec
from onnx import TensorProto, helper

from tessera import compiler
from tessera.codegen.kernels import schedules
from tessera.compiler import CompileOptions, CompileResult, compile_model, generate_kernels, plan_document
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp, onnx_export
from tessera.ir.tables import table_form
from tessera.orchestrate import build_ograph
from tessera.orchestrate.candidates import epilogue_view
from tessera.orchestrate.graphview import OGraph, bits
from tessera.orchestrate.layout import is_conversion
from tessera.runtime.executable import Executable
from tessera.tolerance import TOLERANCE, rel_l2

ONNX_TYPES = {FLOAT: TensorProto.FLOAT, HALF: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16,
              "int64": TensorProto.INT64, "int32": TensorProto.INT32, BOOL: TensorProto.BOOL}
NP_TYPES = {FLOAT: np.float32, HALF: np.float16, "int64": np.int64, "int32": np.int32, BOOL: np.bool_}
FLOOR_FACTOR = 4.0  # tessera's error within this many times the emulated executor's: the precision's floor
FP32_NOISE = 2.0 ** -21  # per-element relative noise of the fp32 emulation (a few float32 roundings)
TIE = {"fp32": 1e-5, "fp16": 2e-2, "bf16": 5e-2}  # relative gap to a discontinuity that a rounding can cross
FP16_MAX = 65504.0
# fp32: an error below this many tolerances may be onnxruntime's float32 rounding (an InstanceNorm over
# one element: x - mean is 0 exactly, onnxruntime gives 1e-5 relative); larger is never excused.
REFERENCE_SLACK = 30.0
ort.set_default_logger_severity(3)


class GeneratorError(Exception):
    """The generator drew an invalid graph (onnxruntime or ONNX shape inference disagree with it)."""


@dataclass
class Outcome:
    status: str  # pass, mismatch, crash, skip
    reason: str = ""  # crash: exception type and stage; mismatch: what differs; skip: why
    detail: str = ""
    err: float = 0.0
    floor: float | None = None
    opaque: list[tuple[str, str]] = field(default_factory=list)  # (op, reason) of ops run by the fallback
    forms: Counter = field(default_factory=Counter)  # kernel forms of the compiled plan
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)  # Triton's warnings while the kernels ran

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "crash")


# ---- the model -------------------------------------------------------------------------------
def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """float32 values rounded to fp16/bf16 (nearest even) and widened back; fp32 unchanged."""
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    return x


def const_values(spec: GraphSpec, precision: str | None = None) -> dict[str, np.ndarray]:
    """Every initializer's value; float data rounded to `precision` when given."""
    out = {}
    for i, c in enumerate(spec.consts):
        rng = np.random.default_rng([spec.seed, i])
        if c.values is not None:
            v = np.array(c.values, dtype=NP_TYPES[c.dtype]).reshape(c.shape)
        elif c.ints is not None:
            v = rng.integers(c.ints[0], c.ints[1], c.shape).astype(NP_TYPES[c.dtype])
        elif c.distinct is not None:  # along the axis, each column a distinct subset of range(extent)
            axis, extent = c.distinct
            moved = (c.shape[axis],) + tuple(s for k, s in enumerate(c.shape) if k != axis)
            cols = [rng.permutation(extent)[:moved[0]] for _ in range(math.prod(moved[1:]))]
            v = np.moveaxis(np.stack(cols, axis=-1).reshape(moved), 0, axis).astype(NP_TYPES[c.dtype])
        else:
            v = rng.standard_normal(c.shape).astype(np.float32) * np.float32(c.scale)
            if c.positive:
                v = np.abs(v) + np.float32(0.5)
            v = v.astype(NP_TYPES[c.dtype])
        if precision and c.data and c.dtype == FLOAT:
            v = round_to(v, precision)
        out[c.name] = v
    return out


def feeds(spec: GraphSpec) -> dict[str, np.ndarray]:
    """Fresh random inputs (never zeros): floats N(0, 1), integers in their range, booleans."""
    rng = np.random.default_rng([spec.seed, 1 << 20])
    out = {}
    for t in spec.inputs:
        if t.dtype in (FLOAT, HALF):
            out[t.name] = rng.standard_normal(t.shape).astype(NP_TYPES[t.dtype])
        elif t.dtype == BOOL:
            out[t.name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            lo, hi = spec.index_bounds.get(t.name, (-6, 6))
            out[t.name] = rng.integers(lo, hi, t.shape).astype(NP_TYPES[t.dtype])
    return out


def to_onnx(spec: GraphSpec, precision: str | None = None, emulate: str | None = None,
            expose: bool = False) -> onnx.ModelProto:
    """The model. `precision`: float data constants rounded to it. `emulate`: every float32 node
    output rounded to that precision (fp32: relative noise). `expose`: every tensor an output."""
    inputs = [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in spec.inputs]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in const_values(spec, precision).items()]
    nodes = []
    rng = np.random.default_rng([spec.seed, 1 << 21])
    for i, n in enumerate(spec.nodes):
        outs = list(n.outputs)
        tail = []
        if emulate:
            for j, o in enumerate(outs):
                shape, dt = spec.types[o]
                if dt != FLOAT:
                    continue
                raw = f"{o}__raw"
                outs[j] = raw
                if emulate == "fp32":
                    noise = 1 + FP32_NOISE * rng.uniform(-1, 1, shape).astype(np.float64)
                    inits.append(onnx.numpy_helper.from_array(noise.astype(np.float32), f"{o}__noise"))
                    tail.append(helper.make_node("Mul", [raw, f"{o}__noise"], [o]))
                else:
                    to = TensorProto.FLOAT16 if emulate == "fp16" else TensorProto.BFLOAT16
                    tail.append(helper.make_node("Cast", [raw], [f"{o}__half"], to=to))
                    tail.append(helper.make_node("Cast", [f"{o}__half"], [o], to=TensorProto.FLOAT))
        nodes.append(helper.make_node(n.op, n.inputs, outs, name=f"n{i}_{n.op}", **n.attrs))
        nodes.extend(tail)
    names = list(spec.outputs)
    if expose:
        names += [o for n in spec.nodes for o in n.outputs if o not in names and spec.types[o][1] != BF16]
    outputs = [helper.make_tensor_value_info(o, ONNX_TYPES[spec.types[o][1]], list(spec.types[o][0])) for o in names]
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", spec.opset)], ir_version=9)


def check_shapes(spec: GraphSpec, model: onnx.ModelProto) -> None:
    """The ONNX checker must accept the graph, and ONNX shape inference agree with the generator's
    shapes and dtypes."""
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001
        raise GeneratorError(f"the ONNX checker rejects the graph: {str(e).splitlines()[0][:300]}") from None
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - onnx raises several types
        raise GeneratorError(f"ONNX shape inference rejects the graph: {str(e).splitlines()[0][:300]}") from None
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name not in spec.types:
            continue
        shape, dt = spec.types[vi.name]
        tt = vi.type.tensor_type
        if tt.elem_type and tt.elem_type != ONNX_TYPES[dt]:
            raise GeneratorError(f"{vi.name}: ONNX infers element type {tt.elem_type}, the generator {dt}")
        if tt.HasField("shape"):
            dims = [x.dim_value if x.HasField("dim_value") else None for x in tt.shape.dim]
            if len(dims) != len(shape) or any(a is not None and a != b for a, b in zip(dims, shape)):
                raise GeneratorError(f"{vi.name}: ONNX infers shape {dims}, the generator {list(shape)}")


def run_ort(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, dict(inputs))))


def reference(spec: GraphSpec, x: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model as given and the reference outputs (on inputs and constants rounded to the precision)."""
    model = to_onnx(spec)
    check_shapes(spec, model)
    p = spec.precision
    try:
        ref = run_ort(to_onnx(spec, p) if p != "fp32" else model, rounded(x, p))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
        raise GeneratorError(f"onnxruntime rejects the graph: {str(e).splitlines()[0][:400]}") from None
    for o in spec.outputs:
        shape, dt = spec.types[o]
        if ref[o].shape != tuple(shape) or ref[o].dtype != NP_TYPES[dt]:
            raise GeneratorError(f"output {o}: onnxruntime gives {ref[o].dtype}{list(ref[o].shape)}, "
                                 f"the generator expects {dt}{list(shape)}")
    return model, ref


def rounded(x: Mapping[str, np.ndarray], precision: str) -> dict[str, np.ndarray]:
    return {k: round_to(v, precision) if v.dtype == np.float32 else v for k, v in x.items()}


# ---- compiling and running -----------------------------------------------------------------------
def options(spec: GraphSpec, tuning: str = "analytical", db: str | None = None) -> CompileOptions:
    # (the solver is the default: TESSERA_SOLVER=highs where a GPU machine carries only highspy's wheel)
    # "fake": a measured compile on the CPU, its profiler `RandomTemplateProfiler` (templates, operand
    # prologues, norms and GEMM chains join plans, which analytical compiles never form)
    return CompileOptions(cost="measured" if tuning == "fake" else tuning, db=db, precision=spec.precision, layout=spec.layout, strategy=spec.strategy,
                          rewrites=spec.rewrites, time_limit=20.0, tune_workers=1 if tuning == "measured" else None,
                          max_kernel_nodes=spec.kernel_nodes or CompileOptions.max_kernel_nodes)


def shared_profiler(tuning: str) -> Any:
    """Measured tuning: one profiler for the whole run, so its worker processes start once (a GPU
    compile of a one-kernel graph took 15-20 s on the H100, starting workers included), closed at exit."""
    if tuning == "fake":
        from fake_profiler import RandomTemplateProfiler

        return RandomTemplateProfiler()
    return _measured_profiler() if tuning == "measured" else None


@contextlib.contextmanager
def fake_gpu(tuning: str) -> Iterator[None]:
    """Under `--tuning fake`, a compile that believes a GPU is there (its kernels still run on the CPU)."""
    if tuning != "fake":
        yield
        return
    avail, name = torch.cuda.is_available, torch.cuda.get_device_name
    torch.cuda.is_available, torch.cuda.get_device_name = (lambda: True), (lambda *a: "fake-gpu")
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.get_device_name = avail, name


@functools.cache
def _measured_profiler() -> Any:
    prof = compiler.new_profiler(CompileOptions(cost="measured", tune_workers=1))
    atexit.register(prof.close)
    return prof


def pick_schedules(result: CompileResult, seed: int) -> None:
    """Every generated kernel at a random schedule of its space (seed 0: the defaults)."""
    if not seed:
        return
    rng = np.random.default_rng(seed)
    tuned = {}
    for impl in result.kernels:
        ks = impl.triton
        if ks is None or impl.backend == "template":  # templates keep their own (tuned or best-ranked)
            continue
        space = schedules(ks.xnumel, ks.rnumel, ks.tile, ks.strided)
        tuned[impl.name] = space[int(rng.integers(len(space)))]
    result.kernels = generate_kernels(result.graph, result.plan, tuned)


def _reads_through_view(og: OGraph, impl) -> bool:
    """Whether a linear kernel's epilogue reads a value from outside through a broadcast or reshape:
    a node of the kernel that is not computed from its product and that `candidates.epilogue_view`
    admits."""
    idx = {n.name: i for i, n in enumerate(og.nodes)}
    mask = sum(1 << idx[n.name] for n in impl.prims if n.name in idx)
    root = idx.get(impl.linear.name)
    return root is not None and any(epilogue_view(og, mask, root, i) for i in bits(mask) if i != root and not (og.anc[i] >> root) & 1)


def kernel_forms(result: CompileResult) -> Counter:
    """What the plan exercises: generated pointwise/reduction/tiled kernels, library linears,
    channels-last convolutions, padded channels, closed-form tables, views and fallbacks."""
    c: Counter = Counter()
    g = result.graph
    og = build_ograph(g) if any(impl.linear is not None for impl in result.kernels) else None
    for impl in result.kernels:
        c[f"backend:{impl.backend}"] += 1
        ks = impl.triton
        if ks is not None:  # the form the kernel's header names (codegen/kernels.py: generate)
            head = next((ln for ln in ks.source.splitlines() if ln.startswith("# tessera kernel")), "")
            if impl.backend == "template":  # its form, and a norm's statistics in its prologue (codegen/norm.py)
                c["template:" + ("chain" if "chain" in head else "conv" if "conv" in head else "gemm")] += 1
                c["template:chain:late"] += bool(getattr(ks.schedule, "late", False))  # ChainSchedule.late
                c["template:row_factor"] += "deferred" in ks.source
                c["template:row_statistic_loop"] += "  # " in ks.source and "for r" in ks.source
                c["template:column_slices"] += "read through its column slices" in ks.source  # codegen/gemm.py
                c["template:rotary"] += "tl.join(" in ks.source  # rotate_half in registers (codegen/rotary.py)
                c["template:rotary_pairs"] += "tl.join(" in ks.source and ") % 2 == 0" in ks.source  # rotate_every_two
            elif "row reduction" in head:
                c["reduction" + ("" if ks.schedule.persistent else ":looped") + (":strided" if ks.strided else "")] += 1
            elif "tiled pointwise" in head:
                c["tiled"] += 1
            else:
                c["pointwise"] += 1
            # constants computed from their position, not loaded (ir/tables.py)
            c["closed_tables"] += sum(1 for t in ks.inputs if table_form(g, t) is not None)
        if impl.linear is not None:
            op = impl.linear.op
            c[f"linear:{op}"] += 1
            c["linear:epilogue_view"] += _reads_through_view(og, impl)
            if not g.types[impl.linear.inputs[0]].plain:
                c[f"linear:{op}:channels_last"] += 1
            if impl.bias:
                c["linear:bias_in_call"] += 1
    if any(is_conversion(n) for n in g.nodes):
        c["layout_conversion"] += 1
    if result.layouts is not None:
        s = result.layouts.summary()
        c["channels_last_regions"] += int(s["channels_last_regions"])
        c["padded_channels"] += int(s["convs_padded"])
        c["split_reductions"] += int(s["split_reductions"])
    return c


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _crash(stage: str, e: BaseException) -> Outcome:
    tb = traceback.extract_tb(e.__traceback__)
    where = next((f"{f.filename.split('tessera/')[-1]}:{f.lineno}" for f in reversed(tb) if "/tessera/" in f.filename),
                 "")
    msg = str(e).splitlines()[0][:300] if str(e) else ""
    return Outcome("crash", f"{stage}: {type(e).__name__} at {where}", msg)


def complete_types(spec: GraphSpec) -> GraphSpec:
    """Fill `spec.types` from ONNX shape inference where it lacks a tensor (a spec written by hand,
    such as a regression test pasted from a shrunk failure's repr)."""
    names = [o for n in spec.nodes for o in n.outputs if o and o not in spec.types]
    if not names:
        return spec
    inputs = [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in spec.inputs]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in const_values(spec).items()]
    nodes = [helper.make_node(n.op, n.inputs, n.outputs, name=f"n{i}_{n.op}", **n.attrs)
             for i, n in enumerate(spec.nodes)]
    g = helper.make_graph(nodes, "fuzz", inputs, [], initializer=inits)
    g.output.extend(onnx.ValueInfoProto(name=o) for o in spec.outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", spec.opset)], ir_version=9)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    dtypes = {v: k for k, v in ONNX_TYPES.items()}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if vi.name in names and tt.HasField("shape"):
            spec.types[vi.name] = (tuple(d.dim_value for d in tt.shape.dim), dtypes[tt.elem_type])
    for t in spec.inputs:
        spec.types.setdefault(t.name, (tuple(t.shape), t.dtype))
    return spec


def check(spec: GraphSpec, device: str = "cpu", tuning: str = "analytical", db: str | None = None,
          random_schedules: bool = True) -> Outcome:
    """Compile `spec` with tessera, run it, and judge its outputs (see the module docstring)."""
    t0 = time.perf_counter()
    complete_types(spec)
    x = feeds(spec)
    model, ref = reference(spec, x)
    try:
        with fake_gpu(tuning):
            result = compile_model(model, options(spec, tuning, db), profiler=shared_profiler(tuning))
    except Exception as e:  # noqa: BLE001 - every exception on a valid graph is a crash
        return _timed(_crash("compile", e), t0)
    opaque = [(o.op_type, o.reason) for o in result.fission.opaque]
    try:
        if random_schedules:
            pick_schedules(result, spec.schedule_seed)
        forms = kernel_forms(result)
        exe = Executable(result.graph, plan_document(result), device)
        forms["concat_in_place"] += len(exe.in_place)
    except Exception as e:  # noqa: BLE001
        return _timed(_with(_crash("build", e), opaque), t0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            out = exe.run(**{k: torch.from_numpy(v) for k, v in x.items()})
        got = {k: _as_numpy(v) for k, v in out.items()}
    except Exception as e:  # noqa: BLE001
        return _timed(_with(_crash("run", e), opaque), t0)
    outcome = judge(spec, x, ref, got, model)
    outcome.opaque, outcome.forms = opaque, forms
    # Triton's deprecation warnings about generated code (errors in a later Triton): counted.
    outcome.warnings = sorted({str(w.message).splitlines()[0][:120] for w in caught
                               if issubclass(w.category, UserWarning) and "triton" in w.filename})
    return _timed(outcome, t0)


def _with(o: Outcome, opaque: list[tuple[str, str]]) -> Outcome:
    o.opaque = opaque
    return o


def _timed(o: Outcome, t0: float) -> Outcome:
    o.seconds = time.perf_counter() - t0
    return o


# ---- judging ---------------------------------------------------------------------------------------
def judge(spec: GraphSpec, x: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
          got: Mapping[str, np.ndarray], model: onnx.ModelProto | None = None) -> Outcome:
    p = spec.precision
    tol = TOLERANCE[p]
    worst, worst_name = 0.0, ""
    for o in spec.outputs:
        r, g = ref[o], got.get(o)
        if g is None:
            return Outcome("mismatch", "missing output", f"output {o} missing")
        if g.shape != r.shape or g.dtype != r.dtype:
            return Outcome("mismatch", "shape" if g.shape != r.shape else "dtype",
                           f"output {o}: {g.dtype}{list(g.shape)}, onnxruntime {r.dtype}{list(r.shape)}")
        err = rel_l2(g, r)
        if err >= worst:
            worst, worst_name = err, o
    if worst < tol:
        return Outcome("pass", err=worst)
    detail = f"output {worst_name}: rel L2 {worst:.3g} >= {tol:g}"
    floor, emulated_nonfinite = emulated_floor(spec, x, ref)
    executor = f"emulated {p} executor"
    if spec.kernel_nodes == 1 and p != "fp32" and math.isfinite(floor) and not emulated_nonfinite:
        by_primitive = primitive_floor(spec, x, ref)
        if by_primitive > floor:
            floor, executor = by_primitive, f"emulated {p} executor rounding every primitive"
    if not math.isfinite(floor) or emulated_nonfinite:
        if p == "fp16" and out_of_fp16_range(spec, x):
            return Outcome("skip", "fp16-range", detail, worst, floor)
        return Outcome("skip", "nonfinite-emulation", detail, worst, floor)
    if worst < FLOOR_FACTOR * floor:
        return Outcome("skip", "precision-floor", detail + f"; {executor} {floor:.3g}", worst, floor)
    tie = near_tie(spec, x)
    if tie:
        return Outcome("skip", "near-tie", detail + f"; {tie}", worst, floor)
    step = narrow_step(spec, ref, got)
    if step:
        return Outcome("skip", "narrow-output-step", detail + f"; {step}", worst, floor)
    if p == "fp32" and model is not None:
        # onnxruntime's own float32 rounding: tessera matches the float64 value and onnxruntime does not,
        # in every output where the two differ (an output where they agree may hold a cast to fp16, which
        # the float64 value leaves out: session 43's fuzz_seed4343.fail1).
        off = [o for o in spec.outputs if rel_l2(got[o], ref[o]) >= tol]
        exacts: dict[bool, dict[str, np.ndarray]] = {}  # each float64 value fissioned and run once

        def exact_of(narrow: bool) -> dict[str, np.ndarray]:
            if narrow not in exacts:
                exacts[narrow] = exact_outputs(model, x, narrow_casts=narrow)
            return exacts[narrow]

        if worst < REFERENCE_SLACK * tol:
            # The float64 value, then (where the graph casts to fp16/bf16) the same with those casts
            # rounding: an fp32 value within float32 noise of a point where a cast to fp16 turns lands
            # on either side, and onnxruntime's may be the one off (session 49, fuzz_4903_big.fail1: a
            # Conv, which onnxruntime has no float64 kernel for below).
            for narrow in (False, True) if _casts_narrow(spec) else (False,):
                exact = exact_of(narrow)
                e_t = max(rel_l2(got[o], exact[o]) for o in off)
                e_r = min(rel_l2(ref[o], exact[o]) for o in off)
                if e_t < tol / 4 and e_r >= tol:
                    what = "float64 value with its casts to fp16/bf16 rounded" if narrow else "float64 value"
                    return Outcome("skip", "reference-rounding",
                                   detail + f"; {what}: tessera {e_t:.3g}, onnxruntime {e_r:.3g} off", worst, floor)
        wide = float64_outputs(model, x)
        if wide is not None:
            e_t = max(rel_l2(got[o], wide[o]) for o in off)
            e_r = min(rel_l2(ref[o], wide[o]) for o in off)
            if e_t < tol and e_r >= tol:
                return Outcome("skip", "reference-rounding",
                               detail + f"; onnxruntime in float64: tessera {e_t:.3g}, onnxruntime's float32 "
                               f"{e_r:.3g} off", worst, floor)
        if worst < REFERENCE_SLACK * tol:
            # A sum that cancels (a convolution near zero, then a division by it) turns its operands'
            # rounding into a large relative error, which the emulation's noise on each node's result
            # never shows: noise on the inputs does. Excused where tessera is as close to onnxruntime and
            # to the float64 value as that noise moves onnxruntime (session 50, fuzz_5001.fail2: a Conv,
            # a Relu, a Div by it; 5.5e-5 apart, tessera 6.0e-5 and onnxruntime 3.6e-5 off the float64
            # value, onnxruntime moved 2.5e-4 by the noise).
            moved = input_noise_floor(spec, model, x, ref)
            if worst < FLOOR_FACTOR * moved:
                exact = exact_of(False)
                e_t = max(rel_l2(got[o], exact[o]) for o in off)
                e_r = min(rel_l2(ref[o], exact[o]) for o in off)
                if e_t < FLOOR_FACTOR * moved:
                    return Outcome("skip", "ill-conditioned",
                                   detail + f"; onnxruntime moves {moved:.3g} under float32 noise on the inputs; "
                                   f"float64 value: tessera {e_t:.3g}, onnxruntime {e_r:.3g} off", worst, moved)
    step = narrow_step(spec, ref, got, through_casts=True)
    if step:
        return Outcome("skip", "narrow-output-step", detail + f"; {step}", worst, floor)
    return Outcome("mismatch", "values", detail + f"; {executor} {floor:.3g}", worst, floor)


def exact_outputs(model: onnx.ModelProto, x: Mapping[str, np.ndarray], narrow_casts: bool = False) -> dict[str, np.ndarray]:
    """The float64 value: tessera's reference interpreter on the graph's primitives (exact=True; with
    `narrow_casts`, its casts to fp16/bf16 round). Used only where onnxruntime is off by float32
    rounding (`REFERENCE_SLACK`), never for a semantic difference: it shares fission with the compiled
    graph."""
    return interp.run(fission(load(model).graph).graph, dict(x), exact=True, narrow_casts=narrow_casts)


def _casts_narrow(spec: GraphSpec) -> bool:
    return any(n.op == "Cast" and n.attrs.get("to") in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
               for n in spec.nodes)


def float64_outputs(model: onnx.ModelProto, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """onnxruntime's outputs for the graph widened to float64 (`widened`), or None where it cannot run
    that graph (an op without a float64 kernel). Independent of tessera: the same formulas as the
    float32 reference, so it tells onnxruntime's float32 rounding from a semantic difference at any
    size. GroupNormalization's ONNX function, which onnxruntime runs, takes the variance as
    E[x^2] - E[x]^2: in float32 that cancels where a group's values nearly coincide (session 36,
    fz36.fail2: 1.2e-3 off over groups of two), in float64 it does not."""
    try:
        return run_ort(widened(model), {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in x.items()})
    except Exception:  # noqa: BLE001 - onnxruntime raises its own types
        return None


def widened(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` in float64: its float32 inputs, outputs and initializers become float64, a Cast to
    float32 casts to float64, and the normalizations that have a stash_type compute in float64.
    A float32 value left elsewhere (an attribute) makes onnxruntime reject the graph."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for k, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[k].CopyFrom(onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(t).astype(np.float64), t.name))
    for n in g.node:
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "Cast" and attrs["to"].i == TensorProto.FLOAT:
            attrs["to"].i = TensorProto.DOUBLE
        if n.op_type in ("LayerNormalization", "GroupNormalization"):
            if "stash_type" in attrs:
                attrs["stash_type"].i = TensorProto.DOUBLE
            else:
                n.attribute.append(helper.make_attribute("stash_type", TensorProto.DOUBLE))
    return m


def emulated_floor(spec: GraphSpec, x: Mapping[str, np.ndarray],
                   ref: Mapping[str, np.ndarray]) -> tuple[float, bool]:
    """The worst output error of the emulated executor against the reference, and whether it
    produced a NaN or infinity that the reference does not have."""
    p = spec.precision
    emu = run_ort(to_onnx(spec, p if p != "fp32" else None, emulate=p), rounded(x, p))
    worst, bad = 0.0, False
    for o in spec.outputs:
        e = rel_l2(emu[o], ref[o])
        worst = max(worst, e) if not math.isnan(e) else math.inf
        if emu[o].dtype.kind == "f" and (~np.isfinite(emu[o]) & np.isfinite(ref[o])).any():
            bad = True
    return worst, bad


def input_noise_floor(spec: GraphSpec, model: onnx.ModelProto, x: Mapping[str, np.ndarray],
                      ref: Mapping[str, np.ndarray]) -> float:
    """How far onnxruntime's fp32 outputs of `model` (the reference's) move when every float input
    carries relative noise of a few float32 roundings (`FP32_NOISE`): the graph's own sensitivity at
    these inputs."""
    rng = np.random.default_rng([spec.seed, 1 << 22])
    noisy = {k: (v * (1 + FP32_NOISE * rng.uniform(-1, 1, v.shape))).astype(np.float32)
             if v.dtype == np.float32 else v for k, v in x.items()}
    out = run_ort(model, noisy)
    errs = [rel_l2(out[o], ref[o]) for o in spec.outputs]
    return max((e for e in errs if not math.isnan(e)), default=0.0)


def primitive_floor(spec: GraphSpec, x: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> float:
    """A graph compiled one primitive a kernel (`GraphSpec.kernel_nodes`) stores every primitive's
    value in the narrow type, as tessera's precision pass says (`rewrite/precision.py`), where the
    emulated executor rounds only each ONNX node's: a bf16 GroupNormalization over groups of two
    rounds its centred values, variance and reciprocal too (session 45's fuzz_4501.fail1, 1.4% off
    against 0.16%). This emulates that policy independently of tessera's kernels and runtime: the
    graph's float32 primitives (fission) exported to ONNX (`ir/onnx_export.py`), each float output
    rounded to the precision and back, run by onnxruntime. The worst output error against the
    reference; 0.0 where the primitives cannot be exported or run (the node-level floor then stands)."""
    p = spec.precision
    try:
        prims = onnx_export.to_onnx(fission(load(to_onnx(spec, p)).graph).graph)
        emu = run_ort(rounded_after_each_node(prims, p), rounded(x, p))
    except Exception:  # noqa: BLE001 - an opaque node's export or onnxruntime may refuse it
        return 0.0
    errs = [rel_l2(emu[o], ref[o]) for o in spec.outputs if o in emu]
    return max(errs) if errs and all(math.isfinite(e) for e in errs) else 0.0


def rounded_after_each_node(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    """`model` with a Cast to `precision` ("fp16" or "bf16") and back after every float32 node output."""
    to = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.BFLOAT16
    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {vi.name for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
              if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    nodes = []
    for n in model.graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(n)
        tail = []
        for j, o in enumerate(n.output):
            if o in floats:
                node.output[j] = f"{o}__raw"
                tail += [helper.make_node("Cast", [f"{o}__raw"], [f"{o}__narrow"], to=to),
                         helper.make_node("Cast", [f"{o}__narrow"], [o], to=TensorProto.FLOAT)]
        nodes += [node] + tail
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def intermediates(spec: GraphSpec, x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the reference run (inputs and constants rounded to the precision)."""
    p = spec.precision
    vals = run_ort(to_onnx(spec, p if p != "fp32" else None, expose=True), rounded(x, p))
    vals.update(rounded(x, p))
    vals.update(const_values(spec, p if p != "fp32" else None))
    return vals


def out_of_fp16_range(spec: GraphSpec, x: Mapping[str, np.ndarray]) -> bool:
    vals = intermediates(spec, x)
    return any(v.dtype == np.float32 and v.size and float(np.nanmax(np.abs(np.where(np.isinf(v), 0, v)))) > FP16_MAX
               for v in vals.values())


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
    if not a.size:
        return math.inf
    g = np.abs(a - b) / (np.abs(a) + np.abs(b) + 1e-30)
    g = g[np.isfinite(g)]
    return float(g.min()) if g.size else math.inf


def narrow_step(spec: GraphSpec, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
                through_casts: bool = False) -> str:
    """Why outputs that miss the tolerance are the precision's rounding after all ('' if they are
    not): each is stored in float16 or bfloat16, and differs from the reference in at most one
    element in a hundred (and one), by one step of its type. A value computed in float32 that lies
    within float32 noise of the narrow type's rounding boundary lands on either side of it: a
    float32 ConvTranspose cast to float16 missed 1e-5 by one element one step off (session 35).
    A kernel that computed in the narrow type where float32 was asked would be off in most elements.
    The same holds for a float32 output of a graph that casts to fp16/bf16 inside (session 51, fuzz_5119:
    a Conv, a Relu, a cast to fp16 and back; one conv value within 3 float32 steps of an fp16 midpoint):
    there the step is the narrow type's at the output's magnitude, and an element counts as off when it
    is further off than float32 noise. `judge` asks that (`through_casts`) last, after the excuses that
    say which side rounded right."""
    tol = TOLERANCE[spec.precision]
    cast_to = {n.attrs.get("to") for n in spec.nodes if n.op == "Cast"}
    inner = ml_dtypes.bfloat16 if TensorProto.BFLOAT16 in cast_to else np.float16 if TensorProto.FLOAT16 in cast_to \
        else None
    for o in spec.outputs:
        r, g = ref[o], got[o]
        if rel_l2(g, r) < tol:
            continue
        off = np.abs(g.astype(np.float64) - r.astype(np.float64))
        if r.dtype in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
            step, noise = np.spacing(np.abs(r)).astype(np.float64), np.zeros(r.shape)
        elif r.dtype == np.float32 and inner is not None and spec.precision == "fp32" and through_casts:
            step = np.abs(np.spacing(np.abs(r).astype(inner)).astype(np.float64)) * (1 + 1e-3)
            noise = 16 * np.spacing(np.abs(r)).astype(np.float64)
        else:
            return ""
        if not np.all(off <= step + noise) or (off > noise).sum() > 1 + r.size // 100:
            return ""
    return "outputs in (or cast through) a narrow type one step off in at most 1% of their elements"


def near_tie(spec: GraphSpec, x: Mapping[str, np.ndarray]) -> str:
    """The first discontinuous op whose reference operands lie within rounding of a tie ('' if none)."""
    thr = TIE[spec.precision]
    vals = None
    for n in spec.nodes:
        kind = n.op
        if kind not in ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Cast", "Floor", "Ceil",
                        "Round", "Mod", "ArgMax", "TopK", "Hardmax"):
            continue
        if vals is None:
            vals = intermediates(spec, x)
        a = vals.get(n.inputs[0])
        if a is None or a.dtype.kind != "f":
            continue
        a = a.astype(np.float64)
        if kind in ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"):
            gap = _gap(a, vals[n.inputs[1]])
        elif kind == "Cast":
            to = n.attrs.get("to")
            if to == TensorProto.BOOL:
                gap = float(np.abs(a).min()) if a.size else math.inf
            elif to in (TensorProto.INT64, TensorProto.INT32):
                gap = float((np.abs(a - np.round(a)) / (np.abs(a) + 1)).min()) if a.size else math.inf
                frac = np.abs(a) - np.floor(np.abs(a))
                gap = min(gap, float(np.minimum(frac, 1 - frac).min())) if a.size else gap
            else:
                continue
        elif kind in ("Floor", "Ceil"):
            frac = a - np.floor(a)
            gap = float(np.minimum(frac, 1 - frac).min()) if a.size else math.inf
        elif kind == "Round":
            gap = float(np.abs(np.abs(a - np.floor(a)) - 0.5).min()) if a.size else math.inf
        elif kind == "Mod":  # the remainder jumps where x / y crosses an integer
            y = vals.get(n.inputs[1])
            if y is None or not a.size:
                continue
            q = a / y.astype(np.float64)
            frac = np.abs(q - np.round(q))
            gap = float(frac.min())
        else:  # ArgMax / TopK / Hardmax: the closest two values along the axis
            axis = int(n.attrs.get("axis", -1))
            s = np.sort(a, axis=axis)
            d = np.abs(np.diff(s, axis=axis)) / (np.abs(s).max() + 1e-30)
            gap = float(d.min()) if d.size else math.inf
        if gap < thr:
            return f"{n.op} {n.outputs[0]} operands {gap:.2g} from a tie"
    return ""
