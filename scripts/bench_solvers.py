"""HiGHS vs CBC (PuLP, Korch's choice) vs CP-SAT on the same binary programs.

    python scripts/bench_solvers.py ../shared/models/segformer_b0.onnx ../shared/models/efficientvit_b0.onnx ...

Every subgraph instance that compiling each model solves is kept once and pickled
(`solver_options.collect`); each solver
then runs in its own process (highspy and OR-Tools bundle conflicting copies
of HiGHS), with the greedy plan as warm start and a time limit. Needs the
`solvers` extra. Prints a Markdown table and writes scripts/results/solvers.json.
"""
from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

SOLVERS = ("highs", "cbc", "cpsat")

_WORKER = r"""
import json, pickle, sys
solver, path, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
from tessera.orchestrate.blp import backend, solve
backend(solver)  # import the backend's library first
out = []
for model, k, p, warm in pickle.load(open(path, "rb")):
    _, _, st = solve(p, solver=solver, warm=warm, time_limit=limit)
    out.append({"model": model, "subgraph": k, "candidates": len(p.candidates), "seconds": st.seconds,
                "status": st.status, "objective_us": st.objective * 1e6, "cycle_cuts": st.cycle_cuts})
print(json.dumps(out))
"""


def build_instances(paths: list[Path], max_states: int) -> list:
    """(model, subgraph, instance, warm start) for every binary program that compiling `paths`
    (fp32, analytical cost) solves, as `solver_options.collect` keeps them."""
    from solver_options import collect  # (this folder is on the path when run as a script)

    out, seen = [], {}
    for model, p, warm in collect(paths, ["fp32"], ("--max-states", str(max_states))):
        seen[model] = seen.get(model, -1) + 1
        out.append((model.split()[0], seen[model], p, warm))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--max-states", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    instances = build_instances(args.models, args.max_states)
    results: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "instances.pkl"
        path.write_bytes(pickle.dumps(instances))
        for solver in SOLVERS:
            r = subprocess.run([sys.executable, "-c", _WORKER, solver, str(path), str(args.time_limit)],
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{solver} failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            results[solver] = json.loads(r.stdout)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "solvers.json").write_text(json.dumps(results, indent=1))
    print("| model | subgraph | candidates | " + " | ".join(f"{s} (s)" for s in results) + " | objective (µs) |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in results) + " | ---: |")
    first = next(iter(results.values()))
    for i, row in enumerate(first):
        cells = []
        for s in results:
            r = results[s][i]
            mark = "" if r["status"] == "optimal" else f" ({r['status']})"
            cells.append(f"{r['seconds']:.2f}{mark}")
        print(f"| {row['model']} | {row['subgraph']} | {row['candidates']} | " + " | ".join(cells)
              + f" | {row['objective_us']:.2f} |")
    for s in results:
        tot = sum(r["seconds"] for r in results[s])
        print(f"\n{s}: {tot:.2f} s in all, {sum(r['status'] == 'optimal' for r in results[s])}/{len(results[s])} proven optimal",
              end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
