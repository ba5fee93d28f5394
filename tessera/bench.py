"""`tessera bench`: tessera against the tools users would pick instead, in one process.

Every contender runs on the same inputs, on the same device, in the same
process: the tessera executable (per strategy, replayed as a CUDA graph),
PyTorch eager, `torch.compile` (default), `torch.compile(mode="reduce-overhead")`
(CUDA graphs) and, when asked, `mode="max-autotune"` and `sdpa` (a zoo attention case
computed by `F.scaled_dot_product_attention`, the flash kernel). Times (`timing="wall"`) are
medians of `triton.testing.do_bench` on the GPU (a perf_counter loop on a CPU). At a few µs
launches hide the kernels, so `timing="gpu"` times each contender by the GPU time of the
kernels one call runs instead (the CUDA profiler: the time at least one kernel ran, averaged over
`GPU_REPS` calls; where no kernels overlap, their sum; under programmatic dependent launch a
kernel starts while the one before runs, and that overlap counts once). Every
timed output is checked against onnxruntime (fp32) with the precision's
tolerance. The PyTorch peers need the PyTorch model: a zoo model (`zoo:NAME`)
is built from one seed both ways; for a plain ONNX file only tessera runs.
"""
from __future__ import annotations

import copy
import datetime
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from tessera.codegen.launch import use_interpreter
from tessera.compiler import CompileOptions, CompileResult, compile_model, plan_document
from tessera.cost import AnalyticalCost
from tessera.cost import device as device_spec
from tessera.cost.devices import resolve_preset
from tessera.errors import TesseraError
from tessera.frontend import load as frontend_load
from tessera.log import logger
from tessera.orchestrate import DEFAULT_SOLVER
from tessera.orchestrate.candidates import Candidate
from tessera.runtime.executable import Executable
from tessera.runtime.profile import profile_callable, profile_executable
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime

STRATEGY_SUFFIXES = ("notemplates", "noprologues", "precisionio", "nochains", "nomerge", "rewrites", "norewrites")
PEERS = ("eager", "inductor", "inductor-cudagraphs", "inductor-max-autotune", "sdpa")
# tessera itself through torch.compile(backend="tessera") on the PyTorch model (issue 16): listed with
# the peers (`--vs`), since it needs the module, but never counted as one.
DYNAMO = "tessera-dynamo"
TIMINGS = ("wall", "gpu")
# Dynamo's guards for every torch.compile contender (Inductor's and tessera's alike): "all" keeps
# them; "skip-modules" drops those on nn.Module state (`torch.compiler.skip_guard_on_all_nn_modules_unsafe`),
# which frozen inference does not need. BERT-base checks ~200 parameter guards per call: 355 µs of a
# 435 µs call on a 2-core CPU with a trivial backend (gpt2: 170 of 241), enough to make a 0.5 ms
# model host-bound.
GUARDS = ("all", "skip-modules")


def guard_options(guards: str) -> dict[str, Any]:
    """torch.compile options that set dynamo's guards (`GUARDS`); empty for "all"."""
    if guards not in GUARDS:
        raise TesseraError(f"unknown guards {guards!r}; choose from {', '.join(GUARDS)}")
    if guards == "all":
        return {}
    skip = getattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe", None)
    if skip is None:
        raise TesseraError(f"--guards {guards} needs torch.compiler.skip_guard_on_all_nn_modules_unsafe "
                           f"(torch {torch.__version__} has none)")
    return {"guard_filter_fn": skip}
_MODES = {"inductor": "default", "inductor-cudagraphs": "reduce-overhead", "inductor-max-autotune": "max-autotune"}


def _inductor(module: Any, mode: str, guards: str) -> Any:
    """torch.compile(module, mode=mode) under `guards`. torch.compile refuses a mode beside an
    options dict, so with guard options the mode is given as the Inductor options it stands for."""
    extra = guard_options(guards)
    if not extra:
        return torch.compile(module, mode=mode)
    from torch._inductor import list_mode_options

    return torch.compile(module, options={**list_mode_options(mode), **extra})


@dataclass
class Entry:
    name: str
    ms: float
    rel_l2: float
    passed: bool
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


GPU_REPS = 50  # calls profiled per contender under timing="gpu"


