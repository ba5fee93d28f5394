"""Check that subgraphs found to repeat one another really have the same candidates, on whole models.

    PYTHONPATH=. python3 scripts/check_repeats.py MODEL.onnx [MODEL.onnx ...] [--precision fp16]

Compiles each model as a measured compile would (a GPU named like an H100 is pretended; every
job is priced by the analytical model, `tuning_jobs.AnalyticalProfiler`) and, where the
orchestrator partitions it, enumerates every subgraph afresh: each one must have been given exactly
those candidates, where it took them from another of its structure key (`orchestrate/repeats.py`)
moved by the distance between them. Prints per model the subgraphs, how many are distinct, how many
repeat, and any mismatch; exits 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--precision", default="fp16")
    a = ap.parse_args()
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *_: "NVIDIA H100 80GB HBM3"  # type: ignore[assignment]
    from tuning_jobs import AnalyticalProfiler

    from tessera import compiler
    from tessera.orchestrate import orchestrator
    from tessera.orchestrate.partition import Partitioner

    mismatches = 0
    real = orchestrator.orchestrate

    def checked(og: Any, cost: Any, *, strategy: str = "optimal", rules: Any = None, legality: Any = None,
                max_states: int = 2000, **kw: Any) -> Any:
        nonlocal mismatches
        subs, _, found, origin = orchestrator._all_candidates(og, Partitioner(og, max_states), strategy, rules,
                                                              legality)
        for k, sub in enumerate(subs):  # what each subgraph was given against what enumerating it gives
            fresh = orchestrator._candidates(og, sub, strategy, rules, legality)
            for given, own in zip(found[k], fresh):
                if {(c.nodes, c.outputs, c.inputs) for c in given} != {(c.nodes, c.outputs, c.inputs) for c in own}:
                    mismatches += 1
                    print(f"  mismatch: subgraph {k} (candidates of {origin[k]})")
        print(f"  {len(subs)} subgraphs, {origin.count(None)} distinct, {len(subs) - origin.count(None)} repeats")
        return real(og, cost, strategy=strategy, rules=rules, legality=legality, max_states=max_states, **kw)

    compiler.orchestrate = checked  # type: ignore[assignment]
    for m in a.models:
        print(m)
        compiler.compile_model(m, compiler.CompileOptions(cost="measured", precision=a.precision, io="precision",
                                                          db=tempfile.mktemp(suffix=".db"), solver="highs", gpu="h100"),
                               profiler=AnalyticalProfiler(a.precision))
    print(f"{mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
