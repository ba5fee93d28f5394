"""Schedule timings measured on the H100, joined with each kernel's shape features (for a schedule-ranking model).

    python scripts/schedule_data.py [--out scripts/results/schedule_data.jsonl.gz] [--models candy,gpt2] [--no-shared]

The measured rows are scripts/results/bench/tuning_h100_part{1,2,3,4}.jsonl.gz: a
row whose schedule is not "default" times one kernel under one schedule
(`tune_schedules`, after the plan was chosen); a "default" row times the
kernel's default schedule (the first of `schedules(xnumel, rnumel)`). Rows name
kernels by signature only, so this script rebuilds the models, enumerates their
candidates the way `compile_model` and `orchestrate` do (fission, precision,
ograph, partition with splits on TooManyCandidates, exhaustive candidates plus
the greedy ones, TritonLegality, at most 12 nodes), computes each candidate's
signature as `MeasuredCost.job()` does but with no math tag (the rows predate
it), and keeps the candidates whose signature has schedule rows. Each such
kernel is generated once (`implement`) for its features.

Models: the zoo's candy, segformer_b0, bert_base and gpt2 (`tessera.zoo.build`,
seed 0, cached in /tmp/zoo-sched), and, unless --no-shared, the committed ONNX
files of ../shared/models for mobilenet_v2 and efficientvit_b0 (the zoo builds
those with torchvision and timm, not installed here; same networks and input
shapes, so the same signatures) and candy_small (an earlier run at the start of
part1 tuned it). ResNet-50 and Inception-V3 have no such file: their rows stay
unmatched.

Each part file is a concatenation of database exports, one per benchmark run
(model, precision), each sorted by (signature, schedule); a run is a stretch of
rows in increasing order. A run is named after the (model, precision) that
holds most of its signatures, and a row's `model` and `precision` are those of
the first run that measured its signature (`runs` lists them all, `found_in`
every model and precision whose candidates have the signature).

A kernel's prologue is listed topologically (`prologue_of`) by the plan and by
`MeasuredCost` alike, so one signature per candidate serves (`sig_order`:
"topological"; earlier plans listed it per primitive, and every measured row
matched the topological order).

One output line per (signature, schedule). Several runs measured some keys
(bert_base and gpt2 share kernels; candy and segformer_b0 tf32 were run twice):
`seconds` is the fastest finite repeat (None if every repeat failed),
`seconds_all` lists them all in file order; `default_seconds` likewise from the
"default" rows.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tessera.codegen.kernels import schedules  # noqa: E402
from tessera.codegen.select import TritonLegality, implement, prologue_of  # noqa: E402
from tessera.codegen.triton_ops import Unsupported  # noqa: E402
from tessera.cost.measured import _schedule_key, kernel_signature  # noqa: E402
from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.orchestrate import build_ograph  # noqa: E402
from tessera.orchestrate.candidates import CandidateRules  # noqa: E402
from tessera.orchestrate.graphview import bits  # noqa: E402
from tessera.orchestrate.orchestrator import _all_candidates  # noqa: E402
from tessera.orchestrate.partition import Partitioner  # noqa: E402
from tessera.rewrite import convert_precision  # noqa: E402

BENCH = ROOT / "scripts" / "results" / "bench"
PARTS = [BENCH / f"tuning_h100_part{i}.jsonl.gz" for i in (1, 2, 3, 4)]
MODELS = ("candy", "segformer_b0", "bert_base", "gpt2")
PRECISIONS = ("tf32", "fp16")
CACHE = Path("/tmp/zoo-sched")
SHARED = ROOT.parent / "shared" / "models"
SHARED_MODELS = {"mobilenet_v2": PRECISIONS, "efficientvit_b0": PRECISIONS, "candy_small": ("tf32",)}
MAX_STATES = 2000  # CompileOptions.max_states
RULES = CandidateRules(max_nodes=12)  # CompileOptions.max_kernel_nodes
_KEY = re.compile(r"^x(\d+)-r(\d+)-w(\d+)-([pl])$")


class Rows:
    """The measured rows: schedule and default timings by signature, and the runs that measured them."""

    def __init__(self, paths: list[Path]) -> None:
        self.sched: dict[str, dict[str, list]] = collections.defaultdict(dict)  # sig -> schedule -> [seconds]
        self.default: dict[str, list] = collections.defaultdict(list)
        self.runs: list[dict] = []  # {"id", "first", "last", "sigs": schedule signatures}
        self.sig_runs: dict[str, list[int]] = collections.defaultdict(list)
        self.n = 0
        for path in paths:
            prev = None
            with gzip.open(path, "rt") as f:
                for line in f:
                    if not line.strip():
                        continue
                    r = json.loads(line)
                    self.n += 1
                    sig, key = r["signature"], r["schedule"]
                    if prev is None or (sig, key) < prev:
                        self.runs.append({"id": f"{path.stem.rsplit('_', 1)[-1]}#{len(self.runs)}", "sigs": set(),
                                          "first": r["measured_at"], "last": r["measured_at"]})
                    prev = (sig, key)
                    run = self.runs[-1]
                    run["first"], run["last"] = min(run["first"], r["measured_at"]), max(run["last"], r["measured_at"])
                    if key == "default":
                        self.default[sig].append(r["seconds"])
                    else:
                        self.sched[sig].setdefault(key, []).append(r["seconds"])
                        if sig not in run["sigs"]:
                            run["sigs"].add(sig)
                            self.sig_runs[sig].append(len(self.runs) - 1)


def fastest(values: list) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return min(finite) if finite else None


def zoo_path(name: str) -> Path:
    """The zoo model, built once (seed 0, as `tessera bench zoo:NAME` does) and cached."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{name}.onnx"
    if not path.exists():
        from tessera.zoo import build

        t = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(dir=CACHE))
        build(name, tmp).rename(path)
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"  built {name}.onnx in {time.perf_counter() - t:.1f}s", flush=True)
    return path


