"""The benchmark suite (issue 5): every zoo model x precision through `tessera bench`, resumable.

    PYTHONPATH=. python scripts/bench_suite.py --models candy,resnet50 --precisions tf32,fp16 \
        --db carry/tuning.db --out $OUT [--vs eager,inductor,inductor-cudagraphs]
    python scripts/bench_suite.py --table scripts/results/bench/*.json   # the docs/benchmarks.md table
    python scripts/bench_suite.py --table --kinds scripts/results/bench/*.json  # and GPU us by kernel kind

--profile adds each contender's run profile (`tessera/runtime/profile.py`: GPU µs per call by
kernel kind, plan kernel and kernel) to its entry's extra["run_profile"]; --kinds tabulates them.

Each (model, precision) writes `bench_MODEL_PRECISION.json` under --out after
every contender (with `"partial": true` until the pair ends, so a pair cut off
by a time limit keeps what ran), and a rerun skips the finished ones in
--skip-dir, so the suite can be split across device calls.
The tuning database (--db) carries measurements from one call to the next;
with --fresh-db each pair tunes into an empty database instead (so its tuning
time is a cold start) and the rows are appended to OUT/tuning.jsonl, the
pre-tuned data to commit. --budget-s stops starting new pairs so that a call
ends inside the device's 10-minute limit.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KORCH = ["candy", "segformer_b0", "efficientvit_b0"]
HIDET = ["resnet50", "inception_v3", "mobilenet_v2", "bert_base", "gpt2"]


def tessera_entry(doc: dict) -> dict | None:
    """A bench document's main tessera entry: optimal, or optimal-precisionio where only that ran."""
    by = {e["name"]: e for e in doc["entries"]}
    return by.get("tessera-optimal") or by.get("tessera-optimal-precisionio")


def table(files: list[Path]) -> str:
    """Markdown: model x precision, tessera optimal/greedy and the peers, ratio to the best peer."""
    docs = [json.loads(f.read_text()) for f in files]
    names = ["tessera-optimal", "tessera-optimal-noprologues", "tessera-optimal-notemplates", "tessera-optimal-precisionio",
             "tessera-greedy", "eager", "inductor", "inductor-cudagraphs", "inductor-max-autotune", "sdpa"]
    seen = list(dict.fromkeys(e["name"] for d in docs for e in d["entries"]))
    present = [n for n in names if n in seen] + [n for n in seen if n not in names]  # others (-rewrites) last
    # "tuning s": the candidate and schedule measurements alone; "compile s": the whole compile
    # (layout pricing, orchestration and code generation too), cold where the row used --fresh-db
    out = ["| model | precision | " + " | ".join(f"{n} ms" for n in present)
           + " | tessera / best peer | tuning s | compile s | device |",
           "| --- | --- |" + " ---: |" * len(present) + " ---: | ---: | ---: | --- |"]
    for d in sorted(docs, key=lambda d: (d["model"], d["precision"])):
        by = {e["name"]: e for e in d["entries"]}
        cells = []
        for n in present:
            e = by.get(n)
            cells.append("-" if e is None else f"{e['ms']:.3f}" + ("" if e["passed"] else " (FAIL)"))
        opt = tessera_entry(d)  # the ratio of tessera's main strategy
        ratio = f"{opt['vs_best_peer']:.2f}" if opt and opt.get("vs_best_peer") else "-"
        tun = opt["extra"].get("tuning", {}) if opt else {}
        tuning = tun["seconds"] + tun.get("schedule_s", 0.0) if "seconds" in tun else None
        compile_s = opt["extra"].get("compile_s") if opt else None
        out.append(f"| {d['model']} | {d['precision']} | " + " | ".join(cells)
                   + f" | {ratio} | {'-' if tuning is None else f'{tuning:.0f}'}"
                   + f" | {'-' if compile_s is None else f'{compile_s:.0f}'} | {d['device']}, {d['date'][:10]}"
                   + (f", {d['code']}" if d.get("code") else "")
                   + (", cut off after the last contender shown" if d.get("partial") else "") + " |")
    return "\n".join(out)


def targets(files: list[Path]) -> str:
    """Issue 14's suite targets over the rows in `files`: rows ahead of the best peer, the geomean
    of tessera / best peer, and max-autotune beaten where it finished."""
    docs = [json.loads(f.read_text()) for f in files]
    ratios, failed, autotune, vs_gpu = [], [], [], []
    for d in docs:
        opt, by = tessera_entry(d), {e["name"]: e for e in d["entries"]}
        row = f"{d['model']} {d['precision']}"
        if opt is None or not opt.get("vs_best_peer"):
            continue
        ratios.append(opt["vs_best_peer"])
        # A bound that no host-side effect on a peer's timing can move (before session 36 the peers
        # were timed after a profiler session): tessera's time against the least GPU kernel time of
        # any peer's run profile, its host work and gaps left out.
        gpu = [e["extra"]["run_profile"]["total_us"] for e in d["entries"] if not e["name"].startswith("tessera")
               and (e.get("extra") or {}).get("run_profile", {}).get("device") == "cuda"]
        if gpu:
            vs_gpu.append(opt["ms"] * 1e3 / min(gpu))
        if not opt["passed"]:
            failed.append(row)
        if "inductor-max-autotune" in by:
            autotune.append(opt["ms"] < by["inductor-max-autotune"]["ms"])
    if not ratios:
        return "no row has a tessera entry timed against a peer"
    geo = _geomean(ratios)
    return "\n".join([
        f"- rows: {len(ratios)}; tessera ahead of the best peer in {sum(r < 1 for r in ratios)} of them",
        f"- geomean tessera / best peer: {geo:.3f} ({1 / geo:.2f}x faster)",
        *([f"- against the best peer's GPU kernel time alone (run profiles, {len(vs_gpu)} rows): tessera ahead in "
           f"{sum(r < 1 for r in vs_gpu)}, geomean {_geomean(vs_gpu):.3f} ({1 / _geomean(vs_gpu):.2f}x faster)"]
          if vs_gpu else []),
        f"- max-autotune finished in {len(autotune)} rows; tessera faster in {sum(autotune)}",
        f"- tessera failed its check in: {', '.join(failed) or 'none'}"])


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _kind_values(p: dict) -> list[float]:
    return [*p["by_kind"].values(), p["total_us"], p["wall_us"], p["misaligned_gemm_us"]]


