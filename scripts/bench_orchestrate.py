"""Orchestration on every model of a folder: states, candidates, kernels, solve
time, and the optimal plan's estimated total against the greedy baseline.

    python scripts/bench_orchestrate.py ../shared/models --out scripts/results

Writes orchestrate_<gpu>.json and prints a Markdown table (docs/orchestration.md).
Solve seconds are wall time on the machine that runs it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import highspy

from tessera.compiler import CompileOptions, compile_model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", type=Path)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--max-states", type=int, default=2000)
    args = ap.parse_args()
    env = {"date": datetime.date.today().isoformat(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "highspy": highspy.__version__ if hasattr(highspy, "__version__")
           else "", "gpu_preset": args.gpu, "max_states": args.max_states}
    rows = []
    for path in sorted(args.models.glob("*.onnx")):
        r = compile_model(path, CompileOptions(gpu=args.gpu, max_states=args.max_states))
        p = r.plan
        subs = p.subgraphs
        rows.append({
            "model": path.stem, "primitives": p.primitives, "nodes": p.orchestrated_nodes,
            "subgraphs": len(subs), "cuts": len(p.cuts), "states_max": max(s.states for s in subs),
            "states_total": sum(s.states for s in subs), "candidates": sum(s.candidates for s in subs),
            "kernels": len(p.kernels), "solve_max_s": max(s.solver["seconds"] for s in subs),
            "solve_total_s": sum(s.solver["seconds"] for s in subs),
            "all_optimal": all(s.solver["optimal"] for s in subs),
            "cycle_cuts": sum(s.solver["cycle_cuts"] for s in subs),
            "recomputed_prims": sum(len(k.recomputed) for k in p.kernels),
            "optimal_us": p.estimated_total_s * 1e6, "greedy_us": p.greedy_total_s * 1e6,
            "compile_s": sum(r.timings.values()),
            "per_subgraph": [{"states": s.states, "candidates": s.candidates, "kernels": s.kernels,
                              "seconds": s.solver["seconds"], "status": s.solver["status"]} for s in subs],
        })
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "per_subgraph"}), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"orchestrate_{args.gpu}.json").write_text(json.dumps({"env": env, "results": rows}, indent=1))
    print(f"Machine: {env['machine']}, {env['cpus']} CPUs, {env['date']}; cost model: analytical, {args.gpu} preset, "
          f"fp32; at most {args.max_states} states per subgraph.\n")
    print("| model | prims | nodes | subgraphs | states (max) | candidates | kernels | solve max / total (s) "
          "| proven optimal | optimal (µs) | greedy (µs) | greedy / optimal |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['primitives']} | {r['nodes']} | {r['subgraphs']} | {r['states_max']} "
              f"| {r['candidates']} | {r['kernels']} | {r['solve_max_s']:.2f} / {r['solve_total_s']:.2f} "
              f"| {'yes' if r['all_optimal'] else 'no'} | {r['optimal_us']:.1f} | {r['greedy_us']:.1f} "
              f"| {r['greedy_us'] / r['optimal_us']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
