"""The compile driver: a linear list of named passes.

    load -> fission -> rewrites -> precision -> layout -> ograph -> cost -> orchestrate -> schedules -> codegen -> write

Each pass name is also its key in `CompileResult.timings` and in the report.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from tessera.codegen.kernels import AnySchedule, ChainSchedule, ConvSchedule, GemmSchedule
from tessera.codegen.select import KernelImpl, TritonLegality, implement, needs_template
from tessera.codegen.triton_ops import Unsupported
from tessera.cost import AnalyticalCost, device
from tessera.cost.chain_search import calibrate_from_db, db_samples
from tessera.cost.db import Key, TuningDB, default_db_path, software_versions
from tessera.cost.devices import Device, resolve_preset
from tessera.cost.layout_price import AnalyticalLayoutPrice, MeasuredLayoutPrice
from tessera.cost.measured import (MeasuredCost, Profiler, kernel_signature, math_mode, template_space,
                                   tune_schedules)
from tessera.cost.profiler import GpuProfiler
from tessera.errors import TesseraError
from tessera.fission import FissionResult, fission
from tessera.frontend import LoadedModel, load
from tessera.ir.graph import Graph
from tessera.log import logger
from tessera.orchestrate import DEFAULT_SOLVER, SOLVERS, CandidateRules, OGraph, Plan, build_ograph, orchestrate
from tessera.orchestrate.candidates import MAX_KERNEL_NODES
from tessera.orchestrate.layout import NHWC, LayoutResult, assign_layouts, regions
from tessera.orchestrate.partition import default_max_states
from tessera.orchestrate.report import write_report
from tessera.rewrite import convert_precision
from tessera.rewrite.precision import check_precision, mark_tf32_operands
from tessera.rewrite.bias_after import BIAS_AFTER, move_bias_after_matmul
from tessera.rewrite.deferred import DEFERRED, defer_normalization
from tessera.rewrite.merged import merge_weight_matmuls
from tessera.rewrite.search import GAIN, MEASURED_GAIN, REPLAN_GAIN, follow_rules, rewrite_rules, search
from tessera.runtime.artifact import save_artifact
from tessera.runtime.executable import Executable
from tessera.version import __version__


@dataclass
class CompileOptions:
    strategy: str = "optimal"
    cost: str = "auto"  # "measured" where a GPU is visible, else "analytical"
    db: str | None = None  # tuning database (default: $TESSERA_CACHE/tuning.db)
    tune_workers: int | None = None  # parallel kernel builds while tuning
    tune: str = "all"  # "all": measure every candidate; "lazy": only what the solver picks (exact under lower bounds)
    schedule_tuning: bool = True  # measured cost: time a few schedules of each chosen kernel
    # GEMM and convolution templates (codegen/gemm.py, codegen/conv.py) for matmul and 2-D conv kernels:
    # "auto" (measured compiles time them beside the library call; the faster runs), "off", or "force"
    # (every such kernel that has a template form runs its best-ranked one, in any compile: for tests
    # and experiments)
    templates: str = "auto"
    # With measured templates: elementwise primitives that feed a matmul or convolution operand may
    # join its kernel, computed as the template loads the tile (off: epilogues only, for A/B runs)
    prologues: bool = True
    # A LayerNorm's beta moved after its projection (`rewrite/bias_after.py`), so a template can defer
    # its rstd too. Off by default: it makes the product's rounding follow the normalized value instead
    # of value + beta, 18x further from onnxruntime where they cancel (fuzz seed 5609, fp16), and its
    # speed is unmeasured. With prologues in measured compiles only.
    norm_beta_after: bool = False
    # GEMM chains (codegen/chain.py): two matmuls joined through memory-bound primitives (attention,
    # MLPs) may form one kernel, where templates are measured ("auto") or forced. The solver decides.
    chains: bool = True
    # Matmuls that read one left operand through constant weights become one matmul over the
    # weights side by side (BERT's QKV projections), where templates are measured or forced
    # (rewrite/merged.py `merge_weight_matmuls`)
    merge_matmuls: bool = True
    # Primitive-graph rewrites chosen by cost before orchestration (rewrite/search.py): "on" (every
    # rule), "regroup" (REGROUP_RULES: matmul chains grouped the cheaper way) or "off"
    rewrites: str = "regroup"
    rewrite_budget_s: float = 30.0  # the search prices no new window after this long
    # (30 s: issue 17 allows --rewrites on 60 s of a cold compile, and the measured guard's second
    # plan takes about 25 s of them for a GPT-2-sized graph)
    gpu: str = "auto"  # the cost model's device preset (cost/devices.py); auto: the visible GPU's
    precision: str = "fp32"
    # Float inputs and outputs: "model" (the dtypes the model declares) or "precision" (fp16/bf16
    # plans take and return the narrow type: no boundary casts; rewrite/precision.py)
    io: str = "model"
    layout: str = "auto"  # storage layouts: "auto" (by cost), "nchw" (all row-major), "nhwc" (conv regions channels-last)
    solver: str = DEFAULT_SOLVER
    time_limit: float = 60.0
    max_states: int = field(default_factory=default_max_states)  # 2000, or $TESSERA_MAX_STATES
    max_kernel_nodes: int = MAX_KERNEL_NODES
    input_shapes: Mapping[str, Sequence[int]] | None = None
    # PyTorch entry points: reuse a plan compiled before for the same graph, options, GPU and
    # software ($TESSERA_CACHE/plans, runtime/plan_cache.py), so a re-captured graph compiles in seconds
    plan_cache: bool = True


@dataclass
class CompileResult:
    loaded: LoadedModel
    fission: FissionResult
    graph: Graph  # the primitive graph in the chosen precision: what runs
    ograph: OGraph
    plan: Plan
    kernels: list[KernelImpl] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)  # measured cost: what tuning did
    # Measured cost: each kernel's seconds at its tuned schedule and layout (what runs), where
    # post-solve tuning timed it; the plan's cost_s is the candidate's time before that.
    tuned_s: dict[str, float] = field(default_factory=dict)
    layouts: LayoutResult | None = None  # the layout pass's regions and choices
    io: str = "model"  # CompileOptions.io: the boundary dtypes the graph was built with
    chains: dict[str, dict[str, Any]] = field(default_factory=dict)  # chain kernel -> its schedule search
    # Graph rewrites applied after fission, in order: merged projections, BIAS_AFTER, DEFERRED, then each step the search kept
    # (`search.Applied.to_json`); an artifact replays them (`runtime/artifact.rebuild_graph`)
    rewrites: list[str | dict[str, Any]] = field(default_factory=list)
    rewrite_search: dict[str, Any] = field(default_factory=dict)  # `SearchResult.summary()`, when on
    merged: int = 0  # matmul pairs merged over their constant weights (merge_weight_matmuls), among `rewrites`


PASSES = ("load", "fission", "rewrites", "precision", "layout", "ograph", "cost", "orchestrate", "schedules", "codegen")


def compile_model(source: Any, options: CompileOptions | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  tune_progress: Callable[[int, int], None] | None = None,
                  profiler: Profiler | None = None) -> CompileResult:
    """Load, split, orchestrate a model and generate its kernels.

    `source` is what `frontend.load` takes (a path, bytes, a ModelProto), or a model it already
    loaded (a `LoadedModel`; `options.input_shapes` then go unused).

    `profiler` (measured cost only) is one the caller owns and closes: its worker processes then
    live across compiles, so a script that compiles many models starts them once. By default each
    measured compile starts its own and closes it at the end.
    """
    opt = options or CompileOptions()
    cost_kind = measured_or_analytical(opt)
    if cost_kind not in ("analytical", "measured"):
        raise TesseraError(f"--cost must be analytical, measured or auto, not {opt.cost!r}")
    if opt.templates not in ("auto", "off", "force"):
        raise TesseraError(f"templates must be auto, off or force, not {opt.templates!r}")
    if opt.solver not in SOLVERS:  # (the default comes from TESSERA_SOLVER where that is set)
        raise TesseraError(f"--solver must be one of {', '.join(SOLVERS)}, not {opt.solver!r}"
                           + (" (the default, from TESSERA_SOLVER)" if opt.solver == DEFAULT_SOLVER else ""))
    if cost_kind == "measured" and not torch.cuda.is_available():
        raise TesseraError("--cost measured times kernels on a GPU, and none is visible; use --cost analytical")
    dev = preset_device(opt.gpu)
    timings: dict[str, float] = {}
    t = time.perf_counter()

    def done(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        timings[name] = timings.get(name, 0.0) + now - t  # a pass run twice (a plan without rewrites) adds up
        t = now
        logger.info("pass %-11s %7.2f s", name, timings[name])

    loaded = source if isinstance(source, LoadedModel) else load(source, opt.input_shapes)
    done("load")
    fis = fission(loaded.graph)
    done("fission")
    graph = fis.graph
    rewrites: list[str | dict[str, Any]] = []
    merged: list[dict[str, Any]] = []
    if opt.merge_matmuls and templates_enabled(opt, cost_kind):
        graph, merged = merge_weight_matmuls(graph)
        if merged:
            rewrites += merged
            logger.info("rewrite: %d matmul pair(s) sharing a left operand merged over their weights", len(merged))
    if opt.norm_beta_after and cost_kind == "measured" and opt.templates == "auto" and opt.prologues:
        # a LayerNorm's beta after its projection: rstd can then leave the template's K loop (codegen/norm.py)
        graph, moved = move_bias_after_matmul(graph)
        if moved:
            rewrites.append(BIAS_AFTER)
            logger.info("rewrite: %d row-constant addend(s) moved after their matmul", moved)
    if chains_enabled(opt, cost_kind):  # softmax's division after the product: attention then chains in one pass
        graph, moved = defer_normalization(graph)
        if moved:
            rewrites.append(DEFERRED)
            logger.info("rewrite: %d row normalization(s) moved after their matmul", moved)
    try:  # the mode before anything is priced, the precision before the search prices windows in it
        rules, follow = rewrite_rules(opt.rewrites), follow_rules(opt.rewrites)
        check_precision(opt.precision, opt.io)
    except ValueError as e:
        raise TesseraError(str(e)) from None
    db = TuningDB(opt.db or default_db_path()) if cost_kind == "measured" else None
    own = profiler is None
    if cost_kind != "measured":
        profiler = None
    elif profiler is None:
        profiler = new_profiler(opt)
    try:
        found = None
        unsearched, kept_before = graph, list(rewrites)
        measured = db is not None and profiler is not None
        shared = PlanCaches()
        base = None  # the plan without the search's rewrites, where it is made first

        def plan(g: Graph) -> CompileResult:
            g = convert_precision(g, opt.precision, opt.io)
            done("precision")
            return _plan(loaded, fis, g, opt, cost_kind, dev, db, profiler, timings, done, progress, tune_progress,
                         shared)

        if opt.rewrites != "off":  # the analytical model ranks, measurement confirms
            if measured:
                # Measured, the plan without the rewrites comes first: it is what `--rewrites off`
                # compiles, the guard below compares with it, and the search's windows as they are
                # find their kernels measured. What the rewrites add is the search and, only where
                # they promise enough, a second plan.
                base = plan(unsearched)
            found = search(graph, window_cost(opt, cost_kind, dev, db, profiler), rules=rules,
                           budget_s=opt.rewrite_budget_s,
                           estimate=window_cost(opt, "analytical", dev, None, None) if measured else None,
                           gain=MEASURED_GAIN if measured else GAIN, follow=follow)
            graph = found.graph
            rewrites += [a.to_json() for a in found.applied]
            logger.info("rewrites: %d applied at %d site(s) tried, %d window(s) orchestrated in %.1f s "
                        "(%.1f s ordering sites), saving %.2f us of their windows", len(found.applied), found.sites,
                        found.evaluated, found.seconds, found.ordering_s, found.saved_s * 1e6)
        done("rewrites")
        if base is not None and found is not None and found.applied:
            without_s = plan_seconds(base)
            if found.saved_s < REPLAN_GAIN * without_s:
                # Planning again costs about a cold compile of every subgraph the rewrites touch
                # (segformer_b0 fp16, CPU count: 5151 -> 11589 kernels measured with the second plan),
                # so windows that promise little of the whole plan are not worth it.
                found.kept = False
                logger.info("rewrites: dropped without planning again: their windows save %.2f us, under %.0f%% "
                            "of the plan without them (%.1f us)", found.saved_s * 1e6, REPLAN_GAIN * 100,
                            without_s * 1e6)
                result, rewrites = base, kept_before
            else:
                t0 = time.perf_counter()
                with_them = plan(graph)
                found.guard_s, found.replanned = time.perf_counter() - t0, True
                # A window is not the whole plan (no layouts, its boundary as it cut it), and tuning
                # can favour the graph without the rewrites (segformer's attention chain, session 32,
                # when windows were priced untuned: 10.0 -> 4.7 us tuned without them, 7.3 -> 7.0
                # with): they stay only if the whole tuned plan is cheaper.
                found.plan_s = (plan_seconds(with_them), without_s)
                found.kept = found.plan_s[0] < found.plan_s[1] * (1 - GAIN)
                logger.info("rewrites: the tuned plan %s %.1f us with them, %.1f us without (planned again in %.1f s)",
                            "keeps them:" if found.kept else "drops them:", found.plan_s[0] * 1e6,
                            found.plan_s[1] * 1e6, found.guard_s)
                result, rewrites = (with_them, rewrites) if found.kept else (base, kept_before)
        elif base is not None:  # nothing applied: the graph searched is the one planned
            result = base
        else:
            result = plan(graph)
        result.rewrites = rewrites
        result.merged = len(merged)
        if found is not None:
            result.rewrite_search = result.plan.rewrites = found.summary()
        return result
    finally:  # worker processes and the database, also when solving fails
        if profiler is not None and own:
            getattr(profiler, "close", lambda: None)()
        if db is not None:
            db.close()


@dataclass
class PlanCaches:
    """Kernel-signature caches that outlive one plan: legality verdicts (`TritonLegality.shared`)
    and generated kernels' first-ranked schedules (`MeasuredCost`). Both depend on the kernel
    alone, so a compile's second plan (the rewrite guard's) looks up what the first worked out."""

    verdicts: dict[str, str | None] = field(default_factory=dict)
    ranked: dict[str, Any] = field(default_factory=dict)


def preset_device(gpu: str) -> Device:
    """The cost model's device for `CompileOptions.gpu` ("auto": the visible GPU's preset)."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    preset, why = resolve_preset(gpu, name)
    if gpu == "auto":
        logger.info("device preset: %s (%s)", preset, why)
    try:
        return device(preset)
    except KeyError as e:
        raise TesseraError(str(e.args[0])) from None


