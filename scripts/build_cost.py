"""What a cold measured compile spends compiling kernels, estimated on a CPU (issue 14: cold tuning <= 5 min).

    PYTHONPATH=. python3 scripts/build_cost.py ../shared/models/segformer_b0.onnx [--precision fp16]
        [--per-kind 25] [--json FILE]

Collects every job a cold measured compile hands the profiler (as `tuning_jobs.py` does, with a
profiler that times nothing), then compiles a random sample of each kind for an H100 (sm_90) with
Triton on this machine, exactly as a build worker compiles them (`Executable.precompile`: the
kernel and, for a template, the library reference it is checked against), through a stand-in
Triton driver that names the target and launches nothing. Triton's compile (its passes, LLVM and
ptxas) runs here as it runs on the GPU machine's host, so the per-kind means times the job counts
estimate the build workers' CPU seconds; on the H100 machine 14 build workers share them.

The Triton on this machine may be newer than the GPU machine's (3.9 against 3.6). Each compile gets
a fresh Triton cache directory of this run's own, so nothing is read from an earlier run.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


class Collecting:
    """Keeps every job, priced as `tuning_jobs.CountingProfiler` prices them."""

    def __init__(self) -> None:
        from tuning_jobs import CountingProfiler

        self.counting = CountingProfiler()
        self.jobs: list[Any] = []

    def measure(self, jobs: Any, record: Any) -> None:
        self.jobs += list(jobs)
        self.counting.measure(jobs, record)

    def close(self) -> None:
        pass


class _CompileOnlyDriver:
    """Triton's active driver for compiling without a GPU: the target is an H100's; nothing runs."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> Any:
        return torch.device("cpu")

    def get_device_interface(self) -> Any:
        return torch.cuda

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty


def collect(model: str, precision: str) -> list[Any]:
    """The jobs of a cold measured compile of `model` (a GPU named like an H100 is pretended)."""
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *_: "NVIDIA H100 80GB HBM3"  # type: ignore[assignment]
    from tessera.compiler import CompileOptions, compile_model

    prof = Collecting()
    compile_model(model, CompileOptions(cost="measured", precision=precision, io="precision",
                                        db=tempfile.mktemp(suffix=".db"), solver="highs", gpu="h100"), profiler=prof)
    return prof.jobs


def compile_seconds(job: Any) -> float:
    """CPU seconds (ptxas's included: a child process) to compile one job's kernels for sm_90, as a
    build worker does."""
    from tessera.cost.profiler import _inputs, _reference, kernel_graph
    from tessera.runtime.executable import Executable

    mini, plan = kernel_graph(job)
    exe, ref = Executable(mini, plan, "cpu", cuda_graph=False), _reference(mini, plan, "cpu")
    t = _cpu()
    for e in (exe, ref):
        if e is not None:
            e.precompile(_inputs(mini, "cpu", None))
    return _cpu() - t


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--per-kind", type=int, default=25, help="jobs compiled per kind (a random sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    jobs = collect(a.model, a.precision)
    # Compile for the GPU, not in the interpreter the CPU compile above ran its legality checks in.
    import triton.runtime

    import tessera.runtime.executable as executable

    executable.use_interpreter = lambda device: None  # type: ignore[assignment]
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="build_cost_")
    triton.runtime.driver.set_active(_CompileOnlyDriver())
    by_kind: dict[str, list[Any]] = collections.defaultdict(list)
    for j in jobs:
        by_kind[type(j.schedule).__name__ if j.schedule is not None else "library/default"].append(j)
    rng = random.Random(a.seed)
    compile_seconds(jobs[0])  # Triton's first compile loads its backend: not a job's cost
    kinds = {}
    for kind, js in sorted(by_kind.items()):
        sample = rng.sample(js, min(a.per_kind, len(js)))
        secs = [compile_seconds(j) for j in sample]
        mean = statistics.mean(secs)
        kinds[kind] = {"jobs": len(js), "sampled": len(secs), "mean_s": round(mean, 4),
                       "median_s": round(statistics.median(secs), 4), "estimated_cpu_s": round(mean * len(js), 1)}
        print(f"{kind:16s} {len(js):5d} jobs  sampled {len(secs):3d}  mean {mean * 1e3:6.0f} ms  "
              f"estimated {mean * len(js):7.1f} CPU s")
    total = sum(k["estimated_cpu_s"] for k in kinds.values())
    print(f"{'all':16s} {len(jobs):5d} jobs  estimated {total:.0f} CPU s of Triton compiles "
          f"({total / 14:.0f} s over an H100 machine's 14 build workers)")
    if a.json:
        import triton

        a.json.write_text(json.dumps({"model": a.model, "precision": a.precision, "triton": triton.__version__,
                                      "per_kind": a.per_kind, "seed": a.seed, "jobs": len(jobs), "kinds": kinds,
                                      "estimated_cpu_s": round(total, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
