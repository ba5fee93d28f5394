"""Compile models and check them on a device, in several precisions: the GPU correctness run.

    PYTHONPATH=. python scripts/run_check.py --dir carry/models --zoo resnet50,inception_v3,bert_base,gpt2 \
        --precisions fp32,tf32,fp16 --workers 12 --out $OUT

Each (model, precision) is compiled (analytical cost, optimal plan) in a
worker process, run by the executable on the device (generated Triton
kernels, torch for linear and opaque primitives, CUDA-graph replay), and
compared with onnxruntime (fp32, CPU) on fresh random inputs: twice, with two
seeds, so the second call checks the replayed graph on new inputs. Prints a
table last and writes run_check.json. `run_check.py --table A.json B.json`
prints the markdown table of docs/results.md from saved runs.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def check(path: str, precision: str, device: str, seed: int, solver: str, layout: str = "auto") -> dict:
    import torch

    import tessera
    from tessera.frontend import load as frontend_load
    from tessera.tolerance import TOLERANCE, rel_l2
    from tessera.verify import random_inputs, run_onnxruntime

    row: dict = {"model": Path(path).stem, "precision": precision, "layout": layout}
    try:
        t0 = time.perf_counter()
        opts = tessera.CompileOptions(precision=precision, solver=solver, cost="analytical", layout=layout)
        exe = tessera.compile(path, opts, device=device)
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        row["kernels"] = len(exe.steps)
        row["backends"] = exe.backends
        row["channels_last_tensors"] = sum(1 for t in exe.graph.types.values() if not t.plain)
        model = frontend_load(path)
        errs: dict[str, float] = {}
        t1 = time.perf_counter()
        for s in (seed, seed + 1):
            feeds = random_inputs(model.graph, s)
            ref = run_onnxruntime(model.model, feeds)
            outs = exe.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
            for k, v in outs.items():
                errs[k] = max(errs.get(k, 0.0), rel_l2(v.float().cpu().numpy(), ref[k]))
        row["run_s"] = round(time.perf_counter() - t1, 2)
        row["rel_l2"] = errs
        row["passed"] = all(e < TOLERANCE[precision] for e in errs.values())
    except Exception as e:  # noqa: BLE001 - record and go on
        row["passed"] = False
        row["error"] = f"{type(e).__name__}: {e}"[:2000]
        row["trace"] = traceback.format_exc()[-3000:]
    return row


def markdown(files: list[Path]) -> str:
    """One table (model x precision) from saved run_check.json files, for docs/results.md."""
    rows: dict[str, dict[str, dict]] = {}
    envs = []
    for f in files:
        doc = json.loads(f.read_text())
        envs.append(doc["env"])
        for r in doc["results"]:
            rows.setdefault(r["model"], {})[r["precision"]] = r
    precs = sorted({p for m in rows.values() for p in m}, key=["fp32", "tf32", "fp16", "bf16"].index)
    out = [f"| model | kernels (fp32) | backends (fp32) | {' | '.join(precs)} |",
           "| --- | ---: | --- |" + " ---: |" * len(precs)]
    for model in sorted(rows):
        base = rows[model].get("fp32", next(iter(rows[model].values())))
        be = ", ".join(f"{v} {k}" for k, v in sorted(base.get("backends", {}).items()))
        cells = []
        for p in precs:
            r = rows[model].get(p)
            if r is None:
                cells.append("-")
                continue
            worst = max(r["rel_l2"].values()) if r.get("rel_l2") else float("nan")
            cells.append(f"{worst:.1e}" + ("" if r["passed"] else " **FAIL**"))
        out.append(f"| {model} | {base.get('kernels', '-')} | {be} | {' | '.join(cells)} |")
    env = envs[0]
    out.append("")
    out.append(f"{env['device']}, {env['date'][:10]}, torch {env['torch']}, Triton {env.get('triton')}, "
               f"onnxruntime {env.get('onnxruntime')}.")
    return "\n".join(out)


def main() -> int:
    if sys.argv[1:2] == ["--table"]:
        print(markdown([Path(a) for a in sys.argv[2:]]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--models", default="", help="comma-separated stems to keep from --dir (default: all)")
    ap.add_argument("--zoo", default="")
    ap.add_argument("--precisions", default="fp32,tf32,fp16")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--solver", default="cbc")
    ap.add_argument("--layout", default="auto", help="the layout policy: auto, nchw or nhwc")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()

    import torch

    from tessera.zoo import build

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.machine(),
           "torch": torch.__version__, "python": platform.python_version()}
    try:
        import onnxruntime
        import triton
        env.update(triton=triton.__version__, onnxruntime=onnxruntime.__version__)
    except ImportError:
        pass
    paths = sorted(args.dir.glob("*.onnx")) if args.dir else []
    keep = {m for m in args.models.split(",") if m}
    if keep:
        paths = [p for p in paths if p.stem in keep]
    tmp = Path(tempfile.mkdtemp())
    paths += [build(n, tmp) for n in args.zoo.split(",") if n]
    # Big models first, so the slowest compiles start early.
    paths.sort(key=lambda p: -p.stat().st_size)
    jobs = [(str(p), prec) for p in paths for prec in args.precisions.split(",")]
    rows = []
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        futs = [pool.submit(check, p, prec, args.device, args.seed, args.solver, args.layout) for p, prec in jobs]
        for f in cf.as_completed(futs):
            r = f.result()
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "trace"}), flush=True)
    rows.sort(key=lambda r: (r["model"], r["precision"]))
    (args.out / "run_check.json").write_text(json.dumps({"env": env, "results": rows}, indent=1))
    for r in rows:
        if "trace" in r:
            print(f"--- {r['model']} {r['precision']}\n{r['trace']}")
    print(f"\n{env}")
    print(f"{'model':<26}{'prec':<6}{'kernels':>8}  {'backends':<34}{'max rel L2':>11}  result")
    for r in rows:
        worst = max(r["rel_l2"].values()) if r.get("rel_l2") else float("nan")
        be = " ".join(f"{k}:{v}" for k, v in sorted(r.get("backends", {}).items()))
        print(f"{r['model']:<26}{r['precision']:<6}{r.get('kernels', '-'):>8}  {be:<34}{worst:>11.2e}  "
              f"{'PASS' if r['passed'] else 'FAIL'}  {r.get('error', '')[:200]}")
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} passed")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