def plan_seconds(result: CompileResult) -> float:
    """A compiled plan's estimated time: each kernel at its tuned time where post-solve tuning
    timed it, else at its candidate's."""
    return tuned_total(result.plan, result.tuned_s)


def tuned_total(plan: Plan, tuned_s: Mapping[str, float]) -> float:
    """`plan`'s time with each kernel at its tuned time (`tuned_s`, by name) where it has one."""
    return sum(tuned_s.get(k.name, k.cost_s) for k in plan.kernels)


def tune_plan(graph: Graph, plan: Plan, cost: MeasuredCost, opt: CompileOptions, dev: Device,
              progress: Callable[[int, int], None] | None = None) -> dict[str, tuple[AnySchedule, float]]:
    """Post-solve schedule tuning of `plan`'s kernels (`tune_schedules`): name -> (fastest schedule,
    seconds), for the kernels that have schedules to try."""
    by_name = {n.name: n for n in graph.nodes}
    specs = [(k.name, [by_name[n] for n in k.prims], [by_name[n] for n in k.prologue], k.outputs)
             for k in plan.kernels]
    return tune_schedules(graph, specs, cost.db, cost.profiler, cost.device, cost.versions, progress=progress,
                          precision=opt.precision, gpu=dev, templates=opt.templates == "auto")


