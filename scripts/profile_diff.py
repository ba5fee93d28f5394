"""Two runs of one model set side by side, kernel by kind of kernel: where one plan spends GPU time the
other does not. For an A/B of two commits or two options (session 54: the partitions, the timings).

    python scripts/profile_diff.py A.json B.json [--top N] [--schedules]
    python scripts/profile_diff.py A.json --estimates [--top N]

Reads tessera's main entry of two `bench_suite.py --profile` rows (`extra.run_profile.kernels`: the CUDA
kernels of the replay, each named after its plan kernel) and groups kernels by name without their
`kN_` prefix (`k12_matmul_reshape` and `k40_matmul_reshape` are one group). Prints each group's count
and GPU µs per call in A and in B, largest difference first. With --schedules, each plan kernel's
schedule in the groups shown, so two plans that differ only by a schedule show it.

With --estimates and one row, each group's cost as the plan estimated it (`extra.profile.estimate_us`,
rows since session 54) beside its replay, the largest misjudgement first: where the cost model (the
measured timings, under a measured compile) and the model's run disagree.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_suite import tessera_entry  # noqa: E402 - the suite's choice of tessera's main entry


def _group(name: str) -> str:
    """A plan kernel's name without its index (`k12_matmul_reshape` -> `matmul_reshape`)."""
    return re.sub(r"^k\d+_", "", name)


def _summed(rows: Iterable[tuple[str, float, float]]) -> dict[str, tuple[float, float]]:
    """(group, count, µs) rows summed by group."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, count, us in rows:
        out[name][0] += count
        out[name][1] += us
    return {n: (c, us) for n, (c, us) in out.items()}


def groups(extra: dict) -> dict[str, tuple[float, float]]:
    """Kernel name without its plan index -> (launches per call, GPU µs per call)."""
    return _summed((_group(k["name"]), k["calls"], k["us"]) for k in extra["run_profile"]["kernels"])


def schedules(extra: dict) -> dict[str, set[str]]:
    """Kernel group -> the distinct schedules its plan kernels took."""
    out: dict[str, set[str]] = defaultdict(set)
    for k in extra.get("plan", []):
        sch = k.get("schedule")
        out[_group(k["name"])].add("-" if not sch else " ".join(f"{key}={v}" for key, v in sch.items()))
    return out


def estimates(extra: dict) -> dict[str, tuple[float, float]]:
    """Kernel group -> (plan kernels, estimated µs per call): the plan's own kernels, library calls
    and the epilogue kernels they launch counted under their plan kernel's name."""
    return _summed((_group(name), 1, us) for name, us in extra["profile"]["estimate_us"].items())


def by_plan_kernel(extra: dict) -> dict[str, tuple[float, float]]:
    """The replay grouped like `estimates`: each CUDA kernel under the plan kernel it ran for (a
    library call's cuBLAS kernel too), None's kernels under "(unattributed)"; each plan kernel
    counted once."""
    seen: set[str | None] = set()

    def row(k: dict) -> tuple[str, float, float]:
        pk = k.get("plan_kernel")
        first = pk not in seen
        seen.add(pk)
        return (_group(pk) if pk else "(unattributed)"), float(first), k["us"]

    return _summed(row(k) for k in extra["run_profile"]["kernels"])


def _estimate_table(extra: dict, top: int) -> None:
    est, ran = estimates(extra), by_plan_kernel(extra)
    print(f"estimate {extra['profile']['total_cost_us']:.1f} us, replay {extra['run_profile']['total_us']:.1f} us")
    names = sorted(set(est) | set(ran), key=lambda n: -abs(ran.get(n, (0, 0))[1] - est.get(n, (0, 0))[1]))
    print(f"{'kernel (without kN_)':<48}{'n':>5}{'est us':>9}{'ran us':>9}{'ran/est':>9}")
    for n in names[:top]:
        (c, e), (_, r) = est.get(n, (0, 0.0)), ran.get(n, (0, 0.0))
        print(f"{n[:47]:<48}{c:>5.0f}{e:>9.1f}{r:>9.1f}{(f'{r / e:.2f}' if e > 0 else '-'):>9}")


def _extra(f: Path, need: str) -> dict | None:
    entry = tessera_entry(json.loads(f.read_text()))
    extra = entry["extra"] if entry else {}
    if not extra.get("run_profile") or (need == "estimates" and "estimate_us" not in (extra.get("profile") or {})):
        print(f"{f}: no tessera row with a profile" + (" and its estimates (rows since session 54)"
              if need == "estimates" else "") + " (run bench_suite.py with --profile)", file=sys.stderr)
        return None
    return extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path, nargs="?")
    ap.add_argument("--top", type=int, default=12, help="groups shown (largest difference first)")
    ap.add_argument("--schedules", action="store_true", help="each group's schedules in A and B")
    ap.add_argument("--estimates", action="store_true", help="one row: the plan's estimates beside its replay")
    args = ap.parse_args(argv)
    if args.estimates:
        extra = _extra(args.a, "estimates")
        if extra is None:
            return 2
        _estimate_table(extra, args.top)
        return 0
    if args.b is None:
        ap.error("two rows to compare, or one with --estimates")
    extras = []
    for f in (args.a, args.b):
        extra = _extra(f, "profile")
        if extra is None:
            return 2
        extras.append(extra)
    ga, gb = groups(extras[0]), groups(extras[1])
    sa, sb = schedules(extras[0]), schedules(extras[1])
    for f, x in zip((args.a, args.b), extras):
        print(f"{f}: {x['run_profile']['total_us']:.1f} us GPU per call, {x['kernels']} plan kernels")
    names = sorted(set(ga) | set(gb), key=lambda n: -abs(ga.get(n, (0, 0))[1] - gb.get(n, (0, 0))[1]))
    print(f"{'kernel (without kN_)':<48}{'A n':>5}{'A us':>9}{'B n':>5}{'B us':>9}{'A - B':>9}")
    for n in names[:args.top]:
        (ca, ua), (cb, ub) = ga.get(n, (0, 0.0)), gb.get(n, (0, 0.0))
        print(f"{n[:47]:<48}{ca:>5.0f}{ua:>9.1f}{cb:>5.0f}{ub:>9.1f}{ua - ub:>+9.1f}")
        if args.schedules and (sa.get(n) or sb.get(n)) and sa.get(n) != sb.get(n):
            for side, sch in (("A", sa), ("B", sb)):
                print(f"    {side}: {'; '.join(sorted(sch.get(n, {'(none)'})))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
