"""The compile driver: a linear list of named passes.

    load -> fission -> ograph -> cost -> orchestrate -> write

Each pass name is also its key in `CompileResult.timings` and in the report.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from tessera.codegen.select import TritonLegality
from tessera.cost import AnalyticalCost, device
from tessera.errors import TesseraError
from tessera.fission import FissionResult, fission
from tessera.frontend import LoadedModel, load
from tessera.orchestrate import DEFAULT_SOLVER, CandidateRules, OGraph, Plan, build_ograph, orchestrate
from tessera.orchestrate.report import write_report
from tessera.runtime.artifact import save_artifact
from tessera.runtime.executable import Executable
from tessera.version import __version__


@dataclass
class CompileOptions:
    strategy: str = "optimal"
    cost: str = "analytical"
    gpu: str = "h100"
    precision: str = "fp32"
    solver: str = DEFAULT_SOLVER
    time_limit: float = 60.0
    max_states: int = 2000
    max_kernel_nodes: int = 12
    input_shapes: Mapping[str, Sequence[int]] | None = None


@dataclass
class CompileResult:
    loaded: LoadedModel
    fission: FissionResult
    ograph: OGraph
    plan: Plan
    timings: dict[str, float] = field(default_factory=dict)


PASSES = ("load", "fission", "ograph", "cost", "orchestrate")


def compile_model(source: Any, options: CompileOptions | None = None,
                  progress: Callable[[int, int], None] | None = None) -> CompileResult:
    """Load, split and orchestrate a model; the plan is not yet code (issue 4)."""
    opt = options or CompileOptions()
    if opt.cost != "analytical":
        raise TesseraError(f"--cost {opt.cost} needs GPU measurements, which are not available yet; use analytical")
    try:
        dev = device(opt.gpu)
    except KeyError as e:
        raise TesseraError(str(e.args[0])) from None
    timings: dict[str, float] = {}
    t = time.perf_counter()

    def done(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        timings[name] = now - t
        t = now

    loaded = load(source, opt.input_shapes)
    done("load")
    fis = fission(loaded.graph)
    done("fission")
    og = build_ograph(fis.graph)
    done("ograph")
    cost = AnalyticalCost(og, dev, opt.precision)
    done("cost")
    plan = orchestrate(og, cost, strategy=opt.strategy, rules=CandidateRules(max_nodes=opt.max_kernel_nodes),
                       legality=TritonLegality(),
                       solver=opt.solver, time_limit=opt.time_limit, max_states=opt.max_states,
                       model=loaded.label, device=dev.name, precision=opt.precision, cost_model=opt.cost,
                       progress=progress)
    done("orchestrate")
    return CompileResult(loaded, fis, og, plan, timings)


def plan_document(result: CompileResult) -> dict[str, Any]:
    """plan.json's content: the plan, pass timings and opaque operators."""
    doc = result.plan.to_json()
    doc["timings_s"] = {k: round(v, 4) for k, v in result.timings.items()}
    doc["opaque"] = [{"node": o.node, "op": o.op_type, "reason": o.reason} for o in result.fission.opaque]
    return doc


def write_artifacts(result: CompileResult, out: Path) -> None:
    """The artifact directory: plan.json, report.html and what `tessera.load` needs."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan_document(result), indent=1))
    write_report(result.plan, result.ograph, out / "report.html")
    save_artifact(out, result.fission.graph, result.loaded.model,
                  {"tessera": __version__, "model": result.loaded.label, "precision": result.plan.precision,
                   "input_shapes": {k: list(v) for k, v in result.loaded.input_shapes.items()}})


def compile(source: Any, options: CompileOptions | None = None, device: str | torch.device = "cpu") -> Executable:
    """Compile a model into a callable that takes and returns torch tensors."""
    result = compile_model(source, options)
    return Executable(result.fission.graph, plan_document(result), device)
