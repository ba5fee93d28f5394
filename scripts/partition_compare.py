"""The partition of this tree beside an earlier commit's, by the plans they lead to.

    python scripts/partition_compare.py MODEL.onnx ... --baseline REV [--precision fp16] [--max-states 2000]
        [--templates auto|force] [--out FILE.md]

Each model is compiled twice with the analytical cost: once as the tree stands, once with the
partition and the candidate enumeration around it (`tessera/orchestrate/partition.py` and the
orchestrator's `_all_candidates`) as they were at REV (`git show`), everything else the same. REV
must predate the partition by dynamic programming (4cec435): the greedy partition and the
`_all_candidates(og, subs, cuts, ..., max_states)` that went with it, such as ce921fe. The
table gives each compile's estimate, subgraphs (after any split for too many candidates), the
fusions its cuts forbid and its seconds. `--templates force` prices matmuls as GEMM templates, as
a measured compile on a GPU does, which adds candidates (and so splits).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tessera.orchestrate.orchestrator as orchestrator
from tessera.cli.main import main as tessera_main

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str, path: str, name: str, edit=lambda text: text):  # type: ignore[no-untyped-def]
    """`path` as it was at `rev`, loaded as module `name` (its text passed through `edit` first)."""
    text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(edit(text))
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def baseline_candidates(rev: str):  # type: ignore[no-untyped-def]
    """The orchestrator's `_all_candidates` as it was at `rev`, over that commit's partition, in the
    form the orchestrator calls now (`og, parts, strategy, rules, legality`)."""
    part = module_at(rev, "tessera/orchestrate/partition.py", "partition_at_rev")
    orch = module_at(rev, "tessera/orchestrate/orchestrator.py", "orchestrator_at_rev",
                     lambda t: t.replace("from tessera.orchestrate.partition import", "from partition_at_rev import"))

    def run(og, parts, strategy, rules, legality):  # type: ignore[no-untyped-def]
        subs, cuts = part.partition(og, parts.max_states)
        return orch._all_candidates(og, subs, cuts, strategy, rules, legality, parts.max_states)
    return run


def compile_once(model: Path, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as out:
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            failed = tessera_main(["compile", str(model), "-o", out, "--cost", "analytical", "--precision",
                                   args.precision, "--max-states", str(args.max_states), "--templates", args.templates,
                                   "--io", "precision" if args.precision in ("fp16", "bf16") else "model"])
        seconds = time.perf_counter() - t
        if failed:
            raise SystemExit(f"{model}: tessera compile failed")
        plan = json.loads((Path(out) / "plan.json").read_text())
    return {"estimate_us": plan["estimated_total_s"] * 1e6, "subgraphs": len(plan["subgraphs"]),
            "lost_fusions": sum(len(c["lost_fusions"]) for c in plan["cuts"]), "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--baseline", required=True, help="the commit whose partition.py to set beside")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--max-states", type=int, default=2000)
    ap.add_argument("--templates", default="auto", choices=["auto", "force"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    then, now = baseline_candidates(args.baseline), orchestrator._all_candidates
    rows = [f"| model | estimate µs ({args.baseline}) | estimate µs (now) | now / then | subgraphs | "
            "fusions cut | compile s |", "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for m in args.models:
        orchestrator._all_candidates = then
        a = compile_once(m, args)
        orchestrator._all_candidates = now
        b = compile_once(m, args)
        rows.append(f"| {m.stem} | {a['estimate_us']:.1f} | {b['estimate_us']:.1f} | "
                    f"{b['estimate_us'] / a['estimate_us']:.3f} | {a['subgraphs']} -> {b['subgraphs']} | "
                    f"{a['lost_fusions']} -> {b['lost_fusions']} | {a['seconds']:.1f} -> {b['seconds']:.1f} |")
        print(rows[-1], flush=True)
    text = (f"{args.precision}, --max-states {args.max_states}, --templates {args.templates}, analytical cost\n\n"
            + "\n".join(rows) + "\n")
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