def median_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Median time of one call: CUDA events through do_bench on a GPU, perf_counter on a CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))
    fn()
    times = []
    for _ in range(10):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def kernel_profile(result: CompileResult, gpu: str | None = None, top: int = 12) -> dict[str, Any]:
    """Where a plan's time goes: each kernel's cost (measured, under a measured cost model, at its
    tuned schedule and layout where post-solve tuning timed it) beside its roofline (the time its
    DRAM traffic and arithmetic need at the device's peak rates).

    Returns totals by backend, the `top` most expensive kernels, each with its gap to the
    roofline (what the benchmark docs quote where tessera loses), and every kernel's cost by name
    (`estimate_us`: set beside the replay's kernels, it shows which kernels the cost model misjudged).
    """
    og, plan = result.ograph, result.plan
    # The plan's device (a measured plan records the GPU's CUDA name) unless told: an H200 row's
    # roofline at an H100's bandwidth overstated its gap by 1.4x (session 42).
    model = AnalyticalCost(og, device_spec(resolve_preset(gpu or "auto", plan.device)[0]), plan.precision)
    rows = []
    for k, impl in zip(plan.kernels, result.kernels):
        mask = sum(1 << og.index[n] for n in k.prims if n in og.index)
        outs = sum(1 << og.index[n] for n in k.prims if n in og.index and
                   any(o in k.outputs for o in og.nodes[og.index[n]].outputs))
        c = Candidate(mask, outs, og.inputs_of(mask))
        read, written = model.traffic(c)
        roof = model.roofline(c)
        cost = result.tuned_s.get(k.name, k.cost_s)
        rows.append({"name": k.name, "backend": impl.backend, "prims": len(k.prims), "cost_us": cost * 1e6,
                     "roofline_us": roof * 1e6, "mb": (read + written) / 1e6,
                     "x_roofline": cost / roof if roof > 0 else None})
    by_backend: dict[str, dict[str, float]] = {}
    for r in rows:
        b = by_backend.setdefault(r["backend"], {"kernels": 0, "cost_us": 0.0, "roofline_us": 0.0})
        b["kernels"] += 1
        b["cost_us"] += r["cost_us"]
        b["roofline_us"] += r["roofline_us"]
    estimates = {r["name"]: round(r["cost_us"], 3) for r in rows}
    rows.sort(key=lambda r: -r["cost_us"])
    return {"total_cost_us": sum(r["cost_us"] for r in rows), "total_roofline_us": sum(r["roofline_us"] for r in rows),
            "by_backend": by_backend, "top": rows[:top], "estimate_us": estimates}


def _rewrites(suffixes: Sequence[str]) -> str:
    """A strategy's rewrite mode: "-rewrites" every rule, "-norewrites" none, else the default."""
    if "rewrites" in suffixes and "norewrites" in suffixes:
        raise TesseraError("a strategy takes -rewrites or -norewrites, not both")
    return "on" if "rewrites" in suffixes else "off" if "norewrites" in suffixes else CompileOptions.rewrites


def _set_precision(precision: str) -> None:
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def _check(out: Any, ref: dict[str, np.ndarray], names: Sequence[str], precision: str) -> tuple[float, bool]:
    outs = out if isinstance(out, (list, tuple)) else [out]
    errs = [rel_l2(o.detach().float().cpu().numpy(), ref[n]) for o, n in zip(outs, names)]
    worst = max(errs) if errs else float("nan")
    return worst, bool(errs) and worst < TOLERANCE[precision]


