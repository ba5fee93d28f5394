"""Profiler worker processes (`tessera.cost.worker`): jobs, failures, clean-up, and a user's script
without a `__main__` guard (CPU only; each worker imports tessera, about 3 s).

The job functions below are module-level so that workers import them by name (`test_workers`,
importable there because the pool hands its workers the parent's sys.path)."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opcheck import models_dir

from tessera.cost.worker import Outcome, WorkerError, WorkerPool, function_path

MARKER = "the user's script ran"


def square(x: int) -> int:
    return x * x


def noisy(x: int) -> int:
    """Prints through Python and straight to fd 1: neither may reach the result channel."""
    print("noise from a job", flush=True)
    os.write(1, b"\x00\x00\x00\x00\x00\x00\x00\x08 raw bytes on fd 1\n")
    return x


def raises(x: int) -> int:
    raise ValueError(f"bad input {x}")


def exits(x: int) -> int:
    os._exit(7)


def hangs(x: int) -> int:
    time.sleep(600)
    return x


def dispatch(job: tuple[str, int]) -> int:
    """One batch of mixed jobs: the payload names the function."""
    return {"square": square, "exits": exits, "hangs": hangs, "raises": raises}[job[0]](job[1])


def identity(x: int) -> tuple[int, str | None, str | None]:
    return os.getpid(), os.environ.get("TESSERA_TEST_SLOT"), os.environ.get("TESSERA_TEST_INIT")


def gpu_setup(_: int) -> tuple[str | None, str, str | None, str | None]:
    """What the profiler's initializer and environment gave this worker."""
    from tessera.cost import profiler

    env = os.environ.get
    return env("CUDA_VISIBLE_DEVICES"), profiler._GPU, profiler._LOCK_PATH, env("TRITON_INTERPRET")


def host_threads(_: int) -> int:
    import torch

    return torch.get_num_threads()


def set_init(value: str) -> None:
    os.environ["TESSERA_TEST_INIT"] = value


def init_fails() -> None:
    raise RuntimeError("no GPU for this worker")


def fake_build(payload: tuple[str, str]) -> tuple[float, str, dict[str, float]]:
    """As the profiler's _build answers. "crash" always kills its worker; "flaky" kills the first
    worker that runs it (its flag file is gone after) and measures fine alone."""
    kind, flag = payload
    if kind == "fault":  # what _fail does on its own GPU fault: answer, then exit; counts its runs
        from tessera.cost.worker import exit_after_reply

        with open(flag, "a") as f:
            f.write(f"{os.getpid()}\n")
        exit_after_reply(3)
        return math.inf, "the GPU faulted running it", {"generate": 0.001}
    if kind == "crash" or (kind == "flaky" and os.path.exists(flag)):
        if kind == "flaky":
            os.remove(flag)
        os._exit(3)  # what _check_context does with a poisoned CUDA context
    return 1e-6, "", {"generate": 0.001}


def _alive(pid: int) -> bool:
    """The process exists, zombies included (a zombie keeps its /proc entry until reaped)."""
    return Path(f"/proc/{pid}").exists()


def _children() -> set[int]:
    """This process's child processes, zombies included."""
    me, out = os.getpid(), set()
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            out.add(int(d.name))
    return out


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _by_index(outcomes: list[Outcome]) -> dict[int, Outcome]:
    got = {o.index: o for o in outcomes}
    assert len(got) == len(outcomes)
    return got


def test_jobs_run_and_their_exceptions_come_back():
    fds, before = _fds(), _children()
    with WorkerPool(2) as pool:
        got = _by_index(list(pool.run(square, list(range(8)))))
        assert {i: o.value for i, o in got.items()} == {i: i * i for i in range(8)}
        assert all(o.ok for o in got.values())
        pids = set(pool.pids)
        # A job that raises is that job's failure, with the worker's traceback; the worker lives on.
        (bad,) = pool.run(raises, [5])
        assert isinstance(bad.error, ValueError) and "bad input 5" in str(bad.error)
        assert bad.died is None and bad.value is None and "in tessera worker" in "".join(bad.error.__notes__)
        # What a job prints, through Python or on fd 1, does not reach the result channel.
        assert [o.value for o in pool.run(noisy, [9])] == [9]
        assert set(pool.pids) == pids
    assert not any(_alive(p) for p in pids) and _children() == before
    assert _fds() == fds


