"""Build the large models (tessera/zoo.py), then verify fission on each.
With --dir, verify the .onnx files of a folder instead (e.g. ../shared/models).

Run on the GPU machine (it has torchvision and transformers), e.g. through the
device tool:

    PYTHONPATH=. python scripts/verify_zoo.py --out $OUT

Prints one table row per model (relative L2 error of the float64 reference
interpreter vs onnxruntime, fp32) and writes JSON with versions and date.
With --compile it also orchestrates each model (analytical cost, H100 preset)
and records kernels, solve times and the optimal and greedy estimates.
Verification and orchestration run on the CPU; the GPU is not needed yet.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tessera.zoo import build  # noqa: E402

import tessera  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--models", default="resnet50,inception_v3,bert_base,gpt2")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", type=Path, help="verify every .onnx file here instead of building the zoo")
    ap.add_argument("--compile", action="store_true", help="also orchestrate each model")
    args = ap.parse_args()
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cpu": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(), "torch": torch.__version__, "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
    }
    print(json.dumps(env), flush=True)
    rows = []
    names = sorted(p.stem for p in args.dir.glob("*.onnx")) if args.dir else args.models.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            row = {"model": name}
            try:
                if args.dir:
                    path = args.dir / f"{name}.onnx"
                else:
                    path = build(name, Path(tmp))
                    row["export_s"] = round(time.perf_counter() - t0, 1)
                summary = tessera.summarize(path)
                row.update(operators=summary["operators"]["total"], primitives=summary["primitives"]["total"],
                           opaque=[o["op"] for o in summary["opaque"]])
                report = tessera.verify(path, stage="fission", seed=args.seed)
                row.update({k: v for k, v in report.as_dict().items() if k != "model"})
                if args.compile:
                    t1 = time.perf_counter()
                    plan = tessera.compile_model(path, tessera.CompileOptions(gpu="h100")).plan
                    subs = plan.subgraphs
                    row["orchestrate"] = {
                        "kernels": len(plan.kernels), "subgraphs": len(subs), "cuts": len(plan.cuts),
                        "candidates": sum(s.candidates for s in subs),
                        "all_optimal": all(s.solver["optimal"] for s in subs),
                        "solve_max_s": max(s.solver["seconds"] for s in subs),
                        "optimal_us": plan.estimated_total_s * 1e6, "greedy_us": plan.greedy_total_s * 1e6,
                        "compile_s": time.perf_counter() - t1}
            except Exception as e:  # noqa: BLE001 - record and go on to the next model
                row.update(passed=False, error=f"{type(e).__name__}: {e}")
            row["total_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out_name = f"verify_{args.dir.name}.json" if args.dir else "verify_zoo.json"
    (args.out / out_name).write_text(json.dumps({"env": env, "results": rows}, indent=2))
    print(f"\n{'model':<24}{'ops':>6}{'prims':>7}{'opaque':>8}  {'max rel L2':>11}  result   time")
    for r in rows:
        errs = [o["rel_l2"] for o in r.get("outputs", [])]
        worst = f"{max(errs):.2e}" if errs else "-"
        o = r.get("orchestrate")
        plan = (f"  {o['kernels']} kernels, {o['optimal_us']:.0f} us vs greedy {o['greedy_us']:.0f} us, "
                f"solve max {o['solve_max_s']:.2f}s{'' if o['all_optimal'] else ' NOT OPTIMAL'}") if o else ""
        print(f"{r['model']:<24}{r.get('operators', '-'):>6}{r.get('primitives', '-'):>7}{len(r.get('opaque', [])):>8}"
              f"  {worst:>11}  {'PASS' if r.get('passed') else 'FAIL':<7}{r['total_s']:>6}s{plan}  {r.get('error', '')}")
    return 0 if all(r.get("passed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