def window_cost(opt: CompileOptions, cost_kind: str, dev: Device, db: TuningDB | None,
                profiler: Profiler | None) -> Callable[[Graph], float]:
    """The rewrite search's price of a window: its estimated time once orchestrated as the compile
    would (same precision, cost model, candidate rules and legality; row-major layouts), its
    boundary tensors already in the compute precision. Measured, the window's plan is priced with
    its kernels' schedules tuned, as the compile tunes its plan: the window as it is holds the
    kernels of the plan made first, already tuned, and comparing those with a rewritten window's
    kernels at their first schedules kept the regrouping from MCFuser's G6 in tf32 (on the H100,
    session 41: 15.02 us against 14.70 measured, under the 3% a window must save; tuned, the same
    plan ran 13.1 us in session 39)."""
    chains = chains_enabled(opt, cost_kind)
    verdicts: dict[str, str | None] = {}  # kernel signature -> legality, shared by every window

    def evaluate(window: Graph) -> float:
        g = convert_precision(window, opt.precision, "precision")
        og = build_ograph(g)
        if og.n == 0:
            return 0.0
        if db is not None and profiler is not None:
            cost: Any = measured_cost(og, opt, None, AnalyticalCost(og, dev, opt.precision), dev, db, profiler)
        else:
            cost = AnalyticalCost(og, dev, opt.precision)
        rules, legality = kernel_rules(opt, chains, cost, verdicts)
        plan = orchestrate(og, cost, strategy="optimal", rules=rules, legality=legality, solver=opt.solver,
                           time_limit=10.0, max_states=opt.max_states)
        if isinstance(cost, MeasuredCost) and opt.schedule_tuning:
            return tuned_total(plan, {name: t for name, (_, t) in tune_plan(g, plan, cost, opt, dev).items()})
        return plan.estimated_total_s

    return evaluate


