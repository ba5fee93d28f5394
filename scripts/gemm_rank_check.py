"""How well the GEMM template ranking picks, on timings already taken (CPU only).

Reads `scripts/gemm_probe.py`'s JSON files: every schedule of a linear layer `x @ w + b`, timed
on the GPU. For each (layer, precision) it ranks the tuning's space for that kernel as tuning
does (`rank_templates` on the same graph the probe built), and reports the best measured time
among the first k ranked schedules over the best measured in the space (1.00: the ranking's
first k hold the space's best). Tuning measures the first `GEMM_FAMILIES` (4).

    PYTHONPATH=. python scripts/gemm_rank_check.py \\
        scripts/results/bench/session21/gemm_probe.json:fp16 \\
        scripts/results/bench/session28/call3/gemm_probe_tf32.json:tf32 --json out.json

A file may be followed by `:PRECISION` to take only its rows of that precision (session 21's tf32
rows were timed when tf32 dots read the weight N-major, on mma.sync, so they no longer describe
the kernels tessera generates).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

os.environ.setdefault("TESSERA_TEST_DEVICE", "cpu")
sys.path.insert(0, "tests")
from onnx import helper  # noqa: E402
from opcheck import Const, graph_model, rand  # noqa: E402
from test_gemm_template import matmul_kernel  # noqa: E402

from tessera.codegen.kernels import schedule_from_json  # noqa: E402
from tessera.cost.schedule_model import GEMM_FAMILIES, rank_templates  # noqa: E402
from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.rewrite import convert_precision  # noqa: E402

TOPS = (1, 2, GEMM_FAMILIES)


def ranked(m: int, k: int, n: int, precision: str) -> list:
    """The tuning's ranking of the probe's kernel (the same graph `gemm_probe.linear_jobs` builds)."""
    x, w, b = rand(m, k, seed=1), rand(k, n, seed=2, lo=-0.5, hi=0.5), rand(n, seed=3)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["out"])],
                        {"x": x, "w": Const(w), "b": Const(b)}, ["out"])
    g = convert_precision(fission(load(model).graph).graph, precision)
    prims, pro, outputs = matmul_kernel(g)
    return rank_templates(g, pro + prims, outputs, precision)


def check(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        timed = {schedule_from_json(e["schedule"]): e["us"] for e in r["all"] if math.isfinite(e["us"])}
        order = ranked(r["m"], r["k"], r["n"], r["precision"])
        best = min(timed[s] for s in order if s in timed)
        picks = {f"top{k}": min((timed[s] for s in order[:k] if s in timed), default=math.inf) / best for k in TOPS}
        out.append({"shape": r["shape"], "precision": r["precision"], "space_best_us": best,
                    "unmeasured_in_top": sum(s not in timed for s in order[:GEMM_FAMILIES]), **picks})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("probes", nargs="+", help="gemm_probe JSON files, each optionally FILE:PRECISION")
    ap.add_argument("--json", help="write the table here too")
    args = ap.parse_args()
    rows = []
    for spec in args.probes:
        path, _, precision = spec.partition(":")
        rows += [r for r in json.load(open(path))["rows"] if not precision or r["precision"] == precision]
    res = check(rows)
    print("| layer | precision | space best µs | " + " | ".join(f"first {k}" for k in TOPS) + " |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in TOPS) + " |")
    for x in res:
        print(f"| {x['shape']} | {x['precision']} | {x['space_best_us']:.2f} | "
              + " | ".join(f"{x[f'top{k}']:.2f}" for k in TOPS) + " |")
    for k in TOPS:
        vals = [x[f"top{k}"] for x in res]
        print(f"first {k}: geomean {math.exp(sum(map(math.log, vals)) / len(vals)):.3f}, worst {max(vals):.2f}")
    if args.json:
        json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
