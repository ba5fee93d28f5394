"""Replay a GPU run's measured compile on the CPU: the profiler answers each job from the run's tuning log.

A bench row's `tuning.jsonl.gz` holds every (kernel signature, schedule) the GPU compile timed. Compiling the
same model here with a profiler that looks those up rebuilds the same candidates, the same solve and the same
plan, in seconds and without a GPU, so one can ask what the solver saw: which candidates of a fusion were
timed and at what, and where the partition cut them apart. Jobs the log lacks are priced infinite (listed).

    python scripts/replay_tuning.py RUN/tuning.jsonl.gz MODEL.onnx fp16 [--device "NVIDIA H100 80GB HBM3"]
        [--grep reduce_sum,matmul] [--cuts]

`--grep OPS` lists the timed jobs whose primitives hold every op in OPS (their fastest schedule first);
`--cuts` the partition's cuts and the fusions each forbids. The model must be the one the run compiled
(`tessera.zoo.build` gives the zoo's, with its seed-0 weights).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera import compiler  # noqa: E402
from tessera.compiler import CompileOptions, CompileResult, compile_model  # noqa: E402
from tessera.cost.measured import Job, Record  # noqa: E402


class ReplayProfiler:
    """Each job's time from `times` ((signature, schedule) -> seconds); inf where the log has none."""

    def __init__(self, times: dict[tuple[str, str], float]) -> None:
        self.times = times
        self.jobs: list[tuple[Job, float]] = []
        self.missing: Counter = Counter()

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            t = self.times.get((j.key.signature, j.key.schedule))
            if t is None:
                self.missing[j.key.schedule.split("-")[0]] += 1
            t = math.inf if t is None or t != t else t
            self.jobs.append((j, t))
            record(i, t, "" if math.isfinite(t) else "not in the replayed log")


def read_log(path: Path) -> dict[tuple[str, str], float]:
    """(signature, schedule) -> seconds of a tuning log (JSON lines, gzipped or not)."""
    opener = gzip.open if path.suffix == ".gz" else open
    times = {}
    with opener(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            if "seconds" in r:  # (chain feature records have none)
                times[(r["signature"], r["schedule"])] = math.inf if r["seconds"] is None else float(r["seconds"])
    return times


def replay(log: Path, model: Path, precision: str, io: str = "precision",
           device: str = "NVIDIA H100 80GB HBM3") -> tuple[CompileResult, ReplayProfiler]:
    """The measured compile of `model` as the GPU run of `log` made it, and the profiler that answered it.
    torch.cuda's availability and device name stay patched afterwards (the preset is the run's)."""
    prof = ReplayProfiler(read_log(log))
    # a measured compile as the GPU ran it: its device name picks the preset, the profiler is the log
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *a: device  # type: ignore[assignment]
    compiler.new_profiler = lambda opt: prof  # type: ignore[assignment]
    res = compile_model(onnx.load(model), CompileOptions(cost="measured", db=":memory:", precision=precision, io=io))
    return res, prof


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("precision")
    ap.add_argument("--device", default="NVIDIA H100 80GB HBM3", help="the GPU name the run reported (its preset)")
    ap.add_argument("--grep", default="", help="comma-separated ops: list the timed jobs holding all of them")
    ap.add_argument("--cuts", action="store_true")
    ap.add_argument("--io", choices=["precision", "model"], default="precision",
                    help="the compile's --io: the bench rows' optimal-precisionio strategy takes precision")
    args = ap.parse_args()
    res, prof = replay(args.log, args.model, args.precision, args.io, args.device)
    print(f"{len(res.kernels)} kernels, estimated {res.plan.estimated_total_s * 1e6:.1f} us; {len(prof.jobs)} jobs, "
          f"{sum(prof.missing.values())} not in the log {dict(prof.missing)}")
    if args.cuts:
        for c in res.plan.cuts:
            print(f"cut at {c['position']}: {', '.join(f'{a} -> {b}' for a, b in c['lost_fusions'])}")
    if args.grep:
        want = Counter(args.grep.split(","))
        best: dict[str, tuple[float, str, list[str]]] = {}
        for j, t in prof.jobs:
            ops = Counter(n.op for n in j.prims)
            if all(ops[o] >= k for o, k in want.items()):
                sig = j.key.signature
                if sig not in best or t < best[sig][0]:
                    best[sig] = (t, j.key.schedule, [n.name for n in j.prims])
        for t, sched, names in sorted(best.values()):
            print(f"{t * 1e6:8.2f} us  {sched:34s} {len(names):2d} prims: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