def kernel_rules(opt: CompileOptions, chains: bool, cost: Any,
                 shared: dict[str, str | None] | None = None) -> tuple[CandidateRules, TritonLegality]:
    """Which candidate kernels a compile (or a rewrite window) may form: the size rules, and what
    the code generator can build (templates with operand prologues only where they are measured;
    `shared`: legality verdicts by kernel signature, kept across windows)."""
    return (CandidateRules(max_nodes=opt.max_kernel_nodes, max_linear=2 if chains else 1),
            TritonLegality(templates=isinstance(cost, MeasuredCost) and opt.templates == "auto" and opt.prologues,
                           chains=chains, shared=shared))


def measured_or_analytical(opt: CompileOptions) -> str:
    """The cost model a compile uses: `opt.cost`, with "auto" measured where a GPU is visible."""
    return opt.cost if opt.cost != "auto" else ("measured" if torch.cuda.is_available() else "analytical")


def templates_enabled(opt: CompileOptions, cost_kind: str) -> bool:
    """Do templates compete for kernels? Where they are measured (their cost decides) or forced."""
    return opt.templates == "force" or (opt.templates == "auto" and cost_kind == "measured")


def chains_enabled(opt: CompileOptions, cost_kind: str) -> bool:
    """May GEMM chains form kernels? Where templates are measured (their cost decides) or forced."""
    return opt.chains and templates_enabled(opt, cost_kind)


