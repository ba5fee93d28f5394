"""Figures about tuning that need no GPU, from the models and the committed H100 measurements.

    PYTHONPATH=. python scripts/tuning_stats.py --out scripts/results/tuning_stats.json [--lazy]

1. Distinct candidate kernels per model (what `--tune all` measures), counted
   with a fake profiler.
2. Measured time over the analytical estimate, for every candidate of four
   small models found in scripts/results/tuning_h100.jsonl (H100): the
   evidence for the lower bound that `--tune lazy` uses (BOUND_FACTOR).
3. With --lazy: lazy against exhaustive measurement on bert_tiny with fake
   costs (measurements and wall time of each).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fake_profiler import FakeProfiler  # noqa: E402

from tessera.codegen.select import TritonLegality  # noqa: E402
from tessera.cost import AnalyticalCost, device  # noqa: E402
from tessera.cost.db import TuningDB  # noqa: E402
from tessera.cost.measured import MeasuredCost  # noqa: E402
from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.orchestrate import build_ograph, orchestrate  # noqa: E402
from tessera.orchestrate.candidates import CandidateRules, enumerate_candidates  # noqa: E402

MODELS = ROOT.parent / "shared" / "models"
H100 = ("NVIDIA H100 80GB HBM3", "tessera 0.1.0 codegen 1; torch 2.11.0+cu130; triton 3.6.0; cuda 13.0")


def og_of(name: str):
    return build_ograph(fission(load(MODELS / f"{name}.onnx").graph).graph)


def distinct(names: list[str]) -> dict[str, dict[str, int]]:
    out = {}
    for m in names:
        og = og_of(m)
        with TuningDB(Path(tempfile.mkdtemp()) / "t.db") as db:
            prof = FakeProfiler()
            cost = MeasuredCost(og, db, prof, "fake", "v1")
            orchestrate(og, cost, legality=TritonLegality())
            out[m] = {"candidates": cost.stats["candidates"], "distinct": prof.calls}
        print(m, out[m], flush=True)
    return out


def ratios(names: list[str]) -> dict[str, float]:
    db_path = Path(tempfile.mkdtemp()) / "h100.db"
    with TuningDB(db_path) as db:
        db.import_(ROOT / "scripts" / "results" / "tuning_h100.jsonl")
        r = []
        for m in names:
            og = og_of(m)
            an = AnalyticalCost(og, device("h100"))
            mc = MeasuredCost(og, db, None, *H100)
            for c in enumerate_candidates(og, og.all, CandidateRules(max_candidates=10**6), TritonLegality()):
                rec = db.get(mc.job(c).key)
                if rec is not None and math.isfinite(rec.seconds):
                    r.append(rec.seconds / an(c))
    r.sort()
    return {"candidates": len(r), "min": r[0], "p01": r[len(r) // 100], "median": statistics.median(r),
            "max": r[-1]}


def lazy_vs_all(name: str) -> dict[str, float]:
    from test_tuning import _TableProfiler

    og = og_of(name)
    an = AnalyticalCost(og, device("h100"))
    probe = MeasuredCost(og, None, None, "fake", "v1")
    table = {}
    for c in enumerate_candidates(og, og.all, CandidateRules(max_candidates=10**6), TritonLegality()):
        sig = probe.job(c).key.signature
        table[sig] = an(c) * (1 + 2 * (int(sig[:6], 16) % 997) / 997)
    d = tempfile.mkdtemp()
    t0 = time.perf_counter()
    with TuningDB(os.path.join(d, "a.db")) as db:
        full = _TableProfiler(table)
        orchestrate(og, MeasuredCost(og, db, full, "fake", "v1"), legality=TritonLegality())
    t1 = time.perf_counter()
    with TuningDB(os.path.join(d, "l.db")) as db:
        lazy = _TableProfiler(table)
        plan = orchestrate(og, MeasuredCost(og, db, lazy, "fake", "v1", bound=lambda c: 0.6 * an(c)),
                           legality=TritonLegality())
    t2 = time.perf_counter()
    return {"all_measured": full.calls, "all_s": round(t1 - t0, 1), "lazy_measured": lazy.calls,
            "lazy_s": round(t2 - t1, 1), "lazy_rounds": [s.solver["measure_rounds"] for s in plan.subgraphs]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lazy", action="store_true")
    a = ap.parse_args()
    doc = {"machine": "CPU (fake profiler), H100 measurements from tuning_h100.jsonl",
           "distinct_candidates": distinct(["candy", "mobilenet_v2", "efficientvit_b0", "segformer_b0"]),
           "measured_over_analytical_h100": ratios(["attn_s7", "bert_tiny", "gpt2_tiny", "candy_small"])}
    if a.lazy:
        doc["lazy_vs_all_bert_tiny"] = lazy_vs_all("bert_tiny")
    text = json.dumps(doc, indent=1)
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
