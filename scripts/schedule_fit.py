"""How well the analytical schedule model ranks measured schedules, and a grid fit of its constants.

    python scripts/schedule_fit.py [--data scripts/results/schedule_data.jsonl.gz] [--fit]

Data: `scripts/schedule_data.py` (H100 timings of generated kernels under several schedules,
joined with xnumel, rnumel and bytes). Only Triton kernels count (a linear kernel's time is
mostly the library call). For each kernel with two or more measured schedules, a ranking
picks its top 1 (or top 2) among the measured ones; the regret is the picked time over the
best measured time. Reported for the model (`tessera.cost.schedule_model`) and for the
schedule space's own order (what post-scheduling measured before: the first four).
With --fit, constants are grid-searched on the train models and scored on the others.
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.codegen.kernels import Schedule, schedules  # noqa: E402
from tessera.cost.devices import device  # noqa: E402
from tessera.cost.schedule_model import DEFAULT_PARAMS, ScheduleParams, predict  # noqa: E402

TRAIN = {"candy", "bert_base", "gpt2", "mobilenet_v2", "candy_small"}


def kernels(path: Path) -> list[dict]:
    by: dict[str, dict] = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        r = json.loads(line)
        if r["backend"] != "triton" or r["seconds"] is None:
            continue
        k = by.setdefault(r["signature"], {"model": r["model"], "xnumel": r["xnumel"], "rnumel": r["rnumel"],
                                           "bytes": r["bytes"], "runs": []})
        k["runs"].append((Schedule(r["xblock"], r["rblock"], r["num_warps"], r["persistent"]), r["seconds"]))
    return [k for k in by.values() if len(k["runs"]) >= 2]


def regrets(ks: list[dict], order, top: int) -> list[float]:
    out = []
    for k in ks:
        best = min(t for _, t in k["runs"])
        picked = order(k)[:top]
        out.append(min(t for _, t in picked) / best)
    return out


def by_model(p: ScheduleParams):
    dev = device("h100")
    return lambda k: sorted(k["runs"], key=lambda r: predict(r[0], k["xnumel"], k["rnumel"], k["bytes"], dev, p))


def by_space(k: dict) -> list:
    space = schedules(k["xnumel"], k["rnumel"])
    pos = {s: i for i, s in enumerate(space)}
    return sorted(k["runs"], key=lambda r: pos.get(r[0], len(space)))


def summary(xs: list[float]) -> dict[str, float]:
    return {"mean": round(statistics.fmean(xs), 4), "p90": round(sorted(xs)[int(0.9 * (len(xs) - 1))], 4),
            "max": round(max(xs), 3), "exact": round(sum(1 for x in xs if x <= 1.0 + 1e-9) / len(xs), 3)}


def score(ks: list[dict], p: ScheduleParams) -> float:
    return statistics.fmean(regrets(ks, by_model(p), 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("scripts/results/schedule_data.jsonl.gz"))
    ap.add_argument("--fit", action="store_true")
    a = ap.parse_args()
    ks = kernels(a.data)
    train = [k for k in ks if k["model"] in TRAIN]
    test = [k for k in ks if k["model"] not in TRAIN]
    params = DEFAULT_PARAMS
    doc: dict = {"kernels": len(ks), "train": len(train), "test": len(test),
                 "spread_max_over_best": summary([max(t for _, t in k["runs"]) / min(t for _, t in k["runs"])
                                                  for k in ks])}
    if a.fit:
        grid = itertools.product((8, 16, 24, 32, 48), (16, 32, 64, 128), (0.25, 0.5, 1.0), (0.0, 5e-8, 2e-7))
        fits = []
        for w, v, s, loop in grid:
            p = replace(DEFAULT_PARAMS, warps_to_saturate=w, values_per_thread=v, spill_cost=s, loop_iteration_s=loop)
            fits.append((score(train, p), p))
        params = min(fits, key=lambda f: f[0])[1]
        doc["fitted"] = {k: getattr(params, k) for k in ("warps_to_saturate", "values_per_thread", "spill_cost",
                                                           "loop_iteration_s")}
    for name, part in (("all", ks), ("train", train), ("test", test)):
        doc[name] = {
            "model_top1": summary(regrets(part, by_model(params), 1)),
            "model_top2": summary(regrets(part, by_model(params), 2)),
            "space_order_top1": summary(regrets(part, by_space, 1)),
            "space_order_top2": summary(regrets(part, by_space, 2)),
        }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
