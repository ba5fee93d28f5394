"""Cold tuning on one GPU against all visible GPUs (issue 5: measurement spread over every GPU).

    PYTHONPATH=. python scripts/multi_gpu.py --models zoo:segformer_b0,carry/gpu/candy_small.onnx \
        --precisions tf32 --out $OUT

Runs `scripts/tuning_time.py` twice, each model from an empty database: once with
CUDA_VISIBLE_DEVICES naming the first GPU only, once with every GPU. The profiler
reports the seconds it held each GPU (`gpuN_held` in `profiler_stages_s`), which
shows whether the work was spread; the tuning times show what spreading buys.
Writes OUT/multi_gpu.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(models: str, precisions: str, gpus: list[str], out: Path, solver: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    results = out / "tuning.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "tuning_time.py"), "--models", models,
                    "--precisions", precisions, "--results", str(results), "--out", str(out),
                    "--solver", solver, "--budget-s", "100000"], env=env, check=True)
    return json.loads(results.read_text())["runs"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="comma-separated ONNX paths or zoo:NAME")
    ap.add_argument("--precisions", default="tf32")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--solver", default="highs")
    a = ap.parse_args()
    import torch

    gpus = [str(i) for i in range(torch.cuda.device_count())]
    if len(gpus) < 2:
        print(f"this machine sees {len(gpus)} GPU(s); spreading needs two or more", file=sys.stderr)
        return 2
    doc = {"device": torch.cuda.get_device_name(), "gpus": len(gpus), "date": time.strftime("%Y-%m-%d"), "runs": []}
    for label, use in (("1", gpus[:1]), (str(len(gpus)), gpus)):
        for r in run(a.models, a.precisions, use, a.out / f"gpus{label}", a.solver):
            held = {k: v for k, v in r["profiler_stages_s"].items() if k.endswith("_held")}
            doc["runs"].append({"gpus": len(use), "model": r["model"], "precision": r["precision"],
                                "measured": r["measured"], "tuning_s": r["tuning_s"],
                                "time_phase_s": r["profiler_stages_s"].get("time_phase"),
                                "build_phase_s": r["profiler_stages_s"].get("build_phase"), "held_s": held})
    (a.out / "multi_gpu.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{doc['device']} x{doc['gpus']}, {doc['date']}")
    print("| model | precision | GPUs | measured | tuning s | build phase s | time phase s | seconds held per GPU |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in doc["runs"]:
        held = ", ".join(f"{k[:-5]} {v:.1f}" for k, v in sorted(r["held_s"].items()))
        print(f"| {r['model']} | {r['precision']} | {r['gpus']} | {r['measured']} | {r['tuning_s']} | "
              f"{r['build_phase_s']} | {r['time_phase_s']} | {held} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
