"""A first look at speed (issue 4 close-out, before measured tuning): tessera vs torch, same process.

    PYTHONPATH=. python scripts/first_look.py --models resnet50,bert_base --precisions tf32,fp16 --out $OUT

Each zoo model is built once from a seed (the PyTorch module and the ONNX file
tessera compiles carry the same weights), then timed on the same inputs:
the tessera executable (analytical plan, untuned default schedules, CUDA-graph
replay), PyTorch eager, and torch.compile(mode="reduce-overhead"). Medians of
triton.testing.do_bench. Every timed output is checked against eager.
This is not the issue-5 benchmark: no tuning, two models, no max-autotune.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tessera.zoo import build, make  # noqa: E402

import tessera  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2  # noqa: E402


def bench(fn) -> float:
    return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))


def one(name: str, precision: str, tmp: Path, solver: str, cost: str, db: str | None) -> dict:
    path = build(name, tmp, seed=0)
    module, args = make(name, seed=0)
    module = module.cuda()
    args = tuple(a.cuda() for a in args)
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if precision == "fp16":
        module = module.half()
        args = tuple(a.half() if a.is_floating_point() else a for a in args)
    exe = tessera.compile(path, tessera.CompileOptions(precision=precision, solver=solver, cost=cost, db=db), device="cuda")
    feeds = dict(zip(exe.input_names, args))
    feeds = exe.prepare_inputs(**feeds)
    row = {"model": name, "precision": precision, "cost": cost, "kernels": len(exe.steps), "backends": exe.backends,
           "tuning": exe.plan.get("tuning", {}), "compile_s": exe.plan.get("timings_s", {})}
    with torch.no_grad():
        ref = module(*args).float()
        ours = exe.run_static(feeds)[exe.output_names[0]].float()
        row["rel_l2_vs_eager"] = rel_l2(ours.cpu().numpy(), ref.cpu().numpy())
        row["tessera_ms"] = bench(lambda: exe.run_static(feeds))
        row["eager_ms"] = bench(lambda: module(*args))
        compiled = torch.compile(module, mode="reduce-overhead")
        for _ in range(3):
            compiled(*args)
        row["inductor_cudagraphs_ms"] = bench(lambda: compiled(*args))
        row["inductor_rel_l2_vs_eager"] = rel_l2(compiled(*args).float().cpu().numpy(), ref.cpu().numpy())
    row["ok"] = row["rel_l2_vs_eager"] < TOLERANCE[precision] * 10  # two low-precision runs differ twice over
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,bert_base")
    ap.add_argument("--precisions", default="tf32,fp16")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--cost", default="analytical", choices=["analytical", "measured"])
    ap.add_argument("--db", help="tuning database (measured cost)")
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args()
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__}
    rows = []
    tmp = Path(tempfile.mkdtemp())
    for m in a.models.split(","):
        for p in a.precisions.split(","):
            try:
                rows.append(one(m, p, tmp, a.solver, a.cost, a.db))
            except Exception as e:  # noqa: BLE001 - record and go on
                rows.append({"model": m, "precision": p, "error": f"{type(e).__name__}: {e}"[:500]})
            print(json.dumps(rows[-1]), flush=True)
    (a.out / "first_look.json").write_text(json.dumps({"env": env, "results": rows}, indent=1))
    print(f"\n{env}\n{'model':<12}{'prec':<6}{'tessera ms':>11}{'eager ms':>10}{'inductor-cg ms':>15}"
          f"{'vs inductor':>12}{'rel L2':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<12}{r['precision']:<6} {r['error']}")
            continue
        print(f"{r['model']:<12}{r['precision']:<6}{r['tessera_ms']:>11.3f}{r['eager_ms']:>10.3f}"
              f"{r['inductor_cudagraphs_ms']:>15.3f}{r['tessera_ms'] / r['inductor_cudagraphs_ms']:>11.2f}x"
              f"{r['rel_l2_vs_eager']:>10.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
