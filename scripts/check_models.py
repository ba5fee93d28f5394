"""`tessera compile` then `tessera run --check` on every ONNX model of a folder, as a user runs them.

Each model is compiled and run in its own processes through the CLI (`python -m tessera`), so what
is recorded is what a user sees: the exit codes, the check's verdict line, the time taken, and every
line of stderr that names a warning (issue 13: compile and run print none on the shared models).
Prints a markdown table last; `--out` saves the JSON.

    python scripts/check_models.py ../shared/models --precision fp32 --out check.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARNING = re.compile(r"warn", re.IGNORECASE)
REL_L2 = re.compile(r"^\s*(\S+)\s.*rel L2 ([0-9.eE+-]+)")  # a line of run --check: output name, shape, error


def _cli(args: list[str], timeout: float) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "tessera", *args], capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:.0f} s", time.perf_counter() - t0


def check(model: Path, work: Path, compile_args: list[str], timeout: float) -> dict:
    """One model through compile and run --check; the row of the table."""
    out = work / model.stem
    rc, so, se, t_compile = _cli(["compile", str(model), "-o", str(out), *compile_args], timeout)
    row: dict = {"model": model.name, "compile_rc": rc, "compile_s": round(t_compile, 1),
                 "warnings": [ln for ln in se.splitlines() if WARNING.search(ln)]}
    if rc != 0:
        row["error"] = (se.strip().splitlines() or ["(no stderr)"])[-1]
        return row
    rc, so, se, t_run = _cli(["run", str(out), "--check", "--seed", "1"], timeout)
    row.update(run_rc=rc, run_s=round(t_run, 1), check=[ln for ln in so.splitlines() if "rel" in ln.lower()],
               passed=rc == 0)
    row["warnings"] += [ln for ln in se.splitlines() if WARNING.search(ln)]
    if rc != 0:
        row["error"] = (se.strip().splitlines() or so.strip().splitlines() or ["(no output)"])[-1]
    return row


def worst_rel_l2(lines: list[str]) -> str:
    """The largest rel L2 among run --check's output lines, with the output's name (the lines themselves are
    too wide for the table, and cutting them cut the exponent off: "rel L2 8.365" for 8.365e-04)."""
    found = [(float(m.group(2)), m.group(1)) for ln in lines if (m := REL_L2.search(ln))]
    if not found:
        return "-"
    err, name = max(found)
    return f"{err:.3e} ({name}{', worst of ' + str(len(found)) if len(found) > 1 else ''})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--cost", default="auto")
    ap.add_argument("--solver", default=None, help="passed to tessera compile (default: its own)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per command")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="start no new model after this long")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    models = sorted(args.folder.glob("*.onnx"), key=lambda p: (p.stat().st_size, p.name))
    rows, t0 = [], time.perf_counter()
    env_db = ["--db", str(Path(tempfile.mkdtemp()) / "tuning.db")]  # one fresh database for the sweep
    with tempfile.TemporaryDirectory() as work:
        for m in models:
            if time.perf_counter() - t0 > args.budget_s:
                rows.append({"model": m.name, "skipped": "budget spent"})
                continue
            row = check(m, Path(work), ["--precision", args.precision, "--cost", args.cost, *env_db,
                                              *(["--solver", args.solver] if args.solver else [])], args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        import torch

        dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        args.out.write_text(json.dumps({"device": dev, "date": time.strftime("%Y-%m-%d"),
                                        "precision": args.precision, "cost": args.cost, "rows": rows}, indent=1))
    print("\n| model | compile s | run --check | rel L2 | warnings |\n| --- | ---: | --- | --- | ---: |")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['model']} | - | skipped ({r['skipped']}) | - | - |")
            continue
        verdict = "PASS" if r.get("passed") else f"FAIL: {r.get('error', '')}"
        print(f"| {r['model']} | {r['compile_s']} | {verdict} | {worst_rel_l2(r.get('check', []))} | "
              f"{len(r['warnings'])} |")
    sys.exit(0 if all(r.get("passed") for r in rows if "skipped" not in r) else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
