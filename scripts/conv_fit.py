"""Fit the convolution template ranking (`cost/schedule_model.py`, `ConvParams`) to the sweep probe.

Reads `scripts/conv_sweep_probe.py`'s JSON (one file per precision), prices every timed schedule
that the tuning's space (`codegen/conv.py::conv_schedules`, as the code stands) holds with the
model's own terms (`conv_terms`), and fits their weights and an intercept by non-negative least
squares on relative error (each schedule's row divided by its measured time). It then reports how
well the ranking picks, per (shape, precision): the best measured time among the model's first k
schedules over the best measured in the space (geomean and worst), for
- the fitted weights, in sample and with each shape left out of the fit;
- the weights the code holds now (`CONV_PARAMS`), through `rank_templates` as tuning calls it.

    PYTHONPATH=. python scripts/conv_fit.py scripts/results/conv_sweep/conv_sweep_{fp16,tf32}.json.gz --out fit.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass

os.environ.setdefault("TESSERA_TEST_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "tests")
import numpy as np  # noqa: E402
from conv_sweep_probe import SHAPES, conv_jobs  # noqa: E402

from tessera.codegen.conv import ConvProblem, conv_problem, conv_schedules  # noqa: E402
from tessera.codegen.kernels import ConvSchedule  # noqa: E402
from tessera.cost.devices import device  # noqa: E402
from tessera.cost.schedule_model import CONV_TERMS, _epilogue_bytes, conv_terms, rank_templates, template_rate  # noqa: E402

DEV = device("h100")
TOPS = (1, 2, 4)


@dataclass
class Row:
    label: str
    precision: str
    problem: ConvProblem
    itemsize: int
    operand_bytes: float
    epilogue_bytes: float
    rate: float
    measured: dict[ConvSchedule, float]  # seconds of each timed schedule of the tuning's space
    ranked: list[ConvSchedule]  # rank_templates' order, with the code's weights

    def terms(self, s: ConvSchedule) -> list[float]:
        t = conv_terms(s, self.problem, self.itemsize, self.operand_bytes, self.epilogue_bytes, self.rate, DEV)
        return [t[name] for name in CONV_TERMS] + [1.0]  # the last: the intercept


def load_rows(paths: list[str]) -> list[Row]:
    shapes = {label: rest for label, *rest in SHAPES}
    rows = []
    for path in paths:
        for r in json.load(gzip.open(path, "rt") if path.endswith(".gz") else open(path))["rows"]:
            jobs, _, _, _ = conv_jobs(r["shape"], *shapes[r["shape"]], r["precision"])
            j = jobs[1]
            g, root, nodes = j.graph, j.prims[0], list(j.prologue) + list(j.prims)
            p = conv_problem(g, root)
            itemsize = g.types[root.inputs[0]].dtype.itemsize
            timed = {ConvSchedule(**{k: v for k, v in e["schedule"].items() if k != "form"}): e["us"] * 1e-6
                     for e in r["all"] if math.isfinite(e["us"])}
            space = conv_schedules(p, itemsize, DEV.sms)
            measured = {s: timed[s] for s in space if s in timed and s.block_k}
            ranked = [s for s in rank_templates(g, nodes, list(j.outputs), r["precision"], DEV) if s in measured]
            rows.append(Row(r["shape"], r["precision"], p, itemsize,
                            sum(g.types[t].nbytes for t in root.inputs),
                            _epilogue_bytes(g, nodes, list(j.outputs), root),
                            template_rate(g.types[root.inputs[0]].dtype, r["precision"], DEV), measured, ranked))
    return rows


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every weight >= 0: drop the negative ones and solve again until none is."""
    keep = list(range(x.shape[1]))
    while True:
        c, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if (c >= 0).all():
            break
        keep = [i for i, ci in zip(keep, c) if ci > 0]
    out = np.zeros(x.shape[1])
    out[keep] = c
    return out


def fit(rows: list[Row]) -> np.ndarray:
    x = np.array([[v / t for v in r.terms(s)] for r in rows for s, t in r.measured.items()])
    return nnls(x, np.ones(len(x)))


def regret(rows: list[Row], order) -> dict[int, tuple[float, float]]:
    """Per top k: (geomean, worst) over rows of the best time among order(row)[:k] over the best."""
    out = {}
    for k in TOPS:
        ratios = [min(r.measured[s] for s in order(r)[:k]) / min(r.measured.values()) for r in rows if r.measured]
        out[k] = (round(math.exp(statistics.mean(map(math.log, ratios))), 3), round(max(ratios), 2))
    return out


def by_weights(w: np.ndarray):
    return lambda r: sorted(r.measured, key=lambda s: float(np.dot(w, r.terms(s))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("probes", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = load_rows(args.probes)
    w = fit(rows)
    held_out: dict[str, np.ndarray] = {}
    for label in dict.fromkeys(r.label for r in rows):
        held_out[label] = fit([r for r in rows if r.label != label])
    report = {
        "schedules": sum(len(r.measured) for r in rows), "problems": len(rows),
        "weights": {name: float(f"{v:.4g}") for name, v in zip([*CONV_TERMS, "intercept_s"], w)},
        "fitted_in_sample": regret(rows, by_weights(w)),
        "fitted_shape_left_out": regret(rows, lambda r: by_weights(held_out[r.label])(r)),
        "code_ranking": regret(rows, lambda r: r.ranked),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        json.dump(report, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
