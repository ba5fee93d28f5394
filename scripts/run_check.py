"""Compile models and run them with `--check` semantics on a device.

    PYTHONPATH=. python scripts/run_check.py --device cuda --dir carry/models --zoo resnet50 --out $OUT

Each model is compiled (analytical cost, optimal plan, fp32), run through the
executable on the device, and compared with onnxruntime on the same fresh
random inputs. Prints a table and writes run_check.json. The torch backend
runs every kernel for now; this checks plans and the runtime, not speed.
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_zoo import build  # noqa: E402

import tessera  # noqa: E402
from tessera.frontend import load as frontend_load  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2  # noqa: E402
from tessera.verify import random_inputs, run_onnxruntime  # noqa: E402


def check(path: Path, device: str, seed: int) -> dict:
    t0 = time.perf_counter()
    exe = tessera.compile(path, tessera.CompileOptions(), device=device)
    model = frontend_load(path)
    feeds = random_inputs(model.graph, seed)
    ref = run_onnxruntime(model.model, feeds)
    outs = exe.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    errs = {k: rel_l2(v.cpu().numpy(), ref[k]) for k, v in outs.items()}
    return {"model": path.stem, "kernels": len(exe.steps), "rel_l2": errs,
            "passed": all(e < TOLERANCE["fp32"] for e in errs.values()), "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--zoo", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.machine(),
           "torch": torch.__version__, "python": platform.python_version()}
    paths = sorted(args.dir.glob("*.onnx")) if args.dir else []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths += [build(n, Path(tmp)) for n in args.zoo.split(",") if n]
        for p in paths:
            try:
                rows.append(check(p, args.device, args.seed))
            except Exception as e:  # noqa: BLE001 - record and go on
                rows.append({"model": p.stem, "passed": False, "error": f"{type(e).__name__}: {e}"})
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "run_check.json").write_text(json.dumps({"env": env, "results": rows}, indent=1))
    print(f"\n{env}\n{'model':<24}{'kernels':>8}  {'max rel L2':>11}  result")
    for r in rows:
        worst = max(r["rel_l2"].values()) if "rel_l2" in r else float("nan")
        print(f"{r['model']:<24}{r.get('kernels', '-'):>8}  {worst:>11.2e}  {'PASS' if r['passed'] else 'FAIL'}"
              f"  {r.get('error', '')}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
