"""Replay the GEMM template lane's rule (`cost/measured.py`) on a schedule sweep's timings, offline.

For each product of a `scripts/gemm_probe.py` sweep JSON (its `all` rows: every schedule timed), rank
tessera's template space as a compile does now (`rank_templates`), "measure" the lane's first five
in rank (the family heads, the next in rank) and then walk the tile shapes of the fastest measured
(`cost/measured.py::_family_walk` under each variant's `GEMM_WALK_FAMILIES` and `GEMM_WALK`), reading
each time from the sweep. Prints what
each variant of the walk ends with against the best of tessera's own space. A replay of the rule on
measured numbers, not a compile: the lane's round structure is `tests/test_tuning.py`'s to check.

    PYTHONPATH=. python3 scripts/walk_replay.py [scripts/results/bench/session38/call5/gemm_probe_chains_tf32.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.codegen.kernels import GemmSchedule  # noqa: E402
from tessera.cost import measured  # noqa: E402
from tessera.cost.devices import device  # noqa: E402
from tessera.cost.schedule_model import GEMM_FAMILIES, rank_templates  # noqa: E402
from tessera.rewrite.rules.base import new_graph  # noqa: E402

LANE = GEMM_FAMILIES + 1  # the lane before its walk: the family heads and the next in rank (tune_schedules)
VARIANTS = ((2, 8), (3, 8), (3, 12))  # (shapes walked, schedules at most)


def schedule(s: dict) -> GemmSchedule:
    return GemmSchedule(s["block_m"], s["block_n"], s["block_k"], s["num_warps"], s["num_stages"], s["group_m"],
                        s["split_k"])


def walk(ranked: list[GemmSchedule], times: dict[GemmSchedule, float], shapes: int, cap: int) -> tuple[float, int]:
    """The fastest time the lane and its walk reach, and how many schedules they timed."""
    got = {s: times[s] for s in ranked[:LANE] if s in times}
    kept = measured.GEMM_WALK_FAMILIES, measured.GEMM_WALK
    measured.GEMM_WALK_FAMILIES, measured.GEMM_WALK = shapes, cap
    try:  # the compile's own walk, its jobs the schedules themselves
        walk_next = measured._family_walk(lambda s: s, ranked, list(got.items()))
    finally:
        measured.GEMM_WALK_FAMILIES, measured.GEMM_WALK = kept
    got.update((s, times[s]) for s in walk_next if s in times)
    return min(got.values()), len(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", type=Path,
                    default=Path(__file__).parent / "results/bench/session38/call5/gemm_probe_chains_tf32.json")
    a = ap.parse_args()
    doc = json.loads(a.sweep.read_text())
    dev = device("h100")
    ratios: dict[tuple[int, int], list[float]] = {v: [] for v in VARIANTS}
    print("| product | space (swept) | space best µs | " + " | ".join(f"{f} shapes, {c} at most" for f, c in VARIANTS) + " |")
    print("| --- | --- | ---: |" + " --- |" * len(VARIANTS))
    for row in doc["rows"]:
        g, b = new_graph({"a": (1, row["m"], row["k"]), "w": (1, row["k"], row["n"])})
        g.outputs = [b.matmul("a", "w")]
        ranked = rank_templates(g, list(g.nodes), g.outputs, row["precision"], dev)
        times = {schedule(e["schedule"]): e["us"] for e in row["all"] if not e["error"]}
        best = min(times[s] for s in ranked if s in times)
        cells = []
        for v in VARIANTS:
            us, n = walk(ranked, times, *v)
            ratios[v].append(us / best)
            cells.append(f"{us:.2f} ({us / best:.2f}, {n} timed)")
        print(f"| {row['shape']} | {len(ranked)} ({sum(s in times for s in ranked)}) | {best:.2f} | " + " | ".join(cells) + " |")
    for v, r in ratios.items():
        print(f"{v[0]} shapes, {v[1]} at most: geomean {math.exp(sum(map(math.log, r)) / len(r)):.3f} "
              f"of the space's best, worst {max(r):.3f}")


if __name__ == "__main__":
    main()