def test_a_worker_that_exits_or_hangs_is_reported_and_replaced():
    before = _children()
    with WorkerPool(2) as pool:
        # The lost jobs are reported, the others run on: fresh workers take the places of the
        # dead and the killed.
        t0 = time.monotonic()
        got = _by_index(list(pool.run(dispatch, [("square", 3), ("exits", 0), ("square", 4), ("hangs", 0),
                                                 ("raises", 1), ("square", 5)], timeout_s=2.0)))
        assert time.monotonic() - t0 < 60
        assert [got[i].value for i in (0, 2, 5)] == [9, 16, 25]
        assert got[1].died == "the worker died (exit code 7)" and not got[1].timed_out
        assert got[3].timed_out and got[3].died == "timed out after 2 s and was killed"
        assert isinstance(got[4].error, ValueError) and got[4].died is None
        assert _children() - before == set(pool.pids)  # the dead and the killed are reaped, not zombies
    assert _children() == before


def test_stopping_early_kills_busy_workers_and_close_cleans_up():
    fds = _fds()
    pool = WorkerPool(2)
    outcomes = pool.run(dispatch, [("square", 1), ("hangs", 0), ("hangs", 0)])
    first = next(outcomes)
    assert first.value == 1
    started = set(pool.pids)
    outcomes.close()  # the caller stops waiting: workers still running jobs are killed
    assert not any(_alive(p) for p in started - set(pool.pids))
    assert [o.value for o in pool.run(square, [6])] == [36]  # the pool still works
    last = set(pool.pids)
    pool.close()
    assert pool.pids == [] and not any(_alive(p) for p in started | last)
    assert _fds() == fds


def test_initializer_and_environment_per_worker():
    with WorkerPool(2, set_init, lambda slot: (f"init{slot}",),
                    env=lambda slot: {"TESSERA_TEST_SLOT": str(slot)}) as pool:
        got = list(pool.run(identity, [0, 1, 2, 3]))
    # Each worker got its own slot's environment and initializer argument.
    seen = {(slot, init) for _, slot, init in (o.value for o in got)}
    assert seen and seen <= {("0", "init0"), ("1", "init1")}
    with WorkerPool(1, init_fails) as pool:
        with pytest.raises(WorkerError, match="no GPU for this worker"):
            list(pool.run(square, [1]))


def test_functions_of_main_are_refused():
    def local(x: int) -> int:
        return x

    assert function_path(square) == "test_workers:square"
    with pytest.raises(ValueError, match="__main__"):
        function_path(local)
    main_fn = type(square)(square.__code__, {}, "main_fn")
    main_fn.__module__ = "__main__"
    with pytest.raises(ValueError, match="__main__"):
        function_path(main_fn)
    with pytest.raises(ValueError, match="__main__"):
        function_path("__main__:square")


def test_profiler_retries_a_lost_job_alone(tmp_path):
    # GpuProfiler's batch-then-alone logic with a CPU job in place of _build.
    from tessera.cost.profiler import GpuProfiler

    flag = tmp_path / "flaky"
    flag.touch()
    prof = GpuProfiler(workers=2, timeout_s=60)
    got: dict[int, tuple[float, str]] = {}
    try:
        prof._run("build", fake_build, [("ok", ""), ("crash", ""), ("flaky", str(flag)), ("ok", "")], 2,
                  got.__setitem__)
    finally:
        prof.close()
    assert set(got) == {0, 1, 2, 3}
    assert got[0] == got[3] == (1e-6, "")
    assert got[1][0] == math.inf and "worker died" in got[1][1] and "exit code 3" in got[1][1]
    assert got[2] == (1e-6, "")  # killed a worker in the batch, measured fine alone
    assert prof.stats["generate"] > 0 and "build_phase" in prof.stats


