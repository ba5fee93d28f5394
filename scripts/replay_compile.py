"""Replay a measured compile on a CPU from tuning rows the GPU machine returned.

    python scripts/replay_compile.py MODEL.onnx ROWS.jsonl[.gz] --device "NVIDIA H200" --precision tf32 \
        [--grep matmul_reshape_mul] [--no-templates] [--library-wins]

The rows' software versions are rewritten to this machine's, so the measured compile finds them.
Jobs with no row are recorded as failed ("not in the rows"), which is what keeps the replay honest:
a candidate that the GPU never timed cannot win here. The script prints how many jobs were missing
(a code change since the rows were taken changes signatures), the plan's kernels with their costs,
and for every kernel whose name matches --grep the candidates over the same primitives that the
database priced, by backend. Why: to ask "why did the plan not fuse X" without device time.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tessera.cost.db import TuningDB, software_versions  # noqa: E402
from tessera.cost.measured import Job, Record  # noqa: E402


class MissingRows:
    """A profiler that measures nothing: every job the rows lack fails."""

    def __init__(self) -> None:
        self.missing: list[Job] = []

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            self.missing.append(j)
            record(i, math.inf, "not in the rows")


def load_rows(src: Path, db: TuningDB, device: str, scratch: Path) -> int:
    """Import `src`'s rows of `device` into `db`, with this machine's software versions."""
    opener = gzip.open if src.suffix == ".gz" else open
    here = software_versions()
    n = 0
    with opener(src, "rt") as f, open(scratch / "rows.jsonl", "w") as out:
        for line in f:
            row = json.loads(line)
            if "device" in row:  # a measurement (other rows: the chain model's features)
                if row["device"] != device:
                    continue
                row["versions"] = here
            out.write(json.dumps(row) + "\n")
            n += 1
    db.import_(out.name)
    return n


def show(cost: object, db: TuningDB, grep: str, at: str, limit: int = 400) -> None:
    """Every priced candidate holding a node whose name holds `at` and whose op list holds `grep`:
    its library and template seconds as the database has them."""
    from tessera.orchestrate.candidates import bits

    og = cost.og  # type: ignore[attr-defined]
    rows = []
    for (nodes, outs), s in cost._cache.items():  # type: ignore[attr-defined]
        prims = [og.nodes[i] for i in bits(nodes)]
        if at and not any(at in n.name for n in prims):
            continue
        ops = "_".join(n.op for n in prims)
        if grep and grep not in ops:
            continue
        lib = cost._jobs.get((nodes, outs))  # type: ignore[attr-defined]
        tjobs = cost._tjobs.get((nodes, outs)) or []  # type: ignore[attr-defined]
        got = lambda j: (r.seconds * 1e6 if (r := db.get(j.key)) is not None else math.nan)  # noqa: E731
        lib_us = got(lib) if lib is not None else math.nan
        tpl = [(got(j), j.key.schedule) for j in tjobs]
        rows.append((s * 1e6, ops, len(bits(outs)), lib_us, tpl))
    for s, ops, nout, lib_us, tpl in sorted(rows)[:limit]:
        t = ", ".join(f"{u:.2f} {k}" for u, k in tpl)
        print(f"{s:8.2f}  lib {lib_us:7.2f}  outs {nout}  {ops[:70]}  | {t}")


def library_wins(plan: object, costs: list, db: TuningDB) -> None:
    """Each plan kernel whose library call beat every template schedule the database holds for it
    (before and after the solve): both times, their ratio and how many schedules were timed (issue
    14: where templates lost to the library)."""
    templates: dict[str, list[float]] = {}  # signature -> its template schedules' times, µs
    for r in db.rows():
        s = r["seconds"]  # None for a schedule that failed
        if str(r["schedule"]).startswith(("conv-", "gemm-", "chain-")) and s is not None and math.isfinite(float(s)):
            templates.setdefault(str(r["signature"]), []).append(float(s) * 1e6)
    indexed = [(cost, {n.name: i for i, n in enumerate(cost.og.nodes)}) for cost in costs]
    for k in plan.kernels:  # type: ignore[attr-defined]
        for cost, index in indexed:  # one per subgraph; the kernel's prims are named in one of them
            if not all(p in index for p in k.prims):
                continue
            nodes = sum(1 << index[p] for p in k.prims)
            for key in [key for key in cost._cache if key[0] == nodes]:
                lib = cost._jobs.get(key)
                rec = db.get(lib.key) if lib is not None else None
                tpl = templates.get(lib.key.signature, []) if lib is not None else []
                if rec is not None and tpl and rec.seconds * 1e6 < min(tpl):
                    lib_us = rec.seconds * 1e6
                    print(f"  {k.name}: library {lib_us:.2f} us, best template {min(tpl):.2f} us "
                          f"({min(tpl) / lib_us:.3f}x) of {len(tpl)} schedule(s)")
            break


def main() -> int:
    from tessera.compiler import CompileOptions, compile_model
    from tessera.rewrite.search import REWRITE_MODES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("rows", type=Path)
    ap.add_argument("--device", required=True, help="the rows' device name, e.g. 'NVIDIA H200'")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--gpu", default="h100", help="the cost model's preset (h100 or h200)")
    ap.add_argument("--grep", default="", help="list the plan's kernels whose name holds this, and the priced "
                    "candidates whose ops hold it")
    ap.add_argument("--at", default="", help="with --grep: only candidates holding a node named like this")
    ap.add_argument("--no-templates", action="store_true")
    ap.add_argument("--library-wins", action="store_true",
                    help="list the plan kernels whose library call beat every measured template schedule")
    ap.add_argument("--no-merge", action="store_true")
    ap.add_argument("--rewrites", choices=REWRITE_MODES, default=CompileOptions.rewrites)
    args = ap.parse_args()

    from tessera import compiler

    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda *a: args.device  # type: ignore[assignment]
    tmp = Path(tempfile.mkdtemp())
    db_path = tmp / "tuning.db"
    with TuningDB(db_path) as db:
        print(f"{load_rows(args.rows, db, args.device, tmp)} rows of {args.device}")
    prof = MissingRows()
    opt = CompileOptions(cost="measured", db=str(db_path), precision=args.precision, io="precision",
                         gpu=args.gpu, templates="off" if args.no_templates else "auto",
                         merge_matmuls=not args.no_merge, solver="highs", rewrites=args.rewrites)
    costs: list = []
    made = compiler.measured_cost

    def keep(*a, **k):  # the compile's cost function, kept to list its priced candidates
        costs.append(made(*a, **k))
        return costs[-1]

    compiler.measured_cost = keep
    res = compile_model(args.model, opt, profiler=prof)
    sigs = {j.key.signature for j in prof.missing}
    print(f"jobs without a row: {len(prof.missing)} ({len(sigs)} signatures)")
    plan = res.plan
    print(f"plan: {len(plan.kernels)} kernels, {sum(k.cost_s for k in plan.kernels) * 1e6:.1f} us")
    # what runs, by backend, at the tuned times where post-solve tuning timed them
    at = {k.name: res.tuned_s.get(k.name, k.cost_s) for k in plan.kernels}
    by: dict[str, list[float]] = {}
    for impl in res.kernels:
        by.setdefault(impl.backend, []).append(at.get(impl.name, 0.0))
    print("  by backend: " + ", ".join(f"{b} {len(v)} ({sum(v) * 1e6:.1f} us)" for b, v in sorted(by.items())))
    if res.tuned_s:  # kernels whose schedule was tuned after the solve: the measured cost that runs
        print("  tuned after the solve: " + ", ".join(f"{n} {s * 1e6:.2f} us" for n, s in res.tuned_s.items()))
    if res.rewrite_search:
        r = res.rewrite_search
        print(f"  rewrites found: {[a['rule'] for a in r['applied']]}; "
              + (f"tuned plan {r['plan_us'][0]} us with them, {r['plan_us'][1]} without: "
                 f"{'kept' if r['kept'] else 'dropped'}" if r.get("plan_us")
                 else "kept" if r.get("kept", True) else f"dropped unplanned (windows save {r.get('saved_us')} us)"))
    unpriced = [k.name for k in plan.kernels if k.cost_s >= 1.0]  # no candidate of theirs had a row
    if unpriced:
        print(f"  {len(unpriced)} kernels without a measured candidate (1 s each above): {', '.join(unpriced[:6])}")
    if args.grep:
        for k in plan.kernels:
            if args.grep in k.name:
                print(f"  {k.name}: {k.cost_s * 1e6:.2f} us")
        with TuningDB(db_path) as db:  # the compile closed its handle
            show(costs[-1], db, args.grep, args.at)
    if args.library_wins:
        with TuningDB(db_path) as db:
            library_wins(plan, costs, db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
