"""Tuning time per model from an empty database (issue 5's acceptance), resumable across device calls.

    PYTHONPATH=. python scripts/tuning_time.py --models zoo:segformer_b0,carry/a/candy_small.onnx \
        --precisions tf32,fp16 --results scripts/results/tuning_time_h100.json --out $OUT

Each (model, precision) is compiled with `--cost measured` into a fresh database, so
its time is a cold start; the rows are then merged into OUT/tuning.jsonl (what the
benchmark suite carries as pre-tuned data). Results already in --results are
skipped, so a suite too long for one call is finished by the next. The JSON
records candidates, measurements, tuning seconds, where the profiler's time went
(`profiler_stages_s`) and the compile's pass timings.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def model_path(spec: str, zoo_dir: Path) -> Path:
    """An ONNX path, or zoo:NAME built once into zoo_dir."""
    if not spec.startswith("zoo:"):
        return Path(spec)
    from tessera.zoo import build

    name = spec[4:]
    path = zoo_dir / f"{name}.onnx"
    if not path.exists():
        build(name, zoo_dir)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="comma-separated ONNX paths or zoo:NAME")
    ap.add_argument("--precisions", default="tf32,fp16")
    ap.add_argument("--results", type=Path, required=True, help="JSON of earlier results (read, then rewritten to --out)")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--zoo-dir", type=Path, default=Path(tempfile.gettempdir()) / "tessera-zoo")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no new model after this many seconds")
    a = ap.parse_args()

    from tessera.compiler import CompileOptions, compile_model
    from tessera.cost.db import TuningDB

    start = time.perf_counter()
    a.zoo_dir.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    results = json.loads(a.results.read_text()) if a.results.exists() else {"runs": []}
    done = {(r["model"], r["precision"]) for r in results["runs"]}
    merged = a.out / "tuning.jsonl"
    for spec in a.models.split(","):
        for prec in a.precisions.split(","):
            if (spec, prec) in done:
                print(f"skip {spec} {prec}: in {a.results}", flush=True)
                continue
            if time.perf_counter() - start > a.budget_s:
                print(f"stop before {spec} {prec}: {a.budget_s:.0f} s budget spent", flush=True)
                break
            path = model_path(spec, a.zoo_dir)
            db = Path(tempfile.mkdtemp()) / "fresh.db"
            t = time.perf_counter()
            try:
                r = compile_model(path, CompileOptions(cost="measured", db=str(db), precision=prec, solver=a.solver))
            except Exception as e:  # noqa: BLE001 - record it and go on
                print(f"{spec} {prec}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            run = {"model": spec, "precision": prec, "compile_s": round(time.perf_counter() - t, 1),
                   "kernels": len(r.plan.kernels), "timings_s": {k: round(v, 2) for k, v in r.timings.items()},
                   **{k: v for k, v in r.tuning.items() if k != "db"}}
            run["tuning_s"] = round(r.tuning["seconds"] + r.tuning.get("schedule_s", 0.0), 1)
            import torch

            run["device"] = torch.cuda.get_device_name()
            run["date"] = time.strftime("%Y-%m-%d")
            results["runs"].append(run)
            with TuningDB(db) as d:
                d.export(merged, append=True)
            (a.out / a.results.name).write_text(json.dumps(results, indent=1))
            print(f"{spec} {prec}: {run['candidates']} candidates, {run['measured']} measured, "
                  f"tuning {run['tuning_s']} s, compile {run['compile_s']} s; stages {run['profiler_stages_s']}",
                  flush=True)
    print("\n| model | precision | candidates | measured | tuning s | device |\n| --- | --- | ---: | ---: | ---: | --- |")
    for r in results["runs"]:
        print(f"| {r['model']} | {r['precision']} | {r['candidates']} | {r['measured']} | {r['tuning_s']} | {r['device']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
