"""Measure GEMM-chain schedules of the MCFuser cases and fit the chain model to them (issue 15).

On a GPU (`measure`): each case (zoo models attn_s1-s9, gemm_g1-g12) is compiled with templates
forced, so its plan is one chain kernel; its pruned space is searched (`chain_search`), and the
model's PER_CHAIN best plus schedules drawn at random from the rest of the pruned space are
measured through the tuning profiler into a tuning database, which keeps the chain's model
features beside them (`TuningDB.put_features`). The run writes the samples as JSON.

Anywhere (`fit`): the samples split into chains that fit the model and chains held out; prints the
held-out rank error (share of schedule pairs ordered wrongly, and the regret: measured time of the
model's first choice over the best measured) for the default constants and the fitted ones, then
the constants fitted to every chain.

    python scripts/chain_calibration.py measure --out DIR [--cases attn_s7,gemm_g1] [--precisions fp16,tf32]
    python scripts/chain_calibration.py fit DIR/chain_samples.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tessera.codegen.kernels import ChainSchedule
from tessera.cost.chain_search import (CHAIN_PARAMS, ChainFeatures, ChainParams, chain_features, chain_key,
                                       chain_search, chain_space, family, fit_chain_params, parse_chain_key,
                                       predict_chain, rank_error)
from tessera.cost.devices import Device, device
from tessera.cost.measured import CHAIN_FIRST

PER_CHAIN = 20  # schedules measured per chain
MODEL_TOP = 8  # of which the model's best


def measure(a: argparse.Namespace) -> int:
    import torch

    from tessera.compiler import CompileOptions, compile_model
    from tessera.cost.db import Key, TuningDB, software_versions
    from tessera.cost.measured import Job, kernel_signature, math_mode, tune
    from tessera.cost.profiler import GpuProfiler
    from tessera.zoo import ATTENTION_CASES, GEMM_CHAIN_CASES, build

    cases = a.cases.split(",") if a.cases else [f"attn_s{i}" for i in ATTENTION_CASES] + \
        [f"gemm_g{i}" for i in GEMM_CHAIN_CASES]
    dev = device(a.device)
    name, versions = torch.cuda.get_device_name(), software_versions()
    rng = random.Random(0)
    a.out.mkdir(parents=True, exist_ok=True)
    db = TuningDB(a.out / "tuning.db")
    jobs: list[Job] = []
    chains: list[dict] = []
    for case in cases:
        path = build(case, Path(tempfile.mkdtemp()))
        for precision in a.precisions.split(","):
            r = compile_model(path, CompileOptions(cost="analytical", templates="force", precision=precision,
                                                   io="precision"))
            (k,) = [k for k in r.kernels if k.triton is not None and isinstance(k.triton.schedule, ChainSchedule)]
            found = chain_search(r.graph, k.nodes, k.outputs, precision, dev)
            feats = chain_features(r.graph, k.nodes, k.outputs, precision)
            space = chain_space(r.graph, k.nodes, dev)
            top = found.ranked[:MODEL_TOP]
            rest = [s for s in space if s not in top]
            picked = top + rng.sample(rest, min(len(rest), PER_CHAIN - len(top)))
            sig = kernel_signature(r.graph, k.prims, k.prologue, k.outputs, math_mode(k.prims, precision))
            chains.append({"case": case, "precision": precision, "signature": sig, "features": feats.to_json(),
                           "space": found.space, "after_pruning": found.pruned, "generations": found.generations,
                           "schedules": [chain_key(s) for s in picked]})
            jobs += [Job(Key(name, versions, sig, chain_key(s)), r.graph, tuple(k.prims), tuple(k.prologue),
                         tuple(k.outputs), s, precision) for s in picked]
    print(f"{len(jobs)} jobs over {len(chains)} chains", flush=True)
    t0 = time.perf_counter()
    profiler = GpuProfiler(a.workers)
    try:
        got = tune(jobs, profiler, db)
    finally:
        profiler.close()
    print(f"measured in {time.perf_counter() - t0:.0f} s", flush=True)
    by_key = {j.key: got[j.key] for j in jobs}
    for c in chains:
        c["seconds"] = [by_key[Key(name, versions, c["signature"], s)] for s in c["schedules"]]
    (a.out / "chain_samples.json").write_text(json.dumps({"device": name, "preset": a.device, "versions": versions,
                                                          "chains": chains}, indent=1))
    return 0


def _samples(chains: list[dict]) -> list[tuple[ChainFeatures, ChainSchedule, float]]:
    out = []
    for c in chains:
        f = ChainFeatures(**c["features"])
        out += [(f, parse_chain_key(k), t) for k, t in zip(c["schedules"], c["seconds"])
                if t is not None and t < 1.0]
    return out


def _errors(chains: list[dict], dev: Device, p: ChainParams) -> tuple[float, float, float]:
    """Mean discordant-pair share, mean regret of the model's first choice, and mean regret of the best
    of the first CHAIN_FIRST the tuner measures (the best of each family first), over chains."""
    d, r, tuned = [], [], []
    for c in chains:
        s = _samples([c])
        if len(s) < 2:
            continue
        pred = [predict_chain(x, f, dev, p) for f, x, _ in s]
        e = rank_error(pred, [t for _, _, t in s])
        d.append(e["discordant_pairs"])
        r.append(e["regret"])
        ranked = [x for _, x in sorted(zip(pred, s), key=lambda z: z[0])]
        heads: dict[tuple[int, bool], tuple] = {}
        for x in ranked:  # the tuner's order (`chain_search._families_first`)
            heads.setdefault(family(x[1], x[0].n), x)
        order = list(heads.values()) + [x for x in ranked if x not in heads.values()]
        tuned.append(min(t for _, _, t in order[:CHAIN_FIRST]) / min(t for _, _, t in s))
    return sum(d) / len(d), sum(r) / len(r), sum(tuned) / len(tuned)


def fit(a: argparse.Namespace) -> int:
    doc = json.loads(a.samples.read_text())
    dev = device(doc["preset"])
    chains = doc["chains"]
    train = [c for i, c in enumerate(chains) if i % 2 == 0]
    held = [c for i, c in enumerate(chains) if i % 2 == 1]
    fitted = fit_chain_params(_samples(train), dev)
    print(f"{'constants':<28}{'discordant pairs':>18}{'regret of #1':>14}{f'regret of tuned {CHAIN_FIRST}':>18}"
          "   (held-out half)")
    for label, p in (("defaults", CHAIN_PARAMS), ("fitted on the other half", fitted)):
        d, r, t = _errors(held, dev, p)
        print(f"{label:<28}{d:>18.3f}{r:>14.3f}{t:>18.3f}")
    every = fit_chain_params(_samples(chains), dev)
    d, r, t = _errors(chains, dev, every)
    print(f"{'fitted on all (in sample)':<28}{d:>18.3f}{r:>14.3f}{t:>18.3f}")
    print(every)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--cases", default="")
    m.add_argument("--precisions", default="fp16,tf32")
    m.add_argument("--device", default="h100", help="the preset the model prices with")
    m.add_argument("--workers", type=int, default=None)
    f = sub.add_parser("fit")
    f.add_argument("samples", type=Path)
    a = ap.parse_args()
    return measure(a) if a.cmd == "measure" else fit(a)


if __name__ == "__main__":
    sys.exit(main())