def new_profiler(opt: CompileOptions) -> Profiler:
    """The GPU profiler a measured compile times kernels with (tests put a fake one here)."""
    return GpuProfiler(opt.tune_workers)


def _plan(loaded: LoadedModel, fis: FissionResult, graph: Graph, opt: CompileOptions, cost_kind: str, dev: Device,
          db: TuningDB | None, profiler: Profiler | None, timings: dict[str, float],
          done: Callable[[str], None], progress: Callable[[int, int], None] | None,
          tune_progress: Callable[[int, int], None] | None, shared: PlanCaches | None = None) -> CompileResult:
    """The passes from `layout` on (the driver owns the tuning database and profiler). `shared`:
    what one plan works out by kernel signature and the next may reuse (the rewrite guard's plan
    without the rewrites repeats most of the first one's kernels)."""
    shared = shared or PlanCaches()
    if db is not None and profiler is not None:
        pricer: Any = MeasuredLayoutPrice(dev, opt.precision, db, profiler, torch.cuda.get_device_name(),
                                          software_versions(), tune_progress, templates=opt.templates == "auto")
        if opt.layout == "auto":  # every convolution that could go either way, measured in one batch
            by_name = {n.name: n for n in graph.nodes}
            pricer.prepare(graph, [by_name[c] for r in regions(graph) for c in r.convs], [(), NHWC])
    else:
        pricer = AnalyticalLayoutPrice(dev, opt.precision)
    try:
        lay = assign_layouts(graph, pricer, opt.layout)
    except ValueError as e:
        raise TesseraError(str(e)) from None
    graph = mark_tf32_operands(lay.graph, opt.precision)  # after layouts: it reads the final graph
    if lay.regions:
        logger.info("layout: %s", {k: v for k, v in lay.summary().items() if k != "detail"})
    done("layout")
    og = build_ograph(graph)
    done("ograph")
    chains = chains_enabled(opt, cost_kind)
    if db is not None and profiler is not None:
        cost: Any = measured_cost(og, opt, tune_progress, AnalyticalCost(og, dev, opt.precision), dev, db, profiler,
                                  shared.ranked)
        device_name = torch.cuda.get_device_name()
        if chains:  # the chain model refitted to the chains this GPU has measured, if enough
            fitted = calibrate_from_db(db_samples(db.chain_samples(device_name)), dev)
            logger.info("chain model: %s", f"refitted, {fitted}" if fitted else "defaults (too few measured chains)")
    else:
        cost = AnalyticalCost(og, dev, opt.precision)
        device_name = dev.name
    done("cost")
    tuning: dict[str, Any] = {}
    tuned: dict[str, AnySchedule] = {}
    tuned_s: dict[str, float] = {}
    rules, legality = kernel_rules(opt, chains, cost, shared.verdicts)  # by signature: a transformer's layers share verdicts
    plan = orchestrate(og, cost, strategy=opt.strategy,
                       rules=rules, legality=legality, solver=opt.solver, time_limit=opt.time_limit, max_states=opt.max_states,
                       model=loaded.label, device=device_name, precision=opt.precision, cost_model=cost_kind,
                       progress=progress)
    logger.info("orchestrate: %d kernels from %d primitives in %d subgraph(s), %d cut(s); estimated %.1f us",
                len(plan.kernels), plan.primitives, len(plan.subgraphs), len(plan.cuts), plan.estimated_total_s * 1e6)
    for sg in plan.subgraphs:
        logger.debug("  subgraph %d: %d nodes, %d states, %d candidates -> %d kernels; solver %s", sg.index, sg.nodes,
                     sg.states, sg.candidates, sg.kernels, sg.solver)
    done("orchestrate")
    if isinstance(cost, MeasuredCost):
        t0 = time.perf_counter()
        rows = len(cost.db)
        best = tune_plan(graph, plan, cost, opt, dev, tune_progress) if opt.schedule_tuning else {}
        tuned = {name: sch for name, (sch, _) in best.items()}
        tuned_s = {name: seconds for name, (_, seconds) in best.items()}
        tuning = {**cost.stats, "db": str(cost.db.path), "schedules_tuned": len(tuned),
                  "templates_chosen": sum(isinstance(s, (GemmSchedule, ConvSchedule)) for s in tuned.values()),
                  "layout_convs_measured": pricer.measured if isinstance(pricer, MeasuredLayoutPrice) else 0,
                  "schedule_measured": len(cost.db) - rows,
                  "schedule_s": round(time.perf_counter() - t0, 2),
                  "profiler_stages_s": {k: round(v, 2) for k, v in getattr(cost.profiler, "stats", {}).items()}}
        done("schedules")
    if opt.templates == "force":
        tuned.update(forced_templates(graph, plan, opt.precision, dev))
    kernels = generate_kernels(graph, plan, tuned)
    done("codegen")
    measured = (cost.db, cost.device, cost.versions) if isinstance(cost, MeasuredCost) else None
    return CompileResult(loaded, fis, graph, og, plan, kernels, timings, tuning, tuned_s, lay, opt.io,
                         chain_searches(graph, kernels, opt.precision, dev, measured))


