"""Kill a real tuning run five times with SIGKILL, resume it, and compare (issue 5's GPU run).

    PYTHONPATH=. python scripts/kill_resume_gpu.py MODEL.onnx --out $OUT [--solver highs]

Each attempt runs `tessera compile --cost measured` on one database and is
killed once the database holds a random number of rows (increasing targets,
so every kill lands mid-tuning with measurements committed and more to come);
the sixth runs to the end. The database refuses a
second row for a key (`TuningDB.put`), so a completed measurement taken again
would stop the run with an error: a clean finish means none was. The script
then compiles once more on the same database (it must measure nothing) and once
on a fresh database without interruption, and reports whether the plans agree.
Measured costs carry noise, so the two databases can differ where kernels tie;
the report then gives both plans' estimated totals.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def compile_cmd(model: str, db: Path, out: Path, solver: str) -> list[str]:
    return [sys.executable, "-m", "tessera", "compile", model, "-o", str(out), "--cost", "measured",
            "--db", str(db), "--solver", solver]


def rows(db: Path) -> int:
    from tessera.cost.db import TuningDB

    with TuningDB(db) as d:
        return len(d)


def workers() -> list[int]:
    """Pids of live multiprocessing workers on this machine (spawned pool processes)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"multiprocessing.spawn" in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def kernels(out: Path) -> tuple[list[list[str]], float]:
    plan = json.loads((out / "plan.json").read_text())
    return sorted(sorted(k["prims"]) for k in plan["kernels"]), plan["estimated_total_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--rows", type=int, default=700, help="kill targets are drawn from 1..ROWS (the model's total)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    db = work / "killed.db"
    rng = random.Random(a.seed)
    log = []
    for attempt, target in enumerate(sorted(rng.sample(range(1, a.rows), 5))):
        t = time.perf_counter()
        p = subprocess.Popen(compile_cmd(a.model, db, work / "art", a.solver), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        while p.poll() is None and (not db.exists() or rows(db) < target):
            time.sleep(0.1)
        killed = p.poll() is None
        if killed:
            p.send_signal(signal.SIGKILL)
        p.wait()
        # The killed compile's workers watch for their parent's death and exit (profiler._exit_with_parent).
        time.sleep(2)
        log.append({"attempt": attempt, "target_rows": target, "after_s": round(time.perf_counter() - t, 1),
                    "killed": killed, "rows": rows(db), "workers_left_after_2s": len(workers())})
        print(log[-1], flush=True)
    t = time.perf_counter()
    done = subprocess.run(compile_cmd(a.model, db, work / "resumed", a.solver), capture_output=True, text=True)
    resume_s = time.perf_counter() - t
    print(done.stdout[-2000:], done.stderr[-2000:], flush=True)
    again = subprocess.run(compile_cmd(a.model, db, work / "again", a.solver), capture_output=True, text=True)
    t = time.perf_counter()
    ref = subprocess.run(compile_cmd(a.model, work / "fresh.db", work / "ref", a.solver), capture_output=True,
                         text=True)
    ref_s = time.perf_counter() - t
    doc: dict = {"model": a.model, "kills": log, "resume_rc": done.returncode, "resume_s": round(resume_s, 1),
                 "again_rc": again.returncode, "ref_rc": ref.returncode, "ref_s": round(ref_s, 1)}
    if done.returncode == 0 and again.returncode == 0 and ref.returncode == 0:
        resumed, est = kernels(work / "resumed")
        second, _ = kernels(work / "again")
        uninterrupted, ref_est = kernels(work / "ref")
        doc.update({
            "rows_killed_db": rows(db), "rows_fresh_db": rows(work / "fresh.db"),
            "again_measured_nothing": "0 measured now" in again.stdout,
            "again_same_plan": resumed == second,
            "same_plan_as_uninterrupted": resumed == uninterrupted,
            "kernels": len(resumed), "estimated_us": round(est * 1e6, 2),
            "uninterrupted_estimated_us": round(ref_est * 1e6, 2),
            "kernels_differing": len([k for k in resumed if k not in uninterrupted]),
        })
    import torch

    doc["device"] = torch.cuda.get_device_name()
    doc["date"] = time.strftime("%Y-%m-%d")
    (a.out / "kill_resume_gpu.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc.items() if k != "kills"}, indent=1))
    return 0 if doc["resume_rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