def bench(model: Any, precision: str = "fp32", peers: Sequence[str] = PEERS[:3],
          strategies: Sequence[str] = ("optimal", "greedy"), cost: str = "auto", db: str | None = None,
          device: str = "cuda", seed: int = 0, solver: str = DEFAULT_SOLVER, run_profile: bool = False,
          timing: str = "wall", guards: str = "all",
          on_entry: Callable[[dict[str, Any]], None] | None = None, batch: int = 1) -> dict[str, Any]:
    """Time tessera and its peers on `model`: an ONNX path, zoo:NAME, a user's PyTorch model as
    (module, example_inputs), or FILE.py:FUNC naming a function that returns that pair. Returns
    the JSON document.

    `on_entry`: called with the document so far (`"partial": True`) after each contender, so a
    caller can save what finished before a later contender runs past a time limit or crashes the
    process (max-autotune's own kernel benchmarks have faulted on the GPU).

    `run_profile`: also profile what each contender launches (`runtime/profile.py`) into its
    entry's `extra["run_profile"]`: GPU µs per call by kernel kind, plan kernel and kernel.
    `guards`: dynamo's guards for every torch.compile contender (`GUARDS`).
    `batch`: a zoo model's items per call (`zoo.BATCHED`); an ONNX file or a user's model has its own."""
    dev = torch.device(device)
    guard_options(guards)  # a bad value fails before anything compiles
    if timing not in TIMINGS:
        raise TesseraError(f"unknown timing {timing!r}; choose from {', '.join(TIMINGS)}")
    if timing == "gpu" and dev.type != "cuda":
        raise TesseraError("--timing gpu needs a GPU: it sums the CUDA kernels' time")
    # Before anything imports Triton through torch (the zoo's dynamo export does): on a CPU,
    # Triton's interpreter must be chosen first or kernels it loads later cannot run.
    use_interpreter(dev)
    module = None
    if batch != 1 and not (isinstance(model, str) and model.startswith("zoo:")):
        raise TesseraError(f"a batch of {batch} applies to zoo models; an ONNX file or a PyTorch model's example "
                           "inputs set its own")
    if not isinstance(model, str) or _is_factory(model):
        module, example = user_model(model)
        name = type(module).__name__
        path = module_onnx(module, example, Path(tempfile.mkdtemp()), name)
    elif model.startswith("zoo:"):
        from tessera.zoo import batched_name, build, make

        zoo_name = model[4:]
        try:
            module, example = make(zoo_name, seed, batch)
        except KeyError as e:
            raise TesseraError(str(e.args[0])) from None
        path = build(zoo_name, Path(tempfile.mkdtemp()), seed, batch)
        name = batched_name(zoo_name, batch)
    else:
        path = Path(model)
        name = path.stem
    loaded = frontend_load(path)
    feeds_np = random_inputs(loaded.graph, seed)
    ref = run_onnxruntime(loaded.model, feeds_np)
    out_names = list(loaded.graph.outputs)
    entries: list[Entry] = []

    def checkpoint() -> None:  # the document so far, after each contender
        if on_entry is not None:
            on_entry({**_document(name, precision, dev, timing, guards, entries), "partial": True})

    reps = 30 if dev.type == "cuda" else 1  # a CPU profile runs Triton's interpreter: one call is plenty
    # Run profiles wait until every contender is timed: in a process with CUDA graphs, torch.profiler
    # leaves CUPTI attached after its session (TEARDOWN_CUPTI=0), and every later CUDA API call on the
    # host pays for it. A contender timed after a profile was slowed where its host work shows (on an
    # H100, bert_base through the backend: 399 -> 426 µs per call, scripts/results/bench/session36).
    profiles: list[tuple[int, Callable[[], Any]]] = []
    _set_precision(precision)
    for strategy in strategies:
        # "optimal-notemplates": the same strategy with GEMM/conv templates off (library kernels only),
        # to show what the templates add; "-noprologues", with templates but no operand prologues;
        # "-precisionio", taking and returning the precision's type as the half peers do (no boundary
        # casts; its inputs are converted once, outside the timed calls); "-nochains", with no GEMM
        # chains (codegen/chain.py); "-nomerge", with matmuls sharing a left operand through constant
        # weights left apart (merge_weight_matmuls); "-rewrites", with every rewrite rule searched
        # (rewrite/search.py; the default searches REGROUP_RULES only), "-norewrites" with none.
        # Suffixes combine (optimal-precisionio-rewrites). Each reuses the database the plain strategy filled.
        base, *suffixes = strategy.split("-")
        unknown = set(suffixes) - set(STRATEGY_SUFFIXES)
        if unknown:
            raise TesseraError(f"unknown strategy {strategy!r}; a strategy may end in "
                               + ", ".join(f"-{x}" for x in STRATEGY_SUFFIXES))
        t0 = time.perf_counter()
        result = compile_model(path, CompileOptions(strategy=base, precision=precision, cost=cost, db=db,
                                                    solver=solver,
                                                    templates="off" if "notemplates" in suffixes else "auto",
                                                    prologues="noprologues" not in suffixes,
                                                    chains="nochains" not in suffixes,
                                                    merge_matmuls="nomerge" not in suffixes,
                                                    rewrites=_rewrites(suffixes),
                                                    io="precision" if "precisionio" in suffixes else "model"))
        exe = Executable(result.graph, plan_document(result), dev)
        compile_s = time.perf_counter() - t0
        # Bound inputs: the executable's own buffers hold them, so no call copies them in (the peers
        # read theirs where they are, too).
        feeds = exe.bind_inputs(exe.prepare_inputs(**{k: torch.from_numpy(v) for k, v in feeds_np.items()}))
        got = exe.run_static(feeds)
        err, ok = _check([got[n] for n in exe.output_names], ref, exe.output_names, precision)
        if timing == "gpu":
            ms = profile_executable(exe, feeds, GPU_REPS).busy_us / 1e3
        else:
            ms = median_ms(lambda: exe.run_static(feeds), dev)
        # Each contender as it finishes (TESSERA_LOG=info): a run cut off by a time limit still says
        # how far it got and where the time went.
        logger.info("bench %s %s: tessera-%s compiled in %.1f s, %.3f ms", name, precision, strategy, compile_s, ms)
        entries.append(Entry(f"tessera-{strategy}", ms, err, ok, extra={
            "kernels": len(exe.steps), "backends": exe.backends, "compile_s": round(compile_s, 2),
            "replay": exe.replay,  # a CUDA graph, or launches where the capture failed (the timing says so)
            "capture_error": exe.capture_error,
            "cost_model": result.plan.cost_model, "tuning": result.tuning,
            "layouts": result.layouts.summary() if result.layouts else None, "profile": kernel_profile(result),
            # Each GEMM chain's schedule search (space, pruning, generations, rank error) and the
            # schedule that runs; every kernel's backend and schedule, to name what ran.
            "chains": result.chains,
            "rewrites": result.rewrite_search,
            "plan": _plan_rows(exe)}))
        if run_profile:
            profiles.append((len(entries) - 1, lambda exe=exe, feeds=feeds: profile_executable(exe, feeds, reps)))
        checkpoint()
    if module is not None:
        module = module.to(dev)
        fp32_module = module
        args = fp32_args = [torch.from_numpy(feeds_np[n]).to(dev) for n in loaded.graph.inputs]
        if precision in ("fp16", "bf16"):
            dt = torch.float16 if precision == "fp16" else torch.bfloat16
            module = (copy.deepcopy(module) if DYNAMO in peers else module).to(dt)  # to() converts in place
            args = [a.to(dt) if a.is_floating_point() else a for a in args]
        torch._dynamo.reset()  # this row's torch.compile contenders start from nothing an earlier row compiled
        for peer in peers:
            if peer not in PEERS + (DYNAMO,):
                raise TesseraError(f"unknown peer {peer!r}; choose from {', '.join(PEERS + (DYNAMO,))}")
            extra: dict[str, Any] = {}
            if peer == DYNAMO:  # the fp32 module, as the ONNX path compiles the fp32 model, at the same precision
                from tessera.torch_backend import dynamo_compile

                # No torch._dynamo.reset() here: it would make the torch.compile contenders before this
                # one compile again when their profiles run last. Dynamo keeps each backend's graphs
                # apart (its BACKEND_MATCH check), so Inductor's never answer for tessera's.
                fn, compiled = dynamo_compile(fp32_module, CompileOptions(
                    precision=precision, cost=cost, db=db, solver=solver,
                    io="precision" if any("precisionio" in s.split("-") for s in strategies) else "model"),
                    guard_options(guards))
            elif peer == "sdpa":
                from tessera.zoo import sdpa_form

                fn = sdpa_form(module)
                if fn is None:
                    continue  # only an attention case has a flash form
            else:
                fn = module if peer == "eager" else _inductor(module, _MODES[peer], guards)
            call = fp32_args if peer == DYNAMO else args
            with torch.no_grad():
                t0 = time.perf_counter()
                out = fn(*call)
                for _ in range(2):
                    out = fn(*call)
                warm = time.perf_counter() - t0
                if peer == DYNAMO:
                    extra = {"graphs": len(compiled), "kernels": sum(len(c.exe.steps) for c in compiled),
                             "opaque": sorted({o for c in compiled for o in c.bridge.opaque}),
                             "tuning": [c.result.tuning if c.result else "plan cache" for c in compiled],
                             "stages": [getattr(c, "stages", {}) for c in compiled],  # seconds per compile step
                             # each graph's kernels (name, backend, primitives), to set beside the ONNX path's plan
                             "plan": [_plan_rows(c.exe) if hasattr(c, "exe") else None for c in compiled]}
                err, ok = _check(out, ref, out_names, precision)
                ms = profile_callable(lambda: fn(*call), GPU_REPS, dev, peer).busy_us / 1e3 \
                    if timing == "gpu" else median_ms(lambda: fn(*call), dev)
            logger.info("bench %s %s: %s warmed up in %.1f s, %.3f ms", name, precision, peer, warm, ms)
            entries.append(Entry(peer, ms, err, ok, extra={"warmup_s": round(warm, 2), **extra}))
            if run_profile:
                profiles.append((len(entries) - 1,
                                 lambda fn=fn, call=call, peer=peer: profile_callable(lambda: fn(*call), reps, dev, peer)))
            checkpoint()
    for i, run in profiles:
        entries[i].extra["run_profile"] = run().to_json()
        checkpoint()
    return _document(name, precision, dev, timing, guards, entries)


