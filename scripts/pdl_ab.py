"""A/B: one compiled plan replayed with and without programmatic dependent launch (PDL), in one process.

Since session 60 tessera launches its generated kernels with PDL on Hopper (`codegen/launch.pdl_supported`):
the next kernel launches while one runs and waits on the GPU for it to finish. This compiles each zoo model
once (measured costs, one tuning database, timed with `TESSERA_PDL=1`), builds two executables of the same plan, one with
`TESSERA_PDL=0`, checks that they compute the same bits, and times both, interleaved:

- `wall`: CUDA events around `--calls` back-to-back replays (what a call costs on the GPU's timeline);
- `sum`: the profiler's kernel time summed (counts a PDL kernel's wait while the one before runs);
- `busy`: the time at least one kernel ran (what `tessera bench --timing gpu` reports since session 60).

`--spans` also prints, for a plan of a few kernels (issue 15's GEMM chains), each kernel's start and end
on the GPU relative to the call's first kernel (medians over the profiled calls): under PDL the tail of
the last kernel after the one before ends is what PDL leaves of its time.

    python scripts/pdl_ab.py [--models llama,gpt2] [--precision fp16] [--db PATH] [--json OUT.json] [--spans]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tessera import zoo  # noqa: E402
from tessera.compiler import CompileOptions, compile_model, plan_document  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.runtime.executable import Executable  # noqa: E402
from tessera.runtime.profile import profile_executable  # noqa: E402
from tessera.verify import random_inputs  # noqa: E402


def _executable(result, plan: dict, pdl: bool) -> Executable:
    saved = os.environ.get("TESSERA_PDL")
    os.environ["TESSERA_PDL"] = "1" if pdl else "0"
    try:
        return Executable(result.graph, plan, "cuda")
    finally:
        os.environ.pop("TESSERA_PDL") if saved is None else os.environ.__setitem__("TESSERA_PDL", saved)


def _wall_us(exe: Executable, feeds: dict, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        exe.run_static(feeds)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def _spans(exe: Executable, feeds: dict, calls: int = 50) -> list[tuple[str, float, float]]:
    """(kernel, start, end) in µs from the call's first kernel start, medians over `calls` replays."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    exe.run_static(feeds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            exe.run_static(feeds)
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation),
                 key=lambda e: e.time_range.start)
    kernels = [e for e in evs if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    per = len(kernels) // calls
    if per == 0 or per * calls != len(kernels):
        return []
    rows = []
    for i in range(per):
        starts, ends = [], []
        for c in range(calls):
            first = kernels[c * per].time_range.start
            e = kernels[c * per + i]
            starts.append(e.time_range.start - first)
            ends.append(e.time_range.end - first)
        starts.sort(), ends.sort()
        rows.append((kernels[i].name[:40], starts[calls // 2], ends[calls // 2]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--db", default=None, help="tuning database (default: a fresh one per run)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--spans", action="store_true", help="print each kernel's span in a call (few-kernel plans)")
    args = parser.parse_args()
    os.environ["TESSERA_PDL"] = "1"  # the tuning's timing workers launch as the PDL executable does
    tmp = Path(tempfile.mkdtemp())
    db = args.db or str(tmp / "tuning.db")
    rows = []
    for name in args.models.split(","):
        path = zoo.build(name, tmp)
        t0 = time.perf_counter()
        result = compile_model(path, CompileOptions(precision=args.precision, io="precision", cost="measured",
                                                    db=db, solver="highs"))
        compile_s = time.perf_counter() - t0
        plan = plan_document(result)
        exes = {"pdl": _executable(result, plan, True), "off": _executable(result, plan, False)}
        assert exes["pdl"].pdl and not exes["off"].pdl
        graph = load(path).graph
        raw = {k: torch.from_numpy(v) for k, v in random_inputs(graph, 1).items()}
        feeds = {k: exe.bind_inputs(exe.prepare_inputs(**raw)) for k, exe in exes.items()}
        outs = {k: exe.run_static(feeds[k]) for k, exe in exes.items()}
        same = all(torch.equal(outs["pdl"][o], outs["off"][o]) for o in outs["off"])
        walls: dict[str, list[float]] = {k: [] for k in exes}
        for _ in range(args.repeats):  # interleaved, before any profile (CUPTI stays attached after one)
            for k, exe in exes.items():
                walls[k].append(_wall_us(exe, feeds[k], args.calls))
        profs = {k: profile_executable(exe, feeds[k], 30, bind=False) for k, exe in exes.items()}
        spans = {k: _spans(exe, feeds[k]) for k, exe in exes.items()} if args.spans else {}
        for k, rs in spans.items():
            print(f"{name} {k} spans (µs from the first kernel's start): " + "; ".join(
                f"{n} {a:.2f}-{b:.2f}" for n, a, b in rs), flush=True)
        for k in exes:
            p = profs[k]
            rows.append(dict(model=name, precision=args.precision, pdl=k, wall_us=min(walls[k]), walls=walls[k],
                             sum_us=p.total_us, busy_us=p.busy_us, kernels=len(exes[k].steps),
                             compile_s=round(compile_s, 1), same_bits=same, spans=spans.get(k, [])))
        print(f"{name}: compiled in {compile_s:.0f} s, outputs with and without PDL equal: {same}; " + ", ".join(
            f"{r['pdl']} wall {r['wall_us']:.1f} sum {r['sum_us']:.1f} busy {r['busy_us']:.1f}" for r in rows[-2:]),
            flush=True)
        if args.json:  # after each model: a run cut off by a time limit keeps what it measured
            Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                   "torch": torch.__version__, "rows": rows}, indent=1))
    dev = torch.cuda.get_device_name()
    print(f"\n{dev}; torch {torch.__version__}; µs per call")
    print(f"{'model':8} {'pdl':4} {'wall':>7} {'sum':>7} {'busy':>7}  walls")
    for r in rows:
        print(f"{r['model']:8} {r['pdl']:4} {r['wall_us']:7.1f} {r['sum_us']:7.1f} {r['busy_us']:7.1f}  "
              + " ".join(f"{w:.1f}" for w in r["walls"]))


if __name__ == "__main__":
    main()
