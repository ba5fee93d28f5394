"""The GPU profiler: real kernels timed on the device, failures contained.

Each job is a candidate kernel. Measuring runs in two phases, both in worker
processes so that a crash or GPU fault kills a worker, not the compile. The
phases overlap: a job is timed as soon as it is built (`GpuProfiler.measure`).

1. *build* (all CPU cores in parallel): generate the kernel and compile it
   without running it, then, holding the GPU's lock (below), run it once and
   check a template against the library. Triton keeps compiled binaries in its
   on-disk cache, so phase 2 does not compile again. A compile error or a
   fault here is the candidate's recorded failure.
2. *time* (`TIMERS_PER_GPU` processes per GPU): each generates and loads its
   kernel on its own, then takes the GPU's lock (an `flock`, which the OS
   drops if the holder dies) for everything that runs on the GPU, so kernels
   never share a GPU while timed but the Python work of the next job overlaps
   the timing of this one. The kernel is launched `LAUNCHES` times or more inside
   one CUDA graph, with inputs and weights rotated over copies (`rotation`);
   replays are timed with CUDA events until about `TARGET_S` of GPU time is
   spent, and the cost is the median replay over the launch count. Timing in a
   graph measures the GPU work, not Python's launch latency (DESIGN.md,
   "Measuring performance").

The workers are `cost/worker.py`'s processes, started from tessera's own code:
unlike multiprocessing's "spawn" workers they never import the user's
`__main__`, so a script without `if __name__ == "__main__":` can tune.
A worker holds one job at a time. A job whose own kernel faults the GPU answers with
that failure and its worker exits (`_fail`). A worker that dies (a crash, or `_check_context`
finding the CUDA context poisoned) or outlives `timeout_s` (it is killed) takes
that job with it, and a fresh worker takes its place for the rest of the batch;
the job is re-run alone in another fresh worker, so only a job that kills a
worker (or times out) alone is marked failed.
"""
from __future__ import annotations

import contextlib
import fcntl
import math
import os
import queue
import signal
import tempfile
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from tessera.cost.measured import Job
from tessera.errors import gpu_fault
from tessera.cost.worker import Feed, WorkerPool, exit_after_reply
from tessera.ir.graph import Graph, GraphKind

LAUNCHES = 20
L2_BYTES = 64 << 20  # rotate inputs over more than the H100/H200 L2 (50 MB)
# A kernel whose weights come to less than L2_BYTES / LAUNCHES is launched more times per graph, up to
# this, so that its weight copies still exceed L2. With 20 launches, a weight of 1.2 MB and its input
# and output (gpt2's attention output projection, 1.6 MB in all: 31 MB of copies) stayed hot after the
# first replay: two schedules timed 3.07 and 3.15 us, ran 4.5 and 3.5 us in the model, and the plan
# took the first (session 54).
MAX_LAUNCHES = 256
# in the database's versions: 2: weight copies exceed L2 whatever the kernel's size. Timings taken with
# programmatic dependent launch requested add "pdl" (`db.software_versions`), kept apart from those without.
TIMING_VERSION = 2
# Float constants from this size on are timed as inputs, rotated like them: in a model, a weight
# comes from DRAM (the model's weights pass through L2 once per call), so a kernel timed with its
# weight hot in L2 looks faster than it runs. gpt2, session 17: a split-K GEMM template over a
# 4.7 MB weight timed 6.8 us with its weight hot and ran 8.3 us in the model, beside a library
# call timed 6.8 that ran 7.0, and the plan took the template. Smaller constants (scalars, masks)
# stay constants: code generation may read their values.
COLD_CONSTANT_BYTES = 256 << 10
TIMERS_PER_GPU = 3  # processes sharing one GPU's lock: one times while the others prepare
TARGET_S = 4e-3  # GPU time spent timing one job (at least MIN_REPLAYS replays)
MIN_REPLAYS, MAX_REPLAYS = 5, 200
WORKER_MEMORY = 2 << 30  # host memory a build worker may take (torch, a CUDA context, Triton's compiler)