# Lazy measurement takes 0.6x the analytical estimate (roofline plus launch) as a candidate's
# lower bound. On the H100 the 6857 candidates measured for attn_s7, bert_tiny, gpt2_tiny and
# candy_small (fp32) took at least 0.76x their estimate (median 1.34x; scripts/tuning_stats.py).
BOUND_FACTOR = 0.6


def measured_cost(og: OGraph, opt: CompileOptions, progress: Callable[[int, int], None] | None,
                  analytical: AnalyticalCost, gpu: Device, db: TuningDB, profiler: Profiler,
                  ranked: dict[str, Any] | None = None) -> MeasuredCost:
    """Costs from the tuning database, measuring on this machine's GPUs what it lacks.

    `opt.tune == "all"` (the default) measures every candidate; "lazy" measures only what the
    solver picks, with BOUND_FACTOR times the analytical estimate as the lower bound of the rest,
    re-solving until the plan holds only measured kernels. On bert_tiny (fake costs, CPU) lazy
    measured 189 of 493 kernels but needed 20 solves (110 s on 2 cores), so it pays only where
    measuring is slower than solving.
    """
    bound = (lambda c: BOUND_FACTOR * analytical(c)) if opt.tune == "lazy" else None
    return MeasuredCost(og, db, profiler, torch.cuda.get_device_name(), software_versions(),
                        progress, bound, opt.precision, gpu, templates=opt.templates == "auto", ranked=ranked)


