"""A profiler for tests: deterministic fake costs, a log of every measurement, optional slowness.

Run as a script it tunes and plans one model (what a killed-and-resumed tuning run does):
    python tests/fake_profiler.py MODEL DB LOG [DELAY [START]]  -> prints the plan's kernels as JSON
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.cost.measured import Job, MeasuredCost, Record  # noqa: E402


class FakeProfiler:
    """seconds = a hash of the signature; jobs whose signature is in `fail` fail."""

    def __init__(self, log: str | None = None, delay: float = 0.0, fail: frozenset[str] = frozenset()) -> None:
        self.log, self.delay, self.fail = log, delay, fail
        self.calls = 0

    def _write(self, line: str) -> None:
        if self.log:
            with open(self.log, "a") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            self._write(f"begin {j.key.signature}")
            time.sleep(self.delay)
            self.calls += 1
            if j.key.signature in self.fail:
                record(i, math.inf, "fake failure")
            else:
                record(i, 1e-6 + (int(j.key.signature[:6], 16) % 1000) * 1e-8 * len(j.prims), "")
            self._write(f"end {j.key.signature}")


def fake_seconds(job: tuple[str, int, bool]) -> tuple[float, str, int]:
    """FakeProfiler's cost of one job (signature, primitive count, fails), computed where it runs:
    returns (seconds, why, the pid of the process that computed it)."""
    signature, prims, fails = job
    if fails:
        return math.inf, "fake failure", os.getpid()
    return 1e-6 + (int(signature[:6], 16) % 1000) * 1e-8 * prims, "", os.getpid()


class PooledFakeProfiler(FakeProfiler):
    """FakeProfiler's costs, each computed in a worker of a `tessera.cost.worker` pool: the path
    GpuProfiler's workers start by, without a GPU. `worker_pids` names the processes that measured."""

    def __init__(self, workers: int = 2, log: str | None = None, fail: frozenset[str] = frozenset()) -> None:
        from tessera.cost.worker import WorkerPool

        super().__init__(log, 0.0, fail)
        self.pool = WorkerPool(workers)
        self.worker_pids: set[int] = set()

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        payloads = [(j.key.signature, len(j.prims), j.key.signature in self.fail) for j in jobs]
        with contextlib.closing(self.pool.run(fake_seconds, payloads, timeout_s=60)) as outcomes:
            for o in outcomes:
                if not o.ok:
                    raise RuntimeError(f"job {o.index}: {o.error or o.died}")
                seconds, why, pid = o.value
                self.calls += 1
                self.worker_pids.add(pid)
                record(o.index, seconds, why)

    def close(self) -> None:
        self.pool.close()


class TemplatePrologueProfiler:
    """Templates of `template` (a schedule class) cost 1.5 us whatever they fuse, other kernels 1 us
    per primitive. A library job holding an operand prologue fails, as the real profiler's build
    would; `failed` counts them (the compiler should form none)."""

    def __init__(self, template: type) -> None:
        self.template, self.failed = template, 0

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        from tessera.codegen.select import operand_prologue

        for i, j in enumerate(jobs):
            if not isinstance(j.schedule, self.template) and operand_prologue(j.prims):
                self.failed += 1
                record(i, math.inf, "a library call cannot compute its operands' prologue")
            else:
                record(i, 1.5e-6 if isinstance(j.schedule, self.template) else 1e-6 * len(j.prims), "")


class RandomTemplateProfiler:
    """For the fuzzer's `--tuning fake`: every job costs a hash of its signature (so plans mix
    library calls, templates, operand prologues, norms and chains at random, reproducibly), templates
    a third less, which makes them win often, and a chain launched late a tenth less for half the signatures. A library job holding an operand prologue fails, as the
    real profiler's build would."""

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        from tessera.codegen.kernels import ChainSchedule, ConvSchedule, GemmSchedule
        from tessera.codegen.select import operand_prologue

        for i, j in enumerate(jobs):
            template = isinstance(j.schedule, (GemmSchedule, ConvSchedule, ChainSchedule))
            if not template and operand_prologue(j.prims):
                record(i, math.inf, "a library call cannot compute its operands' prologue")
                continue
            base = 1e-6 + (int(j.key.signature[:6], 16) % 1000) * 1e-9 * len(j.prims)
            # a chain launched late (ChainSchedule.late) wins for half the signatures, so plans hold some
            late = getattr(j.schedule, "late", False) and int(j.key.signature[6:8], 16) % 2
            record(i, base * (0.66 if template else 1.0) * (0.9 if late else 1.0), "")

    def close(self) -> None:
        pass


def plan_with(model: str, db_path: str, log: str | None, delay: float) -> list[list[str]]:
    from tessera.cost.db import TuningDB
    from tessera.codegen.select import TritonLegality
    from tessera.fission import fission
    from tessera.frontend import load
    from tessera.orchestrate import build_ograph, orchestrate

    og = build_ograph(fission(load(model).graph).graph)
    with TuningDB(db_path) as db:
        cost = MeasuredCost(og, db, FakeProfiler(log, delay), "fake-gpu", "v1")
        plan = orchestrate(og, cost, legality=TritonLegality())
    return [k.prims for k in plan.kernels]


def core_measurements(og, kind: type, rules, legality, db_path) -> tuple[dict[str, list], str | None]:
    """Orchestrate `og` with templates measured by a profiler whose schedules differ in cost (crc32,
    the same in every process): the `kind` schedules timed per kernel signature, and the first
    signature's fastest schedule key (the signature timed at the most schedules)."""
    import zlib
    from collections import defaultdict

    from tessera.cost.db import TuningDB
    from tessera.orchestrate import orchestrate

    seen: dict[str, list] = defaultdict(list)

    class Profiler:
        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                if isinstance(j.schedule, kind):
                    seen[j.key.signature].append(j.schedule)
                record(i, 1e-5 * (1 + zlib.crc32(j.key.schedule.encode()) % 997 / 997), "")

    with TuningDB(db_path) as db:
        orchestrate(og, MeasuredCost(og, db, Profiler(), "fake", "v1", templates=True), rules=rules, legality=legality)
        first = max(seen, key=lambda sig: len(seen[sig]), default=None)
        best = db.best("fake", "v1", first).key.schedule if first is not None else None
    return dict(seen), best


if __name__ == "__main__":
    if len(sys.argv) > 5:  # a start time (epoch seconds): several processes begin tuning together
        time.sleep(max(0.0, float(sys.argv[5]) - time.time()))
    print(json.dumps(plan_with(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0)))