def candidates(og):
    """Every candidate `orchestrate` considers (exhaustive plus greedy per subgraph), each once."""
    legality = TritonLegality()  # one per model, as orchestrate() shares it across subgraphs
    seen: set[tuple[int, int]] = set()
    _, _, found, _ = _all_candidates(og, Partitioner(og, MAX_STATES), "optimal", RULES, legality)
    for cands, _ in found:  # (each subgraph's exhaustive candidates, the greedy plan's among them)
        for c in cands:
            if (c.nodes, c.outputs) not in seen:
                seen.add((c.nodes, c.outputs))
                yield c


def kernels_of(path: Path, precision: str, wanted: set[str]) -> tuple[dict[str, tuple], dict]:
    """signature -> (graph, prims, prologue, outputs, order) for the candidates whose signature is wanted."""
    graph = convert_precision(fission(load(path).graph).graph, precision)
    og = build_ograph(graph)
    found: dict[str, tuple] = {}
    n = 0
    for c in candidates(og):
        n += 1
        prims = [og.nodes[i] for i in bits(c.nodes)]
        outs = [o for v in bits(c.outputs) for o in og.nodes[v].outputs if o]
        # The plan lists a kernel's prologue as prologue_of does (topological), so one order serves.
        pro = prologue_of(og, prims)
        sig = kernel_signature(graph, prims, pro, outs)  # math="": the rows predate the math tag
        if sig in wanted and sig not in found:
            found[sig] = (graph, prims, pro, outs, "topological")
    return found, {"candidates": n, "primitives": len(graph.nodes)}


