"""How a precision's rounding error grows layer by layer through a model (CPU, reference interpreter).

    PYTHONPATH=. python scripts/precision_growth.py MODEL.onnx [--precision tf32] [--seed 1]

Runs the primitive graph twice in float64: exactly, and with `tessera verify`'s emulation of the
precision (tf32: conv and matmul operands rounded to TF32). Prints, for every convolution and
matmul, the relative L2 error of its output, and how far each output channel's mean sits from zero
in units of its standard deviation (a large ratio would mean a following normalization amplifies
the error). A steady growth with ratios near 1 is plain accumulation over depth, not a defect of
the model's construction.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.tolerance import rel_l2  # noqa: E402
from tessera.verify import random_inputs, run_at_precision  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--precision", choices=["tf32"], default="tf32")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    g = fission(load(args.model).graph).graph
    feeds = random_inputs(g, args.seed)
    exact = run_at_precision(g, feeds, "fp32", keep_all=True)
    rounded = run_at_precision(g, feeds, args.precision, keep_all=True)
    print(f"| node | op | rel L2 ({args.precision}) | channel |mean|/std, median | max |")
    print("| --- | --- | ---: | ---: | ---: |")
    for n in g.nodes:
        if n.op not in ("conv", "matmul"):
            continue
        o = n.outputs[0]
        r = exact[o]
        ratio = ""
        if n.op == "conv":
            axes = tuple(range(2, r.ndim))
            q = np.abs(r.mean(axis=axes)) / (r.std(axis=axes) + 1e-30)
            ratio = f"{np.median(q):.2f} | {q.max():.1f}"
        print(f"| {n.name} | {n.op} | {rel_l2(rounded[o], r):.2e} | {ratio} |")
    for o in g.outputs:
        print(f"output {o}: rel L2 {rel_l2(rounded[o], exact[o]):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