def _plan_rows(exe: Executable) -> list[dict[str, Any]]:
    """Every kernel of an executable's plan (`plan_document`): name, backend, primitive count and
    schedule. From the plan, not a CompileResult, since a plan from the plan cache has none."""
    return [{"name": k["name"], "backend": k.get("backend"), "prims": len(k["prims"]),
             "schedule": k.get("schedule")} for k in exe.plan["kernels"]]


def _document(name: str, precision: str, dev: torch.device, timing: str, guards: str,
              entries: Sequence[Entry]) -> dict[str, Any]:
    """The JSON document of a bench run over `entries`; ratios are against the fastest peer."""
    peers_ms = [e.ms for e in entries if not e.name.startswith("tessera")]
    best = min(peers_ms) if peers_ms else None
    return {
        "model": name, "precision": precision, "device": torch.cuda.get_device_name() if dev.type == "cuda"
        else platform.processor() or platform.machine(),
        "versions": {"torch": torch.__version__, "python": platform.python_version(), **_versions()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timing": timing,
        "guards": guards,
        "entries": [{**asdict(e), "vs_best_peer": (e.ms / best) if best else None} for e in entries],
        **({} if dev.type == "cuda" else {"note": CPU_NOTE}),
    }


def _is_factory(model: str) -> bool:
    return ".py:" in model and not model.endswith(".onnx")


def user_model(model: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """(module in eval mode, example inputs) from the pair itself or from FILE.py:FUNC."""
    if isinstance(model, str):
        import importlib.util

        file, _, func = model.rpartition(":")
        if not Path(file).is_file():
            raise TesseraError(f"{file}: no such file (bench FILE.py:FUNC, FUNC returning (module, example_inputs))")
        spec = importlib.util.spec_from_file_location(Path(file).stem, file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # the user's own code, which they asked to benchmark
        if not callable(getattr(mod, func, None)):
            raise TesseraError(f"{file} has no function {func!r}")
        model = getattr(mod, func)()
    if not (isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], torch.nn.Module)):
        raise TesseraError("a PyTorch model to bench is a pair (module, example_inputs)")
    module, example = model
    return module.eval(), tuple(example) if isinstance(example, (list, tuple)) else (example,)


def module_onnx(module: torch.nn.Module, example: Sequence[Any], out: Path, name: str) -> Path:
    """The module through the PyTorch frontend, saved as the ONNX model the ONNX path compiles."""
    import onnx

    from tessera.frontend.fx import aten_graph, to_onnx

    try:
        gm = aten_graph(module, list(example))
    except Exception as e:  # noqa: BLE001 - tracing raises whatever the model's code raises
        raise TesseraError(f"{name} does not trace as one graph ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                           "bench needs one graph for the ONNX path: time it with torch.compile(backend='tessera') "
                           "instead") from None
    path = out / f"{name}.onnx"
    onnx.save(to_onnx(gm, list(example), set(), name).model, str(path))
    return path


# On a CPU tessera's kernels run in Triton's interpreter: the times check that the comparison runs,
# and say nothing about speed.
CPU_NOTE = "CPU run: tessera's kernels ran in Triton's interpreter; these times are not a benchmark"


def _versions() -> dict[str, str]:
    out = {}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        pass
    import onnxruntime
    out["onnxruntime"] = onnxruntime.__version__
    return out


def format_table(doc: dict[str, Any]) -> str:
    gpu = " (GPU time per call: while any of its kernels ran)" if doc.get("timing") == "gpu" else ""
    lines = [f"{doc['model']} ({doc['precision']}) on {doc['device']}, {doc['date'][:10]}{gpu}",
             f"{'contender':<26}{'ms':>10}{'vs best peer':>14}{'rel L2':>11}  check"]
    for e in doc["entries"]:
        ratio = f"{e['vs_best_peer']:.2f}x" if e["vs_best_peer"] else "-"
        lines.append(f"{e['name']:<26}{e['ms']:>10.3f}{ratio:>14}{e['rel_l2']:>11.1e}  "
                     f"{'PASS' if e['passed'] else 'FAIL'}")
    for e in doc["entries"]:  # a tessera row timed without its CUDA graph is not the usual tessera row
        why = (e.get("extra") or {}).get("capture_error")
        if why:
            lines.append(f"{e['name']}: ran launch by launch; its CUDA-graph capture failed: {why}")
    if doc.get("note"):
        lines.append(doc["note"])
    return "\n".join(lines)