def features(graph, prims, prologue, outputs) -> tuple[dict | None, list[str]]:
    """The kernel's features and its schedule space (keys), or None if it has no Triton kernel."""
    try:
        impl = implement(graph, prims, prologue, outputs, "k")
    except Unsupported:
        return None, []
    t = impl.triton
    if t is None:
        return None, []
    read = sum(graph.types[x].nbytes for x in t.inputs)
    written = sum(graph.types[x].nbytes for x in t.outputs)
    space = [_schedule_key(s) for s in schedules(t.xnumel, t.rnumel)]
    return {"backend": impl.backend, "xnumel": t.xnumel, "rnumel": t.rnumel,
            "form": "reduction" if t.rnumel > 1 else "pointwise",
            "bytes": read + written, "bytes_read": read, "bytes_written": written,
            "n_inputs": len(t.inputs), "n_outputs": len(t.outputs), "n_prims": len(prims),
            "n_prologue": len(prologue), "n_triton_nodes": len(t.prims), "ops": [n.op for n in prims],
            "default_schedule": space[0]}, space


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "scripts" / "results" / "schedule_data.jsonl.gz")
    ap.add_argument("--models", default=",".join(MODELS), help="zoo models")
    ap.add_argument("--no-shared", action="store_true", help="skip the ../shared/models files")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = Rows(PARTS)
    wanted = set(rows.sched)
    print(f"{rows.n} rows: {sum(len(v) for s in rows.sched.values() for v in s.values())} schedule rows, "
          f"{sum(len(s) for s in rows.sched.values())} (signature, schedule) keys, {len(wanted)} signatures, "
          f"{len(rows.runs)} runs", flush=True)

    sources = [(m, p, zoo_path(m), "zoo") for m in a.models.split(",") for p in PRECISIONS]
    if not a.no_shared:
        sources += [(m, p, SHARED / f"{m}.onnx", "shared") for m, ps in SHARED_MODELS.items() for p in ps
                    if (SHARED / f"{m}.onnx").exists()]
    found_in: dict[str, list[str]] = collections.defaultdict(list)
    spec: dict[str, tuple] = {}  # signature -> kernel, from the first source that has it
    per_source: dict[str, dict] = {}
    for name, precision, path, origin in sources:
        t = time.perf_counter()
        found, info = kernels_of(path, precision, wanted)
        tag = f"{name}/{precision}"
        for sig, s in found.items():
            found_in[sig].append(tag)
            spec.setdefault(sig, s + (origin,))
        info.update(origin=origin, matched=len(found), seconds=round(time.perf_counter() - t, 1),
                    orders=dict(collections.Counter(s[4] for s in found.values())))
        per_source[tag] = info
        print(f"  {tag}: {info}", flush=True)

    # Name each run after the source holding most of its signatures (more than half of them).
    benches = sorted((json.loads(p.read_text())["date"], f"{p.stem[6:].rsplit('_', 1)[0]}/{p.stem.rsplit('_', 1)[1]}")
                     for p in BENCH.glob("bench_*.json"))
    for run in rows.runs:
        votes = collections.Counter(tag for s in run["sigs"] for tag in found_in.get(s, []))
        best = votes.most_common(1)[0] if votes else None
        run["label"] = best[0] if best and 2 * best[1] > len(run["sigs"]) else None
        run["matched"] = sum(1 for s in run["sigs"] if s in found_in)
        # Unnamed: the benchmark document written next is most likely the run's model.
        run["next_bench"] = next((b for d, b in benches if d >= run["last"]), "?")

    out_rows = []
    skipped: dict[str, str] = {}
    outside: list[tuple[str, str]] = []  # measured schedule not in the space of the generated kernel
    for sig in sorted(spec, key=lambda s: (rows.sig_runs[s][0], s)):
        graph, prims, pro, outs, order, origin = spec[sig]
        f, space = features(graph, prims, pro, outs)
        if f is None:
            skipped[sig] = "no triton kernel"
            continue
        runs = [rows.runs[i] for i in rows.sig_runs[sig]]
        owner = next((r["label"] for r in runs if r["label"] in found_in[sig]), found_in[sig][0])
        model, precision = owner.split("/")
        dflt = rows.default.get(sig, [])
        for key, values in sorted(rows.sched[sig].items()):
            m = _KEY.match(key)
            if m is None:
                raise ValueError(f"unexpected schedule key {key!r}")
            if key not in space:
                outside.append((sig, key))
            out_rows.append({"model": model, "precision": precision, "signature": sig, "schedule": key,
                             "xblock": int(m[1]), "rblock": int(m[2]), "num_warps": int(m[3]),
                             "persistent": m[4] == "p", "seconds": fastest(values), "seconds_all": values,
                             **f, "default_seconds": fastest(dflt), "default_seconds_all": dflt,
                             "origin": origin, "sig_order": order, "found_in": found_in[sig],
                             "runs": [r["id"] for r in runs]})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open(a.out, "wt") if a.out.suffix == ".gz" else open(a.out, "w")) as fh:
        for r in out_rows:
            fh.write(json.dumps(r) + "\n")

    matched = set(spec) - set(skipped)
    print(f"\nwrote {len(out_rows)} rows ({sum(r['seconds'] is None for r in out_rows)} failed) to {a.out}")
    print(f"signatures with schedule rows: {len(wanted)}; matched {len(spec)}, with a Triton kernel {len(matched)}"
          f"; skipped {len(skipped)} {dict(collections.Counter(skipped.values()))}")
    print("per model (rows and signatures attributed to it; found = signatures among its candidates):")
    for tag, info in per_source.items():
        mine = [r for r in out_rows if f"{r['model']}/{r['precision']}" == tag]
        print(f"  {tag:22s} {len({r['signature'] for r in mine}):4d} signatures {len(mine):5d} rows "
              f"(found {info['matched']}; {info['candidates']} candidates, {info['seconds']}s, {info['origin']})")
    print("runs (a database export each; signatures with schedule rows, how many matched):")
    for run in rows.runs:
        name = run["label"] or f"? (next bench: {run['next_bench']})"
        print(f"  {run['id']:9s} {run['first'][11:19]}-{run['last'][11:19]}  {name:36s} "
              f"{run['matched']:4d} of {len(run['sigs']):4d} matched")
    print(f"signatures matched only through the plan's prologue order: {sum(spec[s][4] == 'plan' for s in spec)}")
    print(f"matched signatures with no default row: {sum(1 for s in matched if not rows.default.get(s))}")
    print(f"rows whose schedule is outside the generated kernel's space: {len(outside)}")
    dup = [r for r in out_rows if len(r["seconds_all"]) > 1]
    spread = sorted(max(r["seconds_all"]) / min(r["seconds_all"]) for r in dup
                    if all(v is not None for v in r["seconds_all"]))
    if spread:
        print(f"rows measured more than once: {len(dup)}; max/min of the repeats: median {spread[len(spread) // 2]:.2f},"
              f" p90 {spread[int(0.9 * len(spread))]:.2f}, max {spread[-1]:.2f}")
    at_default = [r["seconds"] / r["default_seconds"] for r in out_rows
                  if r["schedule"] == r["default_schedule"] and r["seconds"] and r["default_seconds"]]
    print(f"rows at the default schedule: {len(at_default)}, more than 25% off the default row: "
          f"{sum(abs(x - 1) > 0.25 for x in at_default)}")
    print(f"total {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