def kinds_table(files: list[Path]) -> str:
    """Markdown: per model x precision, GPU µs per call by kernel kind, tessera-optimal / inductor-cudagraphs."""
    docs = sorted((json.loads(f.read_text()) for f in files), key=lambda d: (d["model"], d["precision"]))
    rows = []
    for d in docs:
        profs = {e["name"]: e["extra"].get("run_profile") for e in d["entries"]}
        main = tessera_entry(d)
        ours = main["extra"].get("run_profile") if main else None
        peer = profs.get("inductor-cudagraphs")
        if ours is None:
            continue
        a, b = _kind_values(ours), _kind_values(peer) if peer else None
        cells = [f"{x:.1f}" + (f" / {y:.1f}" if b else "") for x, y in zip(a, b or a)]
        rows.append(f"| {d['model']} | {d['precision']} | " + " | ".join(cells) + " |")
        cols = [*ours["by_kind"], "kernel total", "wall", "misaligned GEMM"]  # the kinds in profile.KINDS order
    if not rows:
        return "no run profiles (bench with --profile)"
    return "\n".join(["us per call by kernel kind (GPU time; a CPU run's is host time), "
                      "tessera-optimal / inductor-cudagraphs:", "",
                      "| model | precision | " + " | ".join(cols) + " |",
                      "| --- | --- |" + " ---: |" * len(cols), *rows])


def main() -> int:
    if sys.argv[1:2] == ["--table"]:
        files = [Path(a) for a in sys.argv[2:] if a != "--kinds"]
        print(table(files))
        print("\n" + targets(files))
        if "--kinds" in sys.argv[2:]:
            print("\n" + kinds_table(files))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(KORCH + HIDET))
    ap.add_argument("--precisions", default="tf32,fp16")
    ap.add_argument("--batch", type=int, default=1, help="items per call (tessera.zoo.BATCHED models)")
    ap.add_argument("--vs", default="eager,inductor,inductor-cudagraphs")
    ap.add_argument("--strategies", default="optimal,greedy")
    ap.add_argument("--cost", default="measured")
    ap.add_argument("--db", help="tuning database carried between calls")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--skip-dir", type=Path, help="skip (model, precision) pairs with a result file here")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--fresh-db", action="store_true", help="tune each pair from an empty database")
    ap.add_argument("--keep-db", type=Path,
                    help="with --fresh-db: keep each pair's database as KEEP_DB/MODEL_PREC.db (for a warm run after)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new pair after this many seconds")
    ap.add_argument("--code", default="", help="the tessera commit measured (the device's copy has no git history)")
    ap.add_argument("--profile", action="store_true", help="also profile each contender's kernels by kind")
    ap.add_argument("--timing", default="wall", choices=["wall", "gpu"], help="gpu: the kernels' GPU time per call")
    ap.add_argument("--guards", default="all", choices=["all", "skip-modules"],
                    help="dynamo's guards for every torch.compile contender (tessera.bench.GUARDS)")
    a = ap.parse_args()
    start = time.perf_counter()

    from tessera.bench import bench, format_table
    from tessera.log import configure
    from tessera.zoo import batched_name

    configure()  # TESSERA_LOG=info: each contender's compile and time as it finishes

    done = {p.name for p in a.skip_dir.glob("bench_*.json") if not json.loads(p.read_text()).get("partial")} \
        if a.skip_dir else set()
    for model in a.models.split(","):
        for prec in a.precisions.split(","):
            name = f"bench_{batched_name(model, a.batch)}_{prec}.json"
            if name in done:
                print(f"skip {model} {prec}: already measured", flush=True)
                continue
            if time.perf_counter() - start > a.budget_s:
                print(f"stop before {model} {prec}: the {a.budget_s:.0f} s budget is spent", flush=True)
                return 0
            t = time.perf_counter()
            db = a.db
            if a.fresh_db:
                keep = a.keep_db or Path(tempfile.mkdtemp())
                keep.mkdir(parents=True, exist_ok=True)
                db = str(keep / f"{batched_name(model, a.batch)}_{prec}.db")
                Path(db).unlink(missing_ok=True)

            def save(doc: dict, name: str = name, t: float = t) -> None:
                # Written after every contender (`"partial": true` until the row ends), so a row cut
                # off by the call's time limit, or by a peer that crashes the process, keeps what ran.
                doc.update(wall_s=round(time.perf_counter() - t, 1), fresh_db=a.fresh_db, code=a.code)
                (a.out / name).write_text(json.dumps(doc, indent=1))

            try:
                doc = bench(f"zoo:{model}", prec, a.vs.split(","), a.strategies.split(","), a.cost, db,
                            "cuda", 0, a.solver, a.profile, a.timing, a.guards, on_entry=save, batch=a.batch)
            except Exception as e:  # noqa: BLE001 - record and go on to the next model
                print(f"{model} {prec}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            if a.fresh_db:
                from tessera.cost.db import TuningDB

                with TuningDB(db) as d:
                    d.export(a.out / "tuning.jsonl", append=True)
            save(doc)
            print(format_table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