def available_memory() -> int | None:
    """Host memory available now (MemAvailable), or None where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def build_workers(requested: int | None = None) -> int:
    """Parallel build workers: all cores but two that this process may run on (its affinity, so a
    process confined to some cores spawns no more), capped so that each has WORKER_MEMORY of host memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    n = requested or max(1, cores - 2)
    mem = available_memory()
    if mem is not None:
        n = min(n, max(1, mem // WORKER_MEMORY))
    return n


def kernel_graph(job: Job) -> tuple[Graph, dict[str, Any]]:
    """The kernel alone as a small graph (its constants only) and a one-kernel plan."""
    g = job.graph
    nodes = list(job.prologue) + list(job.prims)
    produced = {o for n in nodes for o in n.outputs if o}
    reads = list(dict.fromkeys(t for n in nodes for t in n.inputs if t and t not in produced))
    tensors = set(reads) | produced
    mini = Graph(name="kernel", kind=GraphKind.PRIMITIVE, inputs=[t for t in reads if t not in g.constants],
                 outputs=list(job.outputs), nodes=nodes, types={t: g.types[t] for t in tensors},
                 constants={t: g.constants[t] for t in reads if t in g.constants}, opsets=dict(g.opsets),
                 tf32_rounded=g.tf32_rounded & tensors)
    plan = {"precision": job.precision, "kernels": [{
        "name": "tune", "prims": [n.name for n in job.prims], "prologue": [n.name for n in job.prologue],
        "outputs": list(job.outputs), **({"schedule": job.schedule.to_json()} if job.schedule else {})}]}
    return mini, plan


def _context_ok() -> bool:
    """Does this process's CUDA context still work? A GPU fault poisons it for good."""
    import torch

    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def _check_context() -> None:
    """Before a job: a context found broken here was broken by something before this job, so the
    worker exits without answering and the pool re-runs the job alone in a fresh worker."""
    if not _context_ok():
        os._exit(3)


def _fail(phase: str, e: Exception) -> tuple[float, str]:
    """The candidate's failure, with its reason. A job starts on a working context and ends
    synchronized (`_check_context`, `_build`, `_time`), so a GPU fault seen here is this
    candidate's own: it is recorded as its failure and the worker exits after answering
    (`worker.exit_after_reply`), instead of dying unanswered and having the job re-run alone in a
    fresh worker, one at a time (segformer_b0's tuning, session 15: 24 such re-runs, about 7 s each,
    of chain kernels that fault on Triton 3.6 / H100)."""
    text = f"{type(e).__name__}: {e}"
    if gpu_fault(e) or not _context_ok():
        exit_after_reply(3)
        return math.inf, f"{phase}: the GPU faulted running it ({text.splitlines()[0][:300]})"
    return math.inf, f"{phase}: {text}"[:500]


def _cold_constants(constants: dict[str, Any]) -> dict[str, Any]:
    """An executable's float constants of COLD_CONSTANT_BYTES or more: those a timing rotates."""
    return {t: v for t, v in constants.items()
            if v.is_floating_point() and v.numel() * v.element_size() >= COLD_CONSTANT_BYTES}


def _constant_copies(constants: dict[str, Any], copies: int) -> list[dict[str, Any]]:
    """`copies` sets of an executable's cold constants (`_cold_constants`; the first the
    originals), each stored as its original (strides, channels-last weights, tf32-rounded copies
    alike), so a timing can rotate them with the inputs."""
    big = _cold_constants(constants)
    return [big] + [{t: v.clone() for t, v in big.items()} for _ in range(copies - 1)]


def _inputs(graph: Graph, device: str, seed: int | None) -> dict[str, Any]:
    """Random inputs for a kernel's graph, in the layouts it reads; with seed None, empty tensors
    of the same shapes and strides (nothing runs on the GPU: for `Executable.precompile`)."""
    import torch

    from tessera.runtime.buffers import inverse_perm
    from tessera.runtime.torch_prims import TORCH_DTYPES

    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    out = {}
    for t in graph.inputs:
        ty = graph.types[t]
        dt = TORCH_DTYPES[ty.dtype]
        if gen is None:
            x = torch.empty(ty.storage_shape, dtype=dt, device=device)
        elif ty.dtype.is_float:  # drawn on the GPU: a host draw of a large input costs more than its timing
            x = torch.randn(ty.storage_shape, generator=gen, device=device).to(dt)
        else:  # indices: 0 is valid for every gather; masks: any bits
            x = torch.zeros(ty.storage_shape, dtype=dt, device=device)
        # Stored in the kernel's layout already: the timed launch must not convert its inputs.
        out[t] = x.permute(*inverse_perm(ty.layout)) if ty.layout else x
    return out


Result = tuple[float, str, dict[str, float]]  # seconds (or inf), why it failed, seconds per stage

_LOCK_PATH: str | None = None  # this worker's GPU lock (set by the pool initializer)
_GPU: str = "0"  # this worker's GPU, as the machine numbers it (set by the pool initializer)


@contextlib.contextmanager
def _gpu_section() -> Iterator[None]:
    """Exclusive use of this worker's GPU among the timing workers. flock, not a multiprocessing
    lock: the OS releases it when a worker dies holding it (a GPU fault exits the process)."""
    if _LOCK_PATH is None:
        yield
        return
    fd = os.open(_LOCK_PATH, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


class _Stages:
    """Wall seconds per named stage of one job (where tuning time goes; `GpuProfiler.stats`)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.t = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self.t
        self.t = now


Payload = tuple[Graph, dict[str, Any]]  # what a worker gets: the kernel's own small graph and plan


def _build(payload: Payload) -> Result:
    """Phase 1 in a worker: generate and compile (on the CPU), then, for a template, holding the
    GPU's lock, run once and check it against the library. (0.0, "", stages) on success. Builds overlap
    the timing of earlier candidates (`GpuProfiler.measure`), so the little they run on the GPU
    waits its turn: a timed replay never shares the GPU."""
    _check_context()
    st = _Stages()
    try:
        import torch

        from tessera.runtime.executable import Executable

        mini, plan = payload
        exe = Executable(mini, plan, "cuda", cuda_graph=False)
        ref_exe = _reference(mini, plan, "cuda")
        st("generate")
        shaped = _inputs(mini, "cuda", None)
        for e in (exe, ref_exe):
            if e is not None:
                e.precompile(shaped)
        st("compile")
        if ref_exe is None:
            # Nothing to check: the timer's first launch runs it (and meets any fault) anyway. The
            # run here waited for the GPU lock: 22% of segformer_b0's build time (session 16).
            return 0.0, "", st.times
        with _gpu_section():  # only GPU work and the copies back: the comparison waits outside
            st("build_wait")
            feeds = _inputs(mini, "cuda", 0)
            st("run_feeds")  # the held GPU's time by part (`GpuProfiler.stats`): what a check costs
            with exe.precision_flags():  # the plan's math flags (tf32 or full fp32 in the libraries)
                got = exe._launch(feeds)
            torch.cuda.synchronize()
            st("run_launch")  # the first launch loads the compiled module too
            got_host = _host(got, mini.outputs)
            st("run_copy")
            ref_host = _reference_run(ref_exe, feeds, mini.outputs)
            st("run_reference")
        wrong = _disagreement(plan, got_host, ref_host)
        st("check")
        return (math.inf, f"build: {wrong}", st.times) if wrong else (0.0, "", st.times)
    except Exception as e:  # noqa: BLE001 - any failure is the candidate's, recorded with its reason
        return (*_fail("build", e), st.times)


def _reference(mini: Graph, plan: dict[str, Any], device: str) -> Any:
    """The executable a template candidate is checked against (`template_disagreement`); None for
    a kernel that is no template."""
    kernel = plan["kernels"][0]
    if kernel.get("schedule", {}).get("form") not in ("gemm", "conv"):
        return None
    from tessera.runtime.executable import Executable

    return Executable(mini, {**plan, "kernels": _library_kernels(mini, kernel)}, device, cuda_graph=False)


def template_disagreement(mini: Graph, plan: dict[str, Any], feeds: dict[str, Any], got: dict[str, Any],
                          device: str) -> str:
    """Why a template candidate's outputs `got` are wrong ("" if they agree): the same kernel
    through the library on the same `feeds` (`_reference`). A kernel that Triton miscompiles
    (session 8: a flat-K convolution gather on Triton 3.6, H100) must fail its measurement, never
    win it. (`_build` runs the same check in two halves, around the GPU's lock.)"""
    ref_exe = _reference(mini, plan, device)
    if ref_exe is None:
        return ""
    return _disagreement(plan, _host(got, mini.outputs), _reference_run(ref_exe, feeds, mini.outputs))


def _host(tensors: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {t: tensors[t].float().cpu().numpy() for t in names}


def _reference_run(ref_exe: Any, feeds: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The reference's outputs for `feeds`, on the host."""
    with ref_exe.precision_flags():
        return _host(ref_exe._launch(feeds), names)


def _disagreement(plan: dict[str, Any], got: dict[str, Any], ref: dict[str, Any]) -> str:
    """Why host outputs `got` are too far from the reference's `ref` ("" if they agree)."""
    from tessera.tolerance import AGREEMENT, rel_l2

    bound = AGREEMENT[plan["precision"]]
    for t, r in ref.items():
        err = rel_l2(got[t], r)
        if not err <= bound:
            return f"wrong result: {t} is {err:.2g} (rel L2) from the library's, over {bound:g}"
    return ""


def _library_kernels(mini: Graph, kernel: dict[str, Any]) -> list[dict[str, Any]]:
    """The template kernel's reference as plan kernels for the library: itself without its schedule,
    or, where it computes its operands' prologue (which no library call can), that prologue as a
    generated kernel first; a GEMM chain as one kernel per primitive."""
    from tessera.codegen.select import linear_count, operand_prologue

    by_name = {n.name: n for n in mini.nodes}
    prims = [by_name[n] for n in kernel["prims"]]
    if linear_count(prims) > 1:
        return _one_per_primitive(mini, kernel)
    pre = operand_prologue(prims)
    rest = {k: v for k, v in kernel.items() if k != "schedule"}
    if not pre:
        return [rest]
    names = {n.name for n in pre}
    made = {o for n in pre for o in n.outputs}
    read = {t for n in mini.nodes if n.name not in names for t in n.inputs}
    first = {"name": "ref_prologue", "prims": [n.name for n in pre], "prologue": list(kernel["prologue"]),
             "outputs": sorted(made & read)}
    return [first, {**rest, "prims": [n for n in kernel["prims"] if n not in names]}]


def _one_per_primitive(mini: Graph, kernel: dict[str, Any]) -> list[dict[str, Any]]:
    """A kernel's primitives as plan kernels of one primitive each (with the free prologue each reads)."""
    from tessera.codegen.select import _live

    by_name = {n.name: n for n in mini.nodes}
    pro = [by_name[n] for n in kernel["prologue"]]
    read = {t for n in kernel["prims"] for t in by_name[n].inputs}
    return [{"name": f"ref_{i}", "prims": [name], "prologue": [p.name for p in _live(pro, by_name[name].inputs)],
             "outputs": [o for o in by_name[name].outputs if o in read or o in kernel["outputs"]]}
            for i, name in enumerate(kernel["prims"])]


def _replay_seconds(graph: Any) -> float:
    """Median seconds of one replay, timed with CUDA events, about TARGET_S of GPU time in all."""
    import torch

    graph.replay()  # warm: the graph's first replay uploads it
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) * 1e-3, 1e-7)
    n = max(MIN_REPLAYS, min(MAX_REPLAYS, int(TARGET_S / once)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
    events[-1][1].synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2] * 1e-3


def rotation(io_bytes: int, weight_bytes: int) -> tuple[int, int, int]:
    """How one timing rotates its data: (copies of the inputs and outputs, copies of the weights,
    launches per graph). Inputs and weights together rotate over at most LAUNCHES copies, as since
    session 17: an activation small enough to stay in L2 mostly does in a model too, since its
    producer has just written it. Weights, which a model reads once per call, get copies of their own
    until they and the inputs' copies exceed L2, with as many launches as copies (up to MAX_LAUNCHES)."""
    copies = max(1, min(LAUNCHES, math.ceil(L2_BYTES / max(io_bytes + weight_bytes, 1))))
    if not weight_bytes:
        return copies, 1, LAUNCHES
    # Between two reads of one weight copy, the other weight copies and the inputs' copies pass
    # through L2: only what the inputs leave needs more weight copies. A kernel whose copies already
    # exceed L2 (a convolution's small weight beside 20 MB of activations) launches as before, so
    # timing it costs no more.
    room = max(L2_BYTES - copies * io_bytes, 0)
    weight_copies = max(copies, min(MAX_LAUNCHES, math.ceil(room / weight_bytes)))
    return copies, weight_copies, max(LAUNCHES, weight_copies)


def _time(payload: Payload) -> Result:
    """Phase 2 in a timing worker: seconds per launch inside a CUDA graph."""
    _check_context()
    st = _Stages()
    try:
        import torch

        from tessera.runtime.executable import Executable
        from tessera.runtime.graphs import capture

        mini, plan = payload
        exe = Executable(mini, plan, "cuda", cuda_graph=False)  # Python work: outside the GPU lock
        exe.precompile(_inputs(mini, "cuda", None))  # the builder's binary, from Triton's cache
        weights = sum(v.numel() * v.element_size() for v in _cold_constants(exe.constants).values())
        copies, weight_copies, launches = rotation(
            sum(mini.types[t].nbytes for t in (*mini.inputs, *mini.outputs)), weights)
        st("generate")
        with _gpu_section(), exe.precision_flags():
            st("wait")
            feeds = [_inputs(mini, "cuda", s) for s in range(copies)]
            consts = _constant_copies(exe.constants, weight_copies)
            exe._launch(feeds[0])  # loads the compiled kernel
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                exe._launch(feeds[0])
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            st("load")
            graph = torch.cuda.CUDAGraph()
            # A kernel of views captures nothing. A failed capture puts the worker's stream and random
            # generator back, so the worker's later candidates still time.
            with capture(graph, what=f"the capture of {launches} launches"):
                for i in range(launches):
                    exe.constants.update(consts[i % weight_copies])  # read at launch: the capture keeps each copy's
                    exe._launch(feeds[i % copies])
            st("capture")
            seconds = _replay_seconds(graph) / launches
            st("timing")
            del graph, feeds, consts
        # Seconds this GPU was held, per GPU: shows how the work spread over several.
        st.times[f"gpu{_GPU}_held"] = sum(st.times.get(k, 0.0) for k in ("load", "capture", "timing"))
        return seconds, "", st.times
    except Exception as e:  # noqa: BLE001
        return (*_fail("time", e), st.times)


def visible_gpus(count: int) -> list[str]:
    """The machine's numbers of the `count` GPUs this process sees (CUDA_VISIBLE_DEVICES maps them)."""
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed[:count] if len(listed) >= count else [str(i) for i in range(count)]


def _init_worker(gpu: str | None, lock_dir: str | None) -> None:
    """Per worker: its GPU (the pool also sets CUDA_VISIBLE_DEVICES before the worker starts) and,
    for timing workers, that GPU's lock."""
    global _LOCK_PATH, _GPU
    # Measured kernels are compiled for the GPU, whatever the parent chose for itself.
    os.environ.pop("TRITON_INTERPRET", None)
    if gpu is not None:
        _GPU = gpu
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    else:
        _GPU = visible_gpus(1)[0]
    if lock_dir is not None:
        # Named by the machine's number: compiles that see the GPUs differently still share its lock.
        _LOCK_PATH = os.path.join(lock_dir, f"gpu{_GPU}.lock")


# A worker's host work (copies back, comparing a template with its reference) is small and the
# workers already fill the cores (one per core but two), so each computes on one thread: torch's and
# the BLAS libraries' default of a thread per core, in every worker, oversubscribes the CPU the
# builders compile on (session 45: bert_base's builders spent 31 s comparing outputs, 485 s compiling).
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def worker_env(gpu: str | None) -> dict[str, str | None]:
    """A worker's environment changes: never Triton's interpreter (it is read when kernels are
    defined, so it must be gone before tessera is imported), its GPU where there are several,
    one CPU thread for its host work (`_ONE_THREAD`), and torch's C++ warnings off (a candidate that
    faults the GPU makes each CUDA event it drops print one to the user's terminal; its failure is
    recorded with its reason)."""
    return {"TRITON_INTERPRET": None, "TORCH_CPP_LOG_LEVEL": "ERROR", **_ONE_THREAD,
            **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})}


class GpuProfiler:
    """Measures jobs on the visible GPUs (see the module docstring). Worker pools live across calls.

    `stats` sums wall seconds per stage over the jobs (generate, compile, wait, load, capture,
    timing) and per phase, so a tuning run reports where its time went.
    """

    def __init__(self, workers: int | None = None, timeout_s: float = 120.0) -> None:
        import torch

        self.gpus = max(1, torch.cuda.device_count())
        self.workers = build_workers(workers)
        self.timeout_s = timeout_s
        self._pools: dict[str, WorkerPool] = {}
        # One lock per GPU for the whole machine: two compiles tuning at once also take turns.
        self._lock_dir = os.path.join(tempfile.gettempdir(), "tessera-gpu-locks")
        os.makedirs(self._lock_dir, exist_ok=True)
        self.stats: dict[str, float] = {}
        self._stats_lock = threading.Lock()

    def _new_pool(self, kind: str, n: int) -> WorkerPool:
        """n workers, round robin over the GPUs by slot (a replaced worker keeps its GPU)."""
        gpus = visible_gpus(self.gpus)

        def gpu(slot: int) -> str | None:
            return gpus[slot % self.gpus] if self.gpus > 1 else None

        lock_dir = self._lock_dir  # builders take it too, to run what they compiled (`_build`)
        return WorkerPool(n, _init_worker, lambda slot: (gpu(slot), lock_dir), env=lambda slot: worker_env(gpu(slot)))

    def _pool(self, kind: str, n: int) -> WorkerPool:
        if kind not in self._pools:
            self._pools[kind] = self._new_pool(kind, n)
        return self._pools[kind]

    def _kill(self, kind: str) -> None:
        pool = self._pools.pop(kind, None)
        if pool is not None:
            pool.kill()

    def close(self) -> None:
        for kind in list(self._pools):
            self._pools.pop(kind).close()

    def _add(self, stages: dict[str, float]) -> None:
        with self._stats_lock:  # the build thread and the timing loop both add
            for k, v in stages.items():
                self.stats[k] = self.stats.get(k, 0.0) + v

    def _run(self, kind: str, fn: Callable[[Payload], Result], jobs: Sequence[Payload], workers: int,
             on_result: Callable[[int, tuple[float, str]], None], feed: Feed | None = None) -> None:
        """Run fn over jobs (or, with `feed`, over those of them put on it, by index);
        on_result(i, (seconds, why)) per job in completion order."""
        t0 = time.perf_counter()
        lost: list[int] = []
        pool = self._pool(kind, workers)
        try:
            with contextlib.closing(pool.run(fn, jobs, self.timeout_s) if feed is None
                                    else pool.stream(fn, feed, self.timeout_s)) as outcomes:
                for o in outcomes:
                    if o.died is not None:
                        lost.append(o.index)
                    elif o.error is not None:  # fn itself failed (it catches the candidate's errors)
                        on_result(o.index, (math.inf, f"{kind}: {type(o.error).__name__}: {o.error}"[:500]))
                    else:
                        seconds, why, stages = o.value
                        self._add(stages)
                        on_result(o.index, (seconds, why))
        except BaseException:
            self._kill(kind)  # workers may hold jobs no one waits for
            raise
        # What a dead or stuck worker took down is retried one job per fresh worker:
        # only the job that kills a worker alone is marked failed.
        for i in lost:
            on_result(i, self._alone(kind, fn, jobs[i]))
        self._add({f"{kind}_phase": time.perf_counter() - t0})

    def _alone(self, kind: str, fn: Callable[[Payload], Result], job: Payload) -> tuple[float, str]:
        pool = self._new_pool(kind, 1)
        try:
            (o,) = list(pool.run(fn, [job], self.timeout_s))
        finally:
            pool.kill()
        if o.timed_out:
            return math.inf, f"timeout after {self.timeout_s:.0f}s"
        if o.died is not None:
            return math.inf, f"the worker died measuring it (a GPU fault or a crash; {o.died})"
        if o.error is not None:
            return math.inf, f"{kind}: {type(o.error).__name__}: {o.error}"[:500]
        seconds, why, stages = o.value
        self._add(stages)
        return seconds, why

    def measure(self, jobs: Sequence[Job], record: Any) -> None:
        """Build every job (all cores) and time each as soon as it is built (the timers), the
        phases overlapping: a thread drives the builders and feeds the timers, which this thread
        drives; only this thread calls `record` (the database is this thread's). A build's
        failure is recorded when the next timing arrives, or at the end."""
        payloads = [kernel_graph(j) for j in jobs]  # small: only the kernel's own constants travel
        built, failed, stop = Feed(), queue.SimpleQueue(), threading.Event()
        crashed: list[BaseException] = []

        def after_build(i: int, r: tuple[float, str]) -> None:
            if stop.is_set():
                raise _Stopped()
            if math.isfinite(r[0]):
                built.put(i, payloads[i])
            else:
                failed.put((i, r))

        def build() -> None:
            try:
                self._run("build", _build, payloads, self.workers, after_build)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                crashed.append(e)
            finally:
                built.close()

        def failures() -> None:
            while not failed.empty():
                i, (seconds, why) = failed.get()
                record(i, seconds, why)

        def timed(i: int, r: tuple[float, str]) -> None:
            failures()
            record(i, *r)

        builder = threading.Thread(target=build, name="tessera-build", daemon=True)
        builder.start()
        try:
            self._run("time", _time, payloads, self.gpus * TIMERS_PER_GPU, timed, feed=built)
        finally:
            if builder.is_alive():  # stopped early (an error here, Ctrl-C): end the builds now
                stop.set()
                pool = self._pools.get("build")
                for pid in pool.pids if pool is not None else []:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            builder.join()
            built.dispose()
        failures()
        errors = [e for e in crashed if not isinstance(e, _Stopped)]
        if errors:
            raise errors[0]


class _Stopped(Exception):
    """The build thread's signal to stop: its caller has stopped waiting."""