def test_a_job_that_broke_its_worker_answers_once_and_the_worker_is_replaced(tmp_path):
    # A job that faults the GPU itself answers with its failure and its worker exits: it is not
    # re-run alone (one run, segformer_b0 lost ~7 s per such re-run), and the jobs after it get a
    # fresh worker, never the leaving one.
    from tessera.cost.profiler import GpuProfiler

    runs = tmp_path / "runs"
    prof = GpuProfiler(workers=1, timeout_s=60)
    got: dict[int, tuple[float, str]] = {}
    try:
        prof._run("build", fake_build, [("ok", ""), ("fault", str(runs)), ("ok", ""), ("fault", str(runs)),
                                        ("ok", "")], 1, got.__setitem__)
        pids = prof._pools["build"].pids
    finally:
        prof.close()
    assert set(got) == {0, 1, 2, 3, 4}
    assert got[0] == got[2] == got[4] == (1e-6, "")
    assert got[1] == got[3] == (math.inf, "the GPU faulted running it")
    faulted = runs.read_text().split()
    assert len(faulted) == 2 and len(set(faulted)) == 2  # each ran once, each in its own worker
    assert not set(faulted) & {str(p) for p in pids}  # both workers gone; the one left is fresh


def slow_build(payload: tuple[int, str, str]) -> tuple[float, str, dict[str, float]]:
    """A build that takes longer the later its job; "bad" ones fail. Logs when it ends."""
    i, kind, log = payload
    time.sleep(0.5 * i)
    with open(log, "a") as f:
        f.write(f"built {i} {time.time()}\n")
    return (math.inf, "build: bad", {}) if kind == "bad" else (0.0, "", {"compile": 0.5 * i})


def quick_time(payload: tuple[int, str, str]) -> tuple[float, str, dict[str, float]]:
    i, _, log = payload
    with open(log, "a") as f:
        f.write(f"timed {i} {time.time()}\n")
    return 1e-6 * (i + 1), "", {"timing": 0.001}


def test_measure_times_each_job_as_soon_as_it_is_built(tmp_path, monkeypatch):
    # The build and time phases overlap: the first job is timed while later ones still build,
    # every job is recorded once (failures too), and only the calling thread records.
    import threading

    from tessera.cost import profiler

    log = str(tmp_path / "log")
    monkeypatch.setattr(profiler, "_build", slow_build)
    monkeypatch.setattr(profiler, "_time", quick_time)
    monkeypatch.setattr(profiler, "kernel_graph", lambda job: job)
    prof = profiler.GpuProfiler(workers=2, timeout_s=60)
    got: dict[int, tuple[float, str]] = {}
    threads = set()

    def record(i: int, seconds: float, why: str) -> None:
        threads.add(threading.get_ident())
        assert i not in got
        got[i] = (seconds, why)

    jobs = [(i, "bad" if i == 3 else "ok", log) for i in range(6)]
    try:
        prof.measure(jobs, record)
    finally:
        prof.close()
    assert got == {i: (math.inf, "build: bad") if i == 3 else (1e-6 * (i + 1), "") for i in range(6)}
    assert threads == {threading.get_ident()}
    events = [line.split() for line in Path(log).read_text().splitlines()]
    first_timed = min(float(t) for what, _, t in events if what == "timed")
    last_built = max(float(t) for what, _, t in events if what == "built")
    assert first_timed < last_built
    assert prof.stats["compile"] > 0 and prof.stats["timing"] > 0


def test_profiler_workers_get_their_gpu_by_the_machines_number(monkeypatch):
    # Under CUDA_VISIBLE_DEVICES=2,3 timing workers are pinned round robin to the machine's GPUs 2
    # and 3 and take those GPUs' locks; none runs Triton's interpreter.
    from tessera.cost.profiler import GpuProfiler

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    prof = GpuProfiler(workers=1)
    prof.gpus = 2  # as on a machine with two
    pool = prof._new_pool("time", 2)
    try:
        seen = {o.value for o in pool.run(gpu_setup, list(range(6)))}
    finally:
        pool.close()
    lock = os.path.join(prof._lock_dir, "gpu{}.lock")
    assert seen and seen <= {("2", "2", lock.format(2), None), ("3", "3", lock.format(3), None)}


def test_profiler_workers_compute_on_one_host_thread():
    # The workers fill the cores already: a thread per core in each would oversubscribe them.
    from tessera.cost.profiler import GpuProfiler

    prof = GpuProfiler(workers=1)
    pool = prof._new_pool("build", 1)
    try:
        (o,) = list(pool.run(host_threads, [0]))
    finally:
        pool.close()
    assert o.value == 1


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited orphan waits for its new parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_exit_when_their_parent_is_killed():
    # A compile killed with SIGKILL cannot stop its workers; orphans kept their CUDA contexts on
    # the GPU until they watched for their parent's death.
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r)\n"
        "from tessera.cost.worker import WorkerPool\n"
        "pool = WorkerPool(1)\n"
        "print(next(pool.run('test_workers:identity', [0])).value[0], flush=True)\n"
        "time.sleep(60)\n") % str(Path(__file__).parent)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert _running(worker)  # alive while its parent is
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _running(worker):
            time.sleep(0.2)
        if _running(worker):
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the worker outlived its killed parent")
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.stdout.close()


