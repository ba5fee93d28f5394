"""The error a precision costs a model by itself, independent of tessera's kernels.

    PYTHONPATH=. python scripts/precision_floor.py ../shared/models/candy.onnx --zoo inception_v3

For each model, compares with onnxruntime (fp32) two emulations run by the
NumPy reference interpreter:
- tf32: float64 arithmetic, with the operands of every conv and matmul rounded
  to TF32 (10 mantissa bits), which is what tensor cores do;
- fp16: the graph after tessera's fp16 precision pass, every value rounded to
  float16 as it is stored (the interpreter computes in float16 NumPy, wider
  than any kernel that accumulates in fp32, so this is optimistic).
If an emulation already misses the tolerance, no fp16/tf32 executor can meet
it on this model: the failure belongs to the model's value range.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2  # noqa: E402
from tessera.verify import random_inputs, run_at_precision, run_onnxruntime  # noqa: E402


def floors(path: Path, seed: int) -> dict:
    loaded = load(path)
    g = fission(loaded.graph).graph
    feeds = random_inputs(loaded.graph, seed)
    ref = run_onnxruntime(loaded.model, feeds)
    tf32 = run_at_precision(g, feeds, "tf32")
    fp16 = run_at_precision(g, feeds, "fp16")
    row = {"model": path.stem}
    for name, out in (("tf32", tf32), ("fp16", fp16)):
        errs = {k: rel_l2(np.asarray(out[k], np.float64), ref[k]) for k in g.outputs}
        row[name] = max(errs.values())
        row[f"{name}_passes"] = row[name] < TOLERANCE[name]
    row["max_abs_output"] = max(float(np.abs(ref[k]).max()) for k in g.outputs)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--zoo", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    paths = list(args.models)
    if args.zoo:
        from tessera.zoo import build
        tmp = Path(tempfile.mkdtemp())
        paths += [build(n, tmp) for n in args.zoo.split(",")]
    rows = []
    for p in paths:
        rows.append(floors(p, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(f"\n{'model':<24}{'emulated tf32':>14}{'emulated fp16':>15}{'max |output|':>14}")
    for r in rows:
        print(f"{r['model']:<24}{r['tf32']:>14.2e}{r['fp16']:>15.2e}{r['max_abs_output']:>14.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
