"""The MCFuser-case table of docs/benchmarks.md from bench_suite results (issue 15).

Each directory holds `bench_<model>_<precision>.json` files; a later directory's result for a
pair replaces an earlier one's. Prints one markdown row per pair: tessera's GPU time (its fastest
strategy that passed, with the rewrites that plan kept), the peers',
tessera over the best of SDPA and Inductor (attention) or over eager's cuBLAS calls (GEMM
chains, the issue's target), the chain kernel's search statistics and the compile's seconds.
With --models, the end-to-end rows instead (whole models run with `--profile`): tessera against
eager and Inductor, the check, the compile's and the measuring's seconds, and the plan's chain
kernels (attention) with their GPU time per call from the replay's profile.

    python scripts/mcfuser_table.py DIR [DIR ...]
    python scripts/mcfuser_table.py --models DIR [DIR ...]
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def results(dirs: list[str], cases: bool) -> dict[tuple[str, str], dict]:
    """(model, precision) -> its bench JSON, a later directory's replacing an earlier one's: the
    MCFuser cases (`cases`) or the whole models."""
    docs: dict[tuple[str, str], dict] = {}
    for d in dirs:
        for f in sorted(Path(d).glob("bench_*.json")):
            doc = json.loads(f.read_text())
            if bool(re.fullmatch(r"(attn_s|gemm_g)\d+", doc["model"])) == cases:
                docs[(doc["model"], doc["precision"])] = doc
    return docs


def models(dirs: list[str]) -> int:
    docs = results(dirs, cases=False)
    print("| model | prec | tessera ms | eager ms | Inductor ms | vs best peer | check (rel L2) | compile s"
          " | measuring s (candidates + schedules) | chain kernels in the plan | commit |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |")
    for (model, prec), doc in sorted(docs.items()):
        e = {x["name"]: x for x in doc["entries"]}
        t = next(x for n, x in e.items() if n.startswith("tessera"))
        peers = {n: x["ms"] for n, x in e.items() if not n.startswith("tessera") and x["passed"]}
        best = min(peers.values())
        ex = t["extra"]
        names = set(ex.get("chains", {}))
        chained = [k for k in ex.get("run_profile", {}).get("plan", []) if k["name"] in names]
        kinds = sorted({k["name"].split("_", 1)[1] for k in chained})
        chain_cell = (f"{len(chained)} ({', '.join(f'`{k}…`' for k in kinds)}), "
                      f"{sum(k['us'] for k in chained):.1f} µs" if chained else "none")
        tuning = ex["tuning"]
        print(f"| {model} | {prec} | {t['ms']:.3f} | {e['eager']['ms'] if 'eager' in e else float('nan'):.3f} | "
              f"{e['inductor']['ms'] if 'inductor' in e else float('nan'):.3f} | "
              f"{t['ms'] / best:.2f} ({best / t['ms']:.2f}x) | {'PASS' if t['passed'] else 'FAIL'} "
              f"{t['rel_l2']:.1e} | {ex['compile_s']:.0f} | {tuning['seconds']:.0f} + "
              f"{tuning.get('schedule_s', 0):.0f} | {chain_cell} | {doc.get('code', '')} |")
    return 0


def main(dirs: list[str]) -> int:
    if dirs[:1] == ["--models"]:
        return models(dirs[1:])
    pairs = results(dirs, cases=True)  # whole models have their own table (--models)
    print("| case | prec | tessera µs | eager µs | SDPA µs | Inductor µs | target ratio | kernels | chain schedule"
          " | space → pruned | generations | measured | discordant pairs | regret | compile s | commit |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    order = sorted(pairs, key=lambda p: (p[0].rstrip("0123456789"), int(p[0].split("_")[-1][1:]), p[1]))
    for model, prec in order:
        doc = pairs[(model, prec)]
        e = {x["name"]: x for x in doc["entries"]}
        # the fastest tessera strategy that passed (with --rewrites on beside off, whichever won)
        mine = [x for n, x in e.items() if n.startswith("tessera")]
        t = min((x for x in mine if x["passed"]), key=lambda x: x["ms"], default=mine[0])
        us = {n: x["ms"] * 1e3 for n, x in e.items() if x["passed"]}
        attention = "sdpa" in e
        base = min(us[n] for n in ("sdpa", "inductor") if n in us) if attention else us["eager"]
        ex = t["extra"]
        chains = list(ex.get("chains", {}).values())
        c = chains[0] if chains else {}
        sch = c.get("runs") or {}
        err = c.get("rank_error") or {}
        plan = ", ".join(f"{v} {k}" for k, v in sorted(ex["backends"].items()))
        rw = ex.get("rewrites") or {}
        kept = sorted({a["rule"] for a in rw.get("applied", [])}) if rw.get("kept", True) else []
        plan += f" ({', '.join(kept)})" if kept else ""
        split = f" split {sch['split_l']}" if sch.get("split_l", 1) > 1 else ""
        cell = (f"m{sch['block_m']} n{sch['block_n']} l{sch['block_l']} k{sch['block_k']} w{sch['num_warps']} "
                f"s{sch['num_stages']}{split}" if sch else "no chain kernel" if "chains" in ex
                else "(a run before bench recorded it)")
        print(f"| {model} | {prec} | {t['ms'] * 1e3:.2f} | {us.get('eager', float('nan')):.2f} | "
              f"{us['sdpa'] if 'sdpa' in us else float('nan'):.2f} | {us.get('inductor', float('nan')):.2f} | "
              f"{t['ms'] * 1e3 / base:.2f} | {plan} | {cell} | "
              + (f"{c['space']} → {c['after_pruning']} | {c['generations']} | {c.get('measured', '')} | "
                 f"{err.get('discordant_pairs', float('nan')):.2f} | {err.get('regret', float('nan')):.2f} |"
                 if c else "| | | | |")
              # the whole compile (a plan replanned with rewrites reads its tuning back from the database,
              # so the last tuning's own seconds say nothing); older runs recorded the tuning alone
              + f" {ex.get('compile_s', ex['tuning']['seconds']):.0f} | {doc.get('code', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
