"""Worker processes that start from tessera's own code, never from the user's script.

Why not multiprocessing: a "spawn" worker imports the parent's `__main__` module again so that
it can unpickle functions defined there. A user's script without `if __name__ == "__main__":`
then runs again in every worker, and multiprocessing refuses to start processes from that import
("An attempt has been made to start a new process before the current process has finished its
bootstrapping phase"). "fork" is no way out: a forked process cannot use CUDA that its parent
initialized, and forking a process that runs threads (torch's) is unsafe.

So each worker is a fresh interpreter (`python -P -c "from tessera.cost.worker import main; ..."`)
that imports only what its jobs name. (`-c`, not `-m tessera.cost.worker`: importing the package
`tessera` imports this module, and runpy would then run a second copy of it as `__main__`.)

Parent and worker exchange frames: an 8-byte big-endian length, then a pickle. The frames travel
on two pipes made for this purpose (their descriptor numbers are the worker's arguments), not on
the worker's stdin and stdout, so what Triton, torch or a job prints cannot corrupt the channel.

    parent -> worker  ("init", sys.path, initializer, initargs)   once, first
    worker -> parent  ("ready", pid) | ("init_error", traceback)
    parent -> worker  (job id, "module:qualname", pickled payload) one job at a time
    worker -> parent  (job id, "ok", pickled value, last) | (job id, "error", pickled exception, last)

`last` is true when the job called `exit_after_reply`: the worker exits once its answer is sent
(a CUDA context that a job's own GPU fault poisoned is of no further use), so that job's result
stands as it reported it and the pool sends that worker nothing more.

A job names its function by import path, so functions of `__main__` are refused. The worker
takes the parent's `sys.path` (so that what the parent can import, the worker can too), exits on
end of input (the pool's `close`) and when its parent is gone (`_exit_with_parent`).

`WorkerPool.run` hands jobs to idle workers and yields an `Outcome` per job in completion order.
A job that raises comes back as its exception; a worker that dies (a crash, `os._exit`, a signal)
or outlives the job's timeout (then it is killed) comes back as `died`, and a fresh worker takes
its place for the jobs still waiting.
"""
from __future__ import annotations

import importlib
import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

_HEADER = struct.Struct("!Q")
_BOOT = "import sys; from tessera.cost.worker import main; sys.exit(main(sys.argv[1:]))"
EXIT_INIT_FAILED = 4


class WorkerError(RuntimeError):
    """The pool cannot work: a worker failed to start or its initializer raised."""


class JobError(Exception):
    """A job's exception that could not travel back as itself (it would not pickle)."""


@dataclass(frozen=True)
class Outcome:
    """One job's end: its value, the exception it raised, or why its worker was lost."""

    index: int  # the job's position in the payloads given to `run`
    value: Any = None
    error: BaseException | None = None  # raised by the job function (the worker lives on)
    died: str | None = None  # the worker died or was killed running it
    timed_out: bool = False  # died because it outlived the timeout

    @property
    def ok(self) -> bool:
        return self.error is None and self.died is None


def function_path(fn: Callable[..., Any] | str) -> str:
    """'module:qualname' of a module-level function, which a worker imports by name."""
    if isinstance(fn, str):
        module, _, qualname = fn.partition(":")
    else:
        module, qualname = getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", "")
    if not module or not qualname or module == "__main__" or "<" in qualname:
        # Importing __main__ in a worker would run the user's script again: the failure this module avoids.
        raise ValueError(f"{fn!r} must be a module-level function of an importable module, not of __main__")
    return f"{module}:{qualname}"


def _resolve(path: str) -> Callable[..., Any]:
    module, qualname = path.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# --- the worker's side ---------------------------------------------------------------------------

def _read_exact(fd: int, n: int) -> bytes | None:
    """n bytes, or None at end of input (the pool closed the pipe or is gone)."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_message(fd: int) -> Any:
    head = _read_exact(fd, _HEADER.size)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _exit_with_parent() -> None:
    """Exit when the process that started this worker is gone. A parent killed with SIGKILL
    cannot stop its workers, and a worker busy with a job reads no end of input, so without this
    orphans would keep their CUDA contexts and host memory indefinitely."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="tessera-parent-watch", daemon=True).start()


