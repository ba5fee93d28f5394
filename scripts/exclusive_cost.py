"""What `Executable.exclusive` (the lock and the stream check every GPU call takes) costs in host time.

Compiles one model (analytical cost: the plan does not matter here), then times in one process, per call
(median of 5 runs of `--calls` calls, one synchronize at the end of each run):
- `run`: the user call, as shipped;
- `run, lock only`: the same with `exclusive` reduced to the lock (no `current_stream` read);
- `run, unguarded`: the same with no lock at all;
- `exclusive()` alone, `current_stream()` alone.

    PYTHONPATH=. python3 scripts/exclusive_cost.py --model ../shared/models/bert_tiny.onnx [--calls 2000]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable

import torch

import tessera
from tessera.runtime.executable import Executable
from tessera.verify import random_inputs


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Median over 5 runs of the host time per call of `calls` calls (one synchronize a run)."""
    runs = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="../shared/models/bert_tiny.onnx")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    exe = tessera.compile(args.model, tessera.CompileOptions(cost="analytical"), device="cuda")
    feeds = {k: torch.from_numpy(v).cuda() for k, v in random_inputs(exe.graph, seed=0).items()}
    exe.run(**feeds)  # compiles the kernels and captures the graph
    lock = exe._lock

    @contextlib.contextmanager
    def lock_only():
        with lock:
            yield

    shipped = Executable.exclusive
    rows = [("run", per_call_us(lambda: exe.run(**feeds), args.calls))]
    exe.exclusive = lock_only
    rows.append(("run, lock only", per_call_us(lambda: exe.run(**feeds), args.calls)))
    exe.exclusive = contextlib.nullcontext
    rows.append(("run, unguarded", per_call_us(lambda: exe.run(**feeds), args.calls)))
    del exe.exclusive
    assert exe.exclusive.__func__ is shipped

    def enter_exit() -> None:
        with exe.exclusive():
            pass

    rows.append(("exclusive() alone", per_call_us(enter_exit, args.calls * 10)))
    rows.append(("current_stream() alone", per_call_us(lambda: torch.cuda.current_stream(exe.device), args.calls * 10)))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.model}; host µs per call, "
          f"median of 5 runs of {args.calls} calls")
    print("| what | µs per call |\n| --- | ---: |")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