def forced_templates(graph: Graph, plan: Plan, precision: str, dev: Device) -> dict[str, AnySchedule]:
    """`templates="force"`: the best-ranked template schedule of every plan kernel with a matmul or a
    2-D convolution that has a template form."""
    by_name = {n.name: n for n in graph.nodes}
    out: dict[str, AnySchedule] = {}
    for k in plan.kernels:
        ranked = template_space(graph, [by_name[n] for n in k.prims], [by_name[n] for n in k.prologue], k.outputs,
                                precision, dev)
        if ranked:
            out[k.name] = ranked[0]
    return out


def generate_kernels(graph: Graph, plan: Plan, tuned: Mapping[str, AnySchedule] | None = None) -> list[KernelImpl]:
    """Every plan kernel as code (with its tuned schedule, if any); a kernel the generator refuses
    names itself and its primitives."""
    by_name = {n.name: n for n in graph.nodes}
    out = []
    for k in plan.kernels:
        prims, pro = [by_name[n] for n in k.prims], [by_name[n] for n in k.prologue]
        schedule = (tuned or {}).get(k.name)
        if schedule is None and needs_template(prims):  # only a template computes it: its best-ranked
            schedule = next(iter(template_space(graph, prims, pro, k.outputs, plan.precision, None)), None)
        try:
            out.append(implement(graph, prims, pro, k.outputs, k.name, k.source_nodes, schedule, plan.precision))
        except Unsupported as e:
            raise TesseraError(f"kernel {k.name} ({', '.join(k.prims)}) has no code: {e}") from None
    return out