def _portable(e: BaseException) -> BaseException:
    """The exception itself where it survives pickling, else a JobError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any pickling problem: send the text instead
        err = JobError(f"{type(e).__name__}: {e}")
        for note in getattr(e, "__notes__", []):
            err.add_note(note)
        return err


_EXIT_AFTER: int | None = None  # set by a job (`exit_after_reply`): the exit code once it has answered


def exit_after_reply(code: int) -> None:
    """Called by a job running in a worker: answer as usual, then exit with `code`. For a job
    that knows it left the process unusable (its own GPU fault): its result is its own, so the
    pool need not re-run it alone in a fresh worker to find out whose fault it was."""
    global _EXIT_AFTER
    _EXIT_AFTER = code


def _run_job(job_id: int, target: str, payload: bytes) -> tuple[Any, ...]:
    try:
        value = _resolve(target)(pickle.loads(payload))
        return job_id, "ok", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), _EXIT_AFTER is not None
    except Exception as e:  # noqa: BLE001 - the job's failure goes back to the parent; the worker lives on
        e.add_note(f"(in tessera worker {os.getpid()})\n{traceback.format_exc().rstrip()}")
        return job_id, "error", pickle.dumps(_portable(e), protocol=pickle.HIGHEST_PROTOCOL), _EXIT_AFTER is not None


def main(argv: Sequence[str]) -> int:
    """The worker: read the init frame, then run jobs until end of input."""
    rx, tx = int(argv[0]), int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops its workers
    _exit_with_parent()
    try:
        return _serve(rx, tx)
    except BrokenPipeError:  # the pool closed while this worker started or answered: nothing to report
        return 0


def _serve(rx: int, tx: int) -> int:
    init = _read_message(rx)
    if init is None:
        return 0
    _, path, initializer, initargs = init
    sys.path[:] = path
    try:
        if initializer is not None:
            _resolve(initializer)(*initargs)
    except BaseException:  # noqa: BLE001 - reported, then this worker is useless
        _write_all(tx, _frame(("init_error", traceback.format_exc())))
        return EXIT_INIT_FAILED
    _write_all(tx, _frame(("ready", os.getpid())))
    while True:
        msg = _read_message(rx)
        if msg is None:
            return 0
        _write_all(tx, _frame(_run_job(*msg)))
        if _EXIT_AFTER is not None:
            os._exit(_EXIT_AFTER)  # no interpreter teardown: it would touch the broken CUDA context


# --- the parent's side ---------------------------------------------------------------------------

@dataclass(eq=False)
class _Worker:
    slot: int  # which of the pool's places it fills (a replacement keeps the slot: the same GPU)
    proc: subprocess.Popen[bytes]
    tx: int  # jobs to the worker
    rx: int  # results from it (non-blocking)
    started: float
    buf: bytearray = field(default_factory=bytearray)
    ready: bool = False
    eof: bool = False
    job: int | None = None
    deadline: float = float("inf")
    init_error: str = ""
    leaving: bool = False  # its last answer came: it exits, and takes no job


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(w: _Worker, kill: bool) -> None:
    """End one worker: SIGKILL it, or close its input and let it exit. Reaps it and closes its pipes."""
    if kill and w.proc.poll() is None:
        w.proc.kill()
    for fd in (w.tx, w.rx):
        try:
            os.close(fd)
        except OSError:
            pass
    w.tx = w.rx = -1


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        _stop(w, kill=True)
    for w in workers:
        w.proc.wait()
    workers.clear()


class Feed:
    """Jobs that become ready while a pool runs (`WorkerPool.stream`): `put` them from any thread,
    then `close`. The pool's loop wakes on a pipe when one arrives."""

    def __init__(self) -> None:
        self._jobs: deque[tuple[int, Any]] = deque()
        self.closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @classmethod
    def of(cls, payloads: Sequence[Any]) -> Feed:
        """A closed feed of payloads, numbered by position."""
        feed = cls()
        feed._jobs.extend(enumerate(payloads))
        feed.closed = True
        return feed

    def put(self, index: int, payload: Any) -> None:
        self._jobs.append((index, payload))
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # the pipe is full (so the loop wakes anyway) or the feed is disposed of

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:  # BlockingIOError: drained
            pass

    def __len__(self) -> int:
        return len(self._jobs)

    def dispose(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


class WorkerPool:
    """Up to `workers` processes running jobs (see the module docstring). Workers start when jobs
    need them and live across `run` calls until `close`.

    `initializer` (a module-level function) runs once in each worker with `initargs`, or with
    `initargs(slot)` where it is a function of the worker's place in the pool (0 .. workers-1).
    `env(slot)` gives environment variables to set (or, where None, remove) in that worker.
    """

    def __init__(self, workers: int, initializer: Callable[..., None] | str | None = None,
                 initargs: tuple[Any, ...] | Callable[[int], tuple[Any, ...]] = (),
                 env: Callable[[int], Mapping[str, str | None]] | None = None,
                 start_timeout_s: float = 300.0) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self._initializer = None if initializer is None else function_path(initializer)
        self._initargs = initargs
        self._env = env
        self.start_timeout_s = start_timeout_s
        self._procs: list[_Worker] = []
        self._running = False
        # A pool dropped without close() still kills its workers (and at interpreter exit).
        self._finalizer = weakref.finalize(self, _kill_all, self._procs)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._procs]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        self.kill() if kind is not None else self.close()

    def close(self, grace_s: float = 5.0) -> None:
        """Close every worker's input so it exits; kill what has not after grace_s."""
        for w in self._procs:
            _stop(w, kill=False)
        end = time.monotonic() + grace_s
        for w in self._procs:
            try:
                w.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self._procs.clear()

    def kill(self) -> None:
        """SIGKILL every worker now (jobs running are lost)."""
        _kill_all(self._procs)

    def _spawn(self, slot: int) -> _Worker:
        env = dict(os.environ)
        # The worker imports what the parent can: tessera itself, and the jobs' modules.
        path = [p for p in sys.path if p]
        env["PYTHONPATH"] = os.pathsep.join(path + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        for k, v in (self._env(slot) if self._env else {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        args = self._initargs(slot) if callable(self._initargs) else self._initargs
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            # -P: the current directory does not shadow tessera or its dependencies.
            proc = subprocess.Popen([sys.executable, "-P", "-c", _BOOT, str(job_r), str(res_w)],
                                    stdin=subprocess.DEVNULL, env=env, pass_fds=(job_r, res_w))
        except BaseException:
            for fd in (job_r, job_w, res_r, res_w):
                os.close(fd)
            raise
        os.close(job_r)  # the worker's ends: the parent keeps none, so a dead worker reads as end of input
        os.close(res_w)
        os.set_blocking(res_r, False)
        w = _Worker(slot, proc, job_w, res_r, time.monotonic())
        self._procs.append(w)
        try:
            _write_all(w.tx, _frame(("init", list(sys.path), self._initializer, args)))
        except BrokenPipeError:
            pass  # it died already: seen as end of input
        return w

    def _retire(self, w: _Worker, gone: bool) -> str:
        """Remove a worker from the pool, killing it unless it is gone already; returns how it ended."""
        if gone:
            try:  # its pipe closed as it exits: its own exit code says why, not our SIGKILL
                w.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        _stop(w, kill=True)
        code = w.proc.wait()
        self._procs.remove(w)
        return _exit_text(code)

    def _read(self, w: _Worker) -> list[Any]:
        """Messages that arrived complete from w; sets w.eof at end of input."""
        while True:
            try:
                chunk = os.read(w.rx, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                w.eof = True
                break
            w.buf += chunk
        out = []
        while len(w.buf) >= _HEADER.size:
            n = _HEADER.unpack_from(w.buf)[0]
            if len(w.buf) < _HEADER.size + n:
                break
            out.append(pickle.loads(bytes(w.buf[_HEADER.size:_HEADER.size + n])))
            del w.buf[:_HEADER.size + n]
        return out

    def run(self, fn: Callable[[Any], Any] | str, payloads: Sequence[Any],
            timeout_s: float | None = None) -> Iterator[Outcome]:
        """fn(payload) for each payload in the workers; an Outcome per job in completion order.
        A job running longer than timeout_s has its worker killed. Stopping the iteration early
        kills the workers still busy."""
        target, feed = function_path(fn), Feed.of(payloads)

        def outcomes() -> Iterator[Outcome]:
            try:
                yield from self._loop(target, feed, timeout_s)
            finally:
                feed.dispose()
        return outcomes()

    def stream(self, fn: Callable[[Any], Any] | str, feed: Feed, timeout_s: float | None = None) -> Iterator[Outcome]:
        """As `run`, for jobs put on `feed` while it runs (an Outcome's index is the job's index
        given to `put`); ends when the feed is closed and every job put has its outcome."""
        return self._loop(function_path(fn), feed, timeout_s)

    def _loop(self, target: str, todo: Feed, timeout_s: float | None) -> Iterator[Outcome]:
        if self._running:  # one run at a time: workers hold one job each
            raise RuntimeError("this pool is already running jobs")
        self._running = True
        sel = selectors.DefaultSelector()
        sel.register(todo._wake_r, selectors.EVENT_READ, None)
        watched: set[_Worker] = set()
        try:
            while True:
                closed = todo.closed  # read first: every job put before closing is in the queue now
                if closed and not todo._jobs and all(w.job is None for w in self._procs):
                    break
                now = time.monotonic()
                # Start workers for the jobs no idle or starting worker will take; for a feed still
                # open, all of them at once (its jobs come later, and a worker takes seconds to start).
                free = sum(1 for w in self._procs if w.job is None and not w.leaving)
                taken = {w.slot for w in self._procs}
                need = len(todo) - free if closed else self.workers
                for slot in [s for s in range(self.workers) if s not in taken][:max(0, need)]:
                    self._spawn(slot)
                for w in self._procs:
                    if w not in watched:
                        sel.register(w.rx, selectors.EVENT_READ, w)
                        watched.add(w)
                # Hand jobs to the idle workers.
                for w in self._procs:
                    if not todo._jobs:
                        break
                    if w.ready and w.job is None and not w.eof and not w.leaving:
                        i, payload = todo._jobs.popleft()
                        try:
                            data = _frame((i, target, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)))
                        except Exception as e:  # noqa: BLE001 - a payload that will not pickle is that job's error
                            yield Outcome(i, error=e)
                            continue
                        try:
                            _write_all(w.tx, data)
                        except BrokenPipeError:
                            todo._jobs.appendleft((i, payload))  # it died idle: the job never started; seen below
                            continue
                        w.job, w.deadline = i, (now + timeout_s if timeout_s is not None else float("inf"))
                deadlines = [w.deadline for w in self._procs if w.job is not None]
                deadlines += [w.started + self.start_timeout_s for w in self._procs if not w.ready]
                wait = min([0.5] + [max(0.0, d - now) for d in deadlines])
                for key, _ in sel.select(wait):
                    if key.data is None:
                        todo._drain()
                for w in list(self._procs):
                    for msg in self._read(w):
                        if msg[0] == "ready":
                            w.ready = True
                        elif msg[0] == "init_error":
                            w.init_error = msg[1]
                        else:
                            i, status, data, w.leaving = msg
                            w.job, w.deadline = None, float("inf")
                            try:
                                obj = pickle.loads(data)
                            except Exception as e:  # noqa: BLE001 - a value the parent cannot load is the job's error
                                yield Outcome(i, error=e)
                                continue
                            yield Outcome(i, value=obj) if status == "ok" else Outcome(i, error=obj)
                    # A worker is gone at end of input, or when it exited while a process it
                    # started still holds its pipe open.
                    gone = w.eof or w.proc.poll() is not None
                    late = w.job is not None and time.monotonic() > w.deadline
                    slow = not w.ready and not gone and time.monotonic() > w.started + self.start_timeout_s
                    if not (gone or late or slow):
                        continue
                    if gone and w.proc.poll() is not None:
                        self._read(w)  # a last message written just before exiting is still its answer
                    if w in watched:
                        sel.unregister(w.rx)
                        watched.discard(w)
                    how = self._retire(w, gone)
                    if not w.ready:
                        raise WorkerError(f"a tessera worker failed to start ({'timed out' if slow else how})"
                                          + (f":\n{w.init_error}" if w.init_error else "; its stderr says why"))
                    if w.job is not None:
                        if late and not gone:
                            yield Outcome(w.job, died=f"timed out after {timeout_s:g} s and was killed",
                                          timed_out=True)
                        else:
                            yield Outcome(w.job, died=f"the worker died ({how})")
        finally:
            sel.close()
            self._running = False
            # Workers still busy (the caller stopped early, or an error) hold jobs no one waits for.
            for w in [w for w in self._procs if w.job is not None or w.buf]:
                self._retire(w, gone=False)

