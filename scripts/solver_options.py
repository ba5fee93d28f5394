"""CBC's options (and HiGHS) timed on every subgraph instance that compiling some models solves.

    python scripts/solver_options.py MODEL.onnx ... [--precisions fp32,fp16] [--variants "cbc:,cbc:probingCuts off,highs"]

Each model is compiled with the analytical cost at each precision; every binary program the
orchestrator solves is kept with its greedy warm start. Then each variant solves every instance
again (`cbc:OPT+OPT` passes CBC those command-line options; `cbc:` is CBC as tessera calls it,
before its own options), and the script prints seconds per model and variant, the instances whose
objectives differ (there must be none), and the slowest instances. The variants run in this one
process: CBC runs as a child process anyway, and OR-Tools is not imported.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pulp

import tessera.orchestrate.orchestrator as orchestrator
import tessera.orchestrate.solver_cbc as solver_cbc
from tessera.cli.main import main as tessera_main
from tessera.orchestrate.blp import Problem, solve


def collect(models: list[Path], precisions: list[str], options: tuple[str, ...] = ()
            ) -> list[tuple[str, Problem, list[int] | None]]:
    """Every (model, instance, warm start) that compiling `models` solves (`options`: more
    `tessera compile` options, such as `--max-states`)."""
    found: list[tuple[str, Problem, list[int] | None]] = []
    real = orchestrator.solve
    current = ""

    def keep(p, solver, warm, time_limit):  # type: ignore[no-untyped-def]
        found.append((current, copy.deepcopy(p), list(warm) if warm else None))
        return real(p, solver=solver, warm=warm, time_limit=time_limit)

    orchestrator.solve = keep
    try:
        with tempfile.TemporaryDirectory() as out:
            for m in models:
                for prec in precisions:
                    current = f"{m.stem} {prec}"
                    with contextlib.redirect_stdout(io.StringIO()):  # each compile's summary
                        failed = tessera_main(["compile", str(m), "-o", out, "--cost", "analytical",
                                               "--precision", prec, *options])
                    if failed:
                        raise SystemExit(f"{m}: tessera compile failed")
    finally:
        orchestrator.solve = real
    return found


def timed(instances: list[tuple[str, Problem, list[int] | None]], variant: str) -> list[tuple[float, float, str]]:
    """(seconds, objective µs, status) of each instance under `variant`."""
    solver, _, opts = variant.partition(":")
    real = pulp.PULP_CBC_CMD
    if solver == "cbc":
        options = [o for o in opts.split("+") if o]
        # replaces tessera's own options too: `cbc:` is CBC's defaults
        solver_cbc.pulp.PULP_CBC_CMD = lambda **kw: real(**{**kw, "options": options})  # type: ignore[misc]
    try:
        rows = []
        for _, p, warm in instances:
            t = time.perf_counter()
            _, _, st = solve(copy.deepcopy(p), solver=solver, warm=warm)
            rows.append((time.perf_counter() - t, st.objective * 1e6, st.status))
        return rows
    finally:
        solver_cbc.pulp.PULP_CBC_CMD = real  # type: ignore[misc]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--precisions", default="fp32,fp16")
    ap.add_argument("--variants", default="cbc:,cbc:probingCuts off,highs")
    a = ap.parse_args()
    instances = collect(a.models, a.precisions.split(","))
    variants = a.variants.split(",")
    results = {v: timed(instances, v) for v in variants}
    per: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(variants))
    for i, (model, _, _) in enumerate(instances):
        for j, v in enumerate(variants):
            per[model][j] += results[v][i][0]
    print(f"{len(instances)} instances; seconds per model and variant\n")
    print("| model | instances | " + " | ".join(variants) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in variants) + " |")
    for model, secs in per.items():
        n = sum(1 for m, _, _ in instances if m == model)
        print(f"| {model} | {n} | " + " | ".join(f"{s:.2f}" for s in secs) + " |")
    totals = [sum(r[0] for r in results[v]) for v in variants]
    print(f"| all | {len(instances)} | " + " | ".join(f"{s:.2f}" for s in totals) + " |")
    # equal within the solvers' own tolerances (HiGHS and CBC stop at 1e-6 of feasibility)
    differ = [i for i in range(len(instances))
              if max(results[v][i][1] for v in variants) - min(results[v][i][1] for v in variants)
              > 1e-6 * max(abs(results[v][i][1]) for v in variants) or
              any(results[v][i][2] != "optimal" for v in variants)]
    print(f"\ninstances whose objective (beyond 1e-6 relative) or status differ: {len(differ)}")
    for i in differ:
        print("  ", instances[i][0], [(results[v][i][1], results[v][i][2]) for v in variants])
    slow = sorted(range(len(instances)), key=lambda i: -max(results[v][i][0] for v in variants))[:8]
    print("\nslowest instances (model, candidates, seconds per variant):")
    for i in slow:
        print("  ", instances[i][0], len(instances[i][1].candidates), [round(results[v][i][0], 2) for v in variants])
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
