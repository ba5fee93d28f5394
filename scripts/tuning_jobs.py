"""How many kernels a measured compile times, by kind, counted on a CPU (issue 14: cold tuning <= 5 min).

    PYTHONPATH=. python3 scripts/tuning_jobs.py ../shared/models/segformer_b0.onnx [--precision fp16]

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]  # the compile asks; nothing launches
    torch.cuda.get_device_name = lambda *_: "NVIDIA H100 80GB HBM3"  # type: ignore[assignment]
    from tessera.compiler import CompileOptions, compile_model

    prof = CountingProfiler()
    t = time.perf_counter()
    result = compile_model(a.model, CompileOptions(cost="measured", precision=a.precision, io="precision",
                                                   db=tempfile.mktemp(suffix=".db"), solver="highs", gpu="h100"),
                           profiler=prof)
    doc = {"model": a.model, "precision": a.precision, "jobs": sum(prof.jobs.values()), "by_kind": dict(prof.jobs),
           "distinct_signatures": {k: len(v) for k, v in prof.signatures.items()}, "batches": prof.batches,
           "plan_kernels": len(result.kernels), "cpu_s": round(time.perf_counter() - t, 1)}
    print(json.dumps(doc, indent=1))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
