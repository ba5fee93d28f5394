"""How many kernels a measured compile times, by kind, counted on a CPU (issue 14: cold tuning <= 5 min).

    PYTHONPATH=. python3 scripts/tuning_jobs.py ../shared/models/segformer_b0.onnx [--precision fp16]
        [--rewrites on] [--costs analytical] [--json FILE]     (TESSERA_LOG=info: each pass and batch)

Runs the whole measured compile (layout pricing, candidates, templates, chains, post-solve
schedules) against a profiler that times nothing: each job gets a made-up cost (a hash of its key,
growing with its primitive count), so the counts are those of a cold compile but the plan is not a
real one and later rounds (schedule walks that follow the fastest) may differ from a GPU's. The
compile believes a GPU named like an H100 is there; nothing reaches one.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class CountingProfiler:
    """Counts jobs by schedule kind (library calls and generated kernels at their default are
    "library/default") and distinct kernel signatures."""

    def __init__(self) -> None:
        self.jobs: collections.Counter = collections.Counter()
        self.signatures: dict[str, set[str]] = collections.defaultdict(set)
        self.batches = 0

    def measure(self, jobs: Any, record: Any) -> None:
        self.batches += 1
        for i, j in enumerate(jobs):
            kind = type(j.schedule).__name__ if j.schedule is not None else "library/default"
            self.jobs[kind] += 1
            self.signatures[kind].add(j.key.signature)
            h = zlib.crc32((j.key.signature + j.key.schedule).encode()) % 997 / 997
            record(i, 1e-6 * (1 + h) * max(1, len(j.prims)) ** 0.5, "")

    def close(self) -> None:
        pass


class AnalyticalProfiler(CountingProfiler):
    """CountingProfiler's counts, with each job priced by the analytical model of its kernel alone
    (a template schedule's price varies a little by its key): decisions that follow costs, such as
    which rewrites pay, resemble a GPU's more than made-up costs do."""

    def __init__(self, precision: str) -> None:
        super().__init__()
        from tessera.cost.devices import device

        self.precision, self.device = precision, device("h100")

    def price(self, job: Any) -> float:
        from tessera.cost.analytical import AnalyticalCost
        from tessera.cost.profiler import kernel_graph
        from tessera.orchestrate.candidates import Candidate
        from tessera.orchestrate.graphview import build_ograph

        og = build_ograph(kernel_graph(job)[0])
        c = Candidate(og.all, og.graph_outputs & og.all, 0)
        h = zlib.crc32(job.key.schedule.encode()) % 997 / 997
        return AnalyticalCost(og, self.device, self.precision)(c) * (1 + 0.2 * h * (job.schedule is not None))

    def measure(self, jobs: Any, record: Any) -> None:
        super().measure(jobs, lambda *_: None)
        for i, j in enumerate(jobs):
            record(i, self.price(j), "")


def main() -> int:
    from tessera.compiler import CompileOptions, compile_model
    from tessera.log import configure
    from tessera.rewrite.search import REWRITE_MODES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--rewrites", choices=REWRITE_MODES, default=CompileOptions.rewrites)
    ap.add_argument("--costs", choices=("made-up", "analytical"), default="made-up",
                    help="what each job is priced at (analytical: the model's estimate of the kernel alone)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]  # the compile asks; nothing launches
    torch.cuda.get_device_name = lambda *_: "NVIDIA H100 80GB HBM3"  # type: ignore[assignment]

    configure()  # TESSERA_LOG=info shows the passes and each tuning batch

    prof = CountingProfiler() if a.costs == "made-up" else AnalyticalProfiler(a.precision)
    t = time.perf_counter()
    result = compile_model(a.model, CompileOptions(cost="measured", precision=a.precision, io="precision",
                                                   db=tempfile.mktemp(suffix=".db"), solver="highs", gpu="h100",
                                                   rewrites=a.rewrites),
                           profiler=prof)
    doc = {"model": a.model, "precision": a.precision, "rewrites": a.rewrites, "costs": a.costs, "jobs": sum(prof.jobs.values()), "by_kind": dict(prof.jobs),
           "distinct_signatures": {k: len(v) for k, v in prof.signatures.items()}, "batches": prof.batches,
           "plan_kernels": len(result.kernels), "cpu_s": round(time.perf_counter() - t, 1)}
    print(json.dumps(doc, indent=1))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