def chain_searches(graph: Graph, kernels: Sequence[KernelImpl], precision: str, dev: Device,
                   measured: tuple[TuningDB, str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each GEMM-chain kernel's schedule search, for plan.json: the space before and after pruning,
    the generations to convergence, the schedule that runs and its rank in the model's order, and,
    with the tuning database (`measured`: database, device, versions), the model's rank error over
    the schedules measured (`chain_search.rank_error`)."""
    from tessera.cost.chain_search import chain_key, chain_search, rank_error

    out: dict[str, dict[str, Any]] = {}
    for k in kernels:
        if k.triton is not None and isinstance(k.triton.schedule, ChainSchedule):
            found = chain_search(graph, k.nodes, k.outputs, precision, dev)
            tile = replace(k.triton.schedule, late=False)  # the model ranks tiles; `late` is how the kernel launches
            out[k.name] = {**found.summary(), "runs": k.triton.schedule.to_json(),
                           "model_rank_of_run": found.ranked.index(tile) + 1 if tile in found.ranked else None}
            if measured is not None:
                db, device_name, versions = measured
                sig = kernel_signature(graph, k.prims, k.prologue, k.outputs, math_mode(k.prims, precision))
                times = [(s, db.get(Key(device_name, versions, sig, chain_key(s)))) for s in found.ranked]
                ok = [(found.predicted[s], r.seconds) for s, r in times if r is not None and math.isfinite(r.seconds)]
                if ok:
                    out[k.name]["measured"] = len(ok)
                    out[k.name]["rank_error"] = rank_error([p for p, _ in ok], [t for _, t in ok])
    return out


def plan_document(result: CompileResult) -> dict[str, Any]:
    """plan.json's content: the plan, pass timings and opaque operators."""
    doc = result.plan.to_json()
    doc["timings_s"] = {k: round(v, 4) for k, v in result.timings.items()}
    if result.tuning:
        doc["tuning"] = result.tuning
    if result.layouts is not None:
        doc["layout"] = result.layouts.summary()
    doc["opaque"] = [{"node": o.node, "op": o.op_type, "reason": o.reason} for o in result.fission.opaque]
    for k, impl in zip(doc["kernels"], result.kernels):
        k["backend"] = impl.backend
        if impl.reason:
            k["fallback_reason"] = impl.reason
        if impl.triton:
            k["schedule"] = impl.triton.schedule.to_json()
        if k["name"] in result.tuned_s:
            k["tuned_s"] = result.tuned_s[k["name"]]
        if k["name"] in result.chains:
            k["chain_search"] = result.chains[k["name"]]
    return doc


def write_artifacts(result: CompileResult, out: Path) -> None:
    """The artifact directory: plan.json, report.html and what `tessera.load` needs."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan_document(result), indent=1))
    write_report(result.plan, result.ograph, out / "report.html")
    kdir = out / "kernels"
    kdir.mkdir(exist_ok=True)
    for old in kdir.glob("*.py"):
        old.unlink()
    for impl in result.kernels:  # for people to read; the runtime regenerates them from the plan
        if impl.triton:
            (kdir / f"{impl.triton.name}.py").write_text(impl.triton.source)
    save_artifact(out, result.graph, result.loaded.model, rebuild_meta(result),
                  result.layouts.choices if result.layouts is not None else [])


def rebuild_meta(result: CompileResult) -> dict[str, Any]:
    """What rebuilds a compile's primitive graph from its model (`runtime/artifact.rebuild_graph`),
    less the layout choices, which `save_artifact` adds."""
    return {"tessera": __version__, "model": result.loaded.label, "precision": result.plan.precision,
            "io": result.io, "rewrites": result.rewrites,
            "input_shapes": {k: list(v) for k, v in result.loaded.input_shapes.items()},
            "layout_unpadded": result.layouts.unpadded if result.layouts is not None else []}


def compile(source: Any, options: Any = None, device: str | torch.device | None = None,
            example_inputs: Sequence[Any] | None = None, dynamic: Mapping[int, Mapping[int, Any]] | None = None) -> Any:
    """Compile a model into a callable that takes and returns torch tensors.

    `source` is an ONNX model (path, bytes, ModelProto), or an `nn.Module` (any traceable
    function) with `example_inputs`: `compile(module, (x,))` or `compile(module, options,
    example_inputs=(x,))`. A module's plan runs on its example inputs' device; an ONNX model's on
    `device` (default the CPU). `dynamic={arg: {axis: (low, high)}}` compiles a module for every
    size in the range, one plan per bucket (`torch_dynamic.py`); an ONNX model takes its dynamic
    sizes from `tessera compile --dynamic` (`tessera/dynamic.py`)."""
    if isinstance(options, (tuple, list)):
        options, example_inputs = None, options
    if isinstance(source, torch.nn.Module) or (callable(source) and not isinstance(source, (str, bytes, Path))):
        from tessera.torch_backend import compile_module

        if example_inputs is None:
            raise TesseraError("compiling a torch module needs example inputs: tessera.compile(module, (x, ...))")
        return compile_module(source, example_inputs, options, dynamic=dynamic)
    if dynamic:
        raise TesseraError("dynamic= applies to a torch module; compile an ONNX model for dynamic sizes with "
                           "tessera compile --dynamic NAME=DIM:MIN..MAX")
    result = compile_model(source, options)
    return Executable(result.graph, plan_document(result), device or "cpu")
