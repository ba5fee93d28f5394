"""Run bench_suite.py rows side by side, one process per GPU, inside one device call.

    python3 scripts/bench_gpus.py --rows segformer_b0:fp16=380,gpt2:tf32=330 --deadline-s 560 \\
        --out $OUT -- --vs eager,inductor-cudagraphs,inductor-max-autotune --strategies optimal-precisionio \\
        --fresh-db --profile --code SHA

Each (model, precision) row is one `bench_suite.py` process that sees one GPU (CUDA_VISIBLE_DEVICES),
so every contender of a row still runs in one process on one GPU, as DESIGN.md's measuring rules ask.
Each row's process is also confined to its GPU's share of the host's cores (64 cores and 4 GPUs: 16
each, as on the one-GPU machine), so its compile workers and Inductor's do not crowd the other rows.
Whenever a GPU is free, the first row in the given order whose estimate (`=SECONDS`, default
--default-s) fits in the seconds left before --deadline-s starts on it. A row still running at the deadline
is stopped, and with --cap so is a row that has run for its estimate (a contender that would not finish
in any call, such as max-autotune on a model with a hundred convolutions, then frees its GPU for the next
row). bench_suite.py has by then saved the contenders that finished (`"partial": true`). With
--cold-caches each row gets empty caches of its own (tessera's kernels, Triton's binaries, Inductor's
artifacts), removed when it ends, so a row's compile times are cold even on a machine warm from
earlier rows or calls. With --only, a run starts rows on the GPUs it names alone, so two runs with other suite
arguments (issue 16's rows beside issue 17's) can share a machine. Each row writes under OUT/MODEL_PREC/ (its JSON, tuning
rows and log); the last lines printed say which rows finished, which were cut off and which never
started.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "bench_suite.py"


def parse_rows(text: str, default_s: float) -> list[tuple[str, str, float]]:
    """'model:prec[=seconds],...' -> [(model, prec, seconds)]."""
    rows = []
    for item in filter(None, text.split(",")):
        head, _, est = item.partition("=")
        model, sep, prec = head.partition(":")
        if not sep:
            raise SystemExit(f"bench_gpus: row {item!r} is not MODEL:PRECISION[=SECONDS]")
        rows.append((model, prec, float(est) if est else default_s))
    return rows


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def share(gpu: int, n_gpus: int) -> set[int]:
    """The cores of GPU `gpu`'s row: an equal slice of those this process may use (empty: no limit)."""
    if not hasattr(os, "sched_getaffinity"):
        return set()
    cores = sorted(os.sched_getaffinity(0))
    k = len(cores) // n_gpus
    return set(cores[gpu * k:(gpu + 1) * k]) if k else set()


COLD_CACHE_VARS = ("TESSERA_CACHE", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def cold_caches(row: str) -> tuple[dict[str, str], str]:
    """Empty cache folders for one row: (the environment that points at them, their root to remove)."""
    root = tempfile.mkdtemp(prefix=f"cold-{row}-")
    return {var: os.path.join(root, var.lower()) for var in COLD_CACHE_VARS}, root


def stop(proc: subprocess.Popen) -> None:
    """Stop a row's process group (its compile workers too): TERM, then KILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def main() -> int:
    argv = sys.argv[1:]
    suite_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", required=True, help="MODEL:PREC[=SECONDS],... in the order to start them")
    ap.add_argument("--deadline-s", type=float, required=True, help="stop every row this long after the start")
    ap.add_argument("--default-s", type=float, default=300.0, help="a row's estimate when it names none")
    ap.add_argument("--cap", action="store_true", help="stop a row once it has run for its estimate")
    ap.add_argument("--cold-caches", action="store_true",
                    help="give each row empty kernel caches of its own (cold compile times on a warm machine)")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all that nvidia-smi lists)")
    ap.add_argument("--only", default="", help="of those GPUs, the indices this run may start rows on (e.g. 1), "
                    "so two runs with different suite arguments share one machine; each row still gets its "
                    "GPU's share of the cores")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--suite", type=Path, default=SUITE, help=argparse.SUPPRESS)  # tests run a stand-in
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    start = time.monotonic()
    queue = parse_rows(a.rows, a.default_s)
    n_gpus = a.gpus or gpu_count()
    free = [int(g) for g in a.only.split(",")] if a.only else list(range(n_gpus))
    if any(not 0 <= g < n_gpus for g in free):
        raise SystemExit(f"bench_gpus: --only {a.only} names a GPU outside 0..{n_gpus - 1}")
    running: dict[int, tuple[subprocess.Popen, str, object, float, str]] = {}  # gpu -> (proc, row, log, stop at, caches)
    status: dict[str, str] = {f"{m}_{p}": "not started" for m, p, _ in queue}
    while queue or running:
        now = time.monotonic()
        left = a.deadline_s - (now - start)
        for gpu, (proc, row, log, until, caches) in list(running.items()):
            if proc.poll() is not None or left <= 0 or now >= until:
                if proc.poll() is None:
                    stop(proc)
                    status[row] = "stopped at the deadline" if left <= 0 else "stopped at its cap"
                else:
                    status[row] = f"exit {proc.returncode}"
                log.close()
                if caches:
                    shutil.rmtree(caches, ignore_errors=True)
                del running[gpu]
                free.append(gpu)
        while free and left > 0:
            fits = [i for i, (_, _, est) in enumerate(queue) if est <= left]
            if not fits:
                break
            model, prec, est = queue.pop(fits[0])
            gpu = free.pop(0)
            row = f"{model}_{prec}"
            out = a.out / row
            out.mkdir(parents=True, exist_ok=True)
            log = open(out / "log.txt", "w")
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
            caches = ""
            if a.cold_caches:
                cold, caches = cold_caches(row)
                env.update(cold)
            cmd = [sys.executable, str(a.suite), "--models", model, "--precisions", prec, "--out", str(out),
                   *suite_args]
            print(f"{time.monotonic() - start:6.0f} s  start {row} on GPU {gpu}", flush=True)
            cores = share(gpu, n_gpus)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
            running[gpu] = (proc, row, log, time.monotonic() + est if a.cap else float("inf"), caches)
            status[row] = "running"
        if not running and all(est > left for _, _, est in queue):
            break  # nothing runs and no row left fits
        time.sleep(2)
    for row, what in status.items():
        print(f"{row}: {what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