UNGUARDED = """\
import os
import sys

sys.path.insert(0, {tests!r})
print({marker!r}, flush=True)  # top level, no __main__ guard: a worker that imports this prints it again

import torch

import tessera
from tessera import compiler
from fake_profiler import PooledFakeProfiler

torch.cuda.is_available = lambda: True  # stands in for a GPU: the fake profiler needs none
torch.cuda.get_device_name = lambda *a: "fake-gpu"
made = []
compiler.new_profiler = lambda opt: made.append(PooledFakeProfiler(workers=2)) or made[-1]
result = tessera.compile_model({model!r}, tessera.CompileOptions(cost="measured", db={db!r}))
pids = made[0].worker_pids
print("measured", result.tuning["measured"], "kernels", len(result.plan.kernels),
      "workers", len(pids), "parent_measured", os.getpid() in pids)
"""


def test_an_unguarded_script_tunes_in_workers_without_running_again(tmp_path):
    # multiprocessing's spawn workers import the script again (printing the marker once more
    # per worker) and refuse to start from that import; tessera's workers never import it.
    script = tmp_path / "user_script.py"
    script.write_text(UNGUARDED.format(tests=str(Path(__file__).parent), marker=MARKER,
                                       model=str(models_dir() / "attn_s7.onnx"), db=str(tmp_path / "t.db")))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count(MARKER) == 1, run.stdout
    words = run.stdout.split(MARKER, 1)[1].split()
    stats = dict(zip(words[::2], words[1::2]))
    assert int(stats["measured"]) > 0 and int(stats["kernels"]) > 0
    assert int(stats["workers"]) >= 1 and stats["parent_measured"] == "False"  # measured in the workers


def test_a_callers_profiler_serves_several_compiles_and_stays_open(tmp_path, monkeypatch):
    # A script that compiles many models (the fuzzer on a GPU) hands compile_model one profiler,
    # so its workers start once; a compile that starts its own closes it.
    import torch

    import tessera
    from fake_profiler import PooledFakeProfiler
    from tessera import compiler

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    opts = tessera.CompileOptions(cost="measured", db=str(tmp_path / "t.db"))
    shared = PooledFakeProfiler(workers=1)
    try:
        for name in ("attn_s7", "gemm_g1"):
            compiler.compile_model(models_dir() / f"{name}.onnx", opts, profiler=shared)
            assert shared.pool.pids and all(_alive(p) for p in shared.pool.pids)
        assert len(shared.worker_pids) == 1  # both compiles measured in the one worker
    finally:
        shared.close()
    closed: list[bool] = []

    class Own(PooledFakeProfiler):
        def close(self) -> None:
            closed.append(True)
            super().close()

    monkeypatch.setattr(compiler, "new_profiler", lambda opt: Own(workers=1))
    compiler.compile_model(models_dir() / "gemm_g2.onnx", opts)
    assert closed == [True]


def test_timing_rotates_large_float_constants_as_stored():
    # A weight timed hot in L2 looks faster than it runs in a model: the timer rotates copies of
    # the large float constants, each stored as the original (strides kept), like the inputs.
    import torch

    from tessera.cost.profiler import COLD_CONSTANT_BYTES, _constant_copies

    n = COLD_CONSTANT_BYTES // 4
    w = torch.randn(8, n // 8).t()  # a transposed view: the copies keep its strides
    consts = {"w": w, "scale": torch.tensor(0.5), "idx": torch.zeros(n, dtype=torch.int64)}
    sets = _constant_copies(consts, 3)
    assert len(sets) == 3 and all(set(c) == {"w"} for c in sets) and sets[0]["w"] is w
    for c in sets[1:]:
        assert c["w"].data_ptr() != w.data_ptr() and c["w"].stride() == w.stride() and torch.equal(c["w"], w)
