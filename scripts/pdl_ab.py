"""A/B: one compiled plan replayed with and without programmatic dependent launch (PDL), in one process.

Since session 60 tessera launches its generated kernels with PDL on Hopper (`codegen/launch.pdl_supported`):
the next kernel launches while one runs and waits on the GPU for it to finish. This compiles each zoo model
once (measured costs, one tuning database, timed with `TESSERA_PDL=1`), builds two executables of the same plan, one with
`TESSERA_PDL=0`, checks that they compute the same bits, and times both, interleaved:

- `wall`: CUDA events around `--calls` back-to-back replays (what a call costs on the GPU's timeline);
- `sum`: the kernels' spans summed (`Profile.span_us`: counts a PDL kernel's wait while the one before runs);
- `busy`: the time at least one kernel ran (what `tessera bench --timing gpu` reports since session 60).

`--spans` also prints, for a plan of a few kernels (issue 15's GEMM chains), each kernel's start and end
on the GPU relative to the call's first kernel (medians over the profiled calls): under PDL the tail of
the last kernel after the one before ends is what PDL leaves of its time.

`--chain W/M/N/L/K/S,...` replays the plan once per listed schedule of its chain kernels (warps, BLOCK_M, BLOCK_N,
BLOCK_L, BLOCK_K, stages) instead of the tuned one. `--split` adds two executables that separate PDL's two
parts: `code` compiles the prologue in but launches without the attribute (griddepcontrol does nothing),
`attr` launches with the attribute a kernel without the prologue, `late` with the attribute and the wait but
without the early trigger (the next kernel launches as this one ends). Each kernel binary's registers, spills and
shared memory are printed (is a slower PDL kernel a different binary?). `--in-graph N` also times N calls
captured in one CUDA graph, where under PDL one call's kernels overlap the next call's (a replay of one call
has nothing before it to overlap: PDL works within a graph, not across replays). `--late-chains` adds the
plan with every chain kernel launched late (`ChainSchedule.late`: the kernel before it takes PDL=2), to
time what that costs or saves in a whole model.

    python scripts/pdl_ab.py [--models llama,gpt2] [--precision fp16] [--db PATH] [--json OUT.json] [--spans]
        [--chain 4/64/64/128/64/3] [--split] [--in-graph 20] [--late-chains]
"""
from __future__ import annotations

import argparse
import copy
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
from tessera.runtime.profile import _wall_us, profile_executable  # noqa: E402
from tessera.verify import random_inputs  # noqa: E402


def _executable(result, plan: dict, pdl: bool) -> Executable:
    saved = os.environ.get("TESSERA_PDL")
    os.environ["TESSERA_PDL"] = "1" if pdl else "0"
    try:
        return Executable(result.graph, plan, "cuda")
    finally:
        os.environ.pop("TESSERA_PDL") if saved is None else os.environ.__setitem__("TESSERA_PDL", saved)


CHAIN_FIELDS = ("num_warps", "block_m", "block_n", "block_l", "block_k", "num_stages")


def _with_chains(plan: dict, **fields: object) -> dict:
    """A copy of the plan with these fields set in every chain kernel's schedule."""
    plan = copy.deepcopy(plan)
    for k in plan["kernels"]:
        if k.get("schedule", {}).get("form") == "chain":
            k["schedule"].update(fields)
    return plan


def _split(exe: Executable, part: str) -> Executable:
    """A PDL executable's kernels launched with one of PDL's two parts: `code` (prologue, no attribute) or
    `attr` (attribute, no prologue); or `late`: the attribute and the wait, but no early trigger (the next
    kernel launches as this one ends)."""
    for step in exe.steps:
        k = getattr(step, "kernel", None)
        if k is None or not getattr(k, "pdl", False):
            continue
        k.pdl = 0
        extra = {"code": {"PDL": 1}, "attr": {"launch_pdl": True}, "late": {"PDL": 2, "launch_pdl": True}}[part]
        k.launches = [(fn, grid, {**meta, **extra}) for fn, grid, meta in k.launches]
    return exe


def _binaries(exe: Executable) -> list[str]:
    """Each launched Triton binary: its kernel, registers per thread, spills and shared memory in bytes."""
    out = []
    for step in exe.steps:
        k = getattr(step, "kernel", None)
        for fn, _, _ in getattr(k, "launches", []):
            try:  # Triton's per-device cache of compiled kernels (3.6: a tuple whose first item is the dict)
                for compiled in fn.device_caches[torch.cuda.current_device()][0].values():
                    compiled._init_handles()
                    out.append(f"{fn.__name__[:24]} regs {compiled.n_regs} spills {compiled.n_spills} "
                               f"shared {compiled.metadata.shared}")
            except Exception as e:  # noqa: BLE001 - a Triton without this cache: say so, go on
                out.append(f"{getattr(fn, '__name__', '?')}: {type(e).__name__}")
    return out


def _in_graph_us(exe: Executable, feeds: dict, launches: int) -> float:
    """µs per call of `launches` calls captured into one CUDA graph (a call's kernels under PDL overlap the
    next call's, as the tuning's timing graph launches a candidate), timed as the tuning times a graph."""
    from tessera.cost.profiler import _replay_seconds

    exe._launch(feeds)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            exe._launch(feeds)
    return _replay_seconds(g) * 1e6 / launches


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


def _measure(label: str, result, plan: dict, path: Path, args: argparse.Namespace, compile_s: float) -> list[dict]:
    """Build the plan's executables (PDL on and off, with --split its two parts), check they compute the same
    bits, time them interleaved; one row each."""
    rows: list[dict] = []
    exes = {"pdl": _executable(result, plan, True), "off": _executable(result, plan, False)}
    if args.split:
        exes.update({part: _split(_executable(result, plan, True), part) for part in ("code", "attr", "late")})
    if args.late_chains:  # every chain kernel launched late: the kernel before each takes PDL=2
        exes["chains-late"] = _executable(result, _with_chains(plan, late=True), True)
    assert exes["pdl"].pdl and not exes["off"].pdl
    graph = load(path).graph
    raw = {k: torch.from_numpy(v) for k, v in random_inputs(graph, 1).items()}
    feeds = {k: exe.bind_inputs(exe.prepare_inputs(**raw)) for k, exe in exes.items()}
    outs = {k: exe.run_static(feeds[k]) for k, exe in exes.items()}
    same = all(torch.equal(outs[k][o], outs["off"][o]) for k in outs for o in outs["off"])
    walls: dict[str, list[float]] = {k: [] for k in exes}
    for _ in range(args.repeats):  # interleaved, before any profile (CUPTI stays attached after one)
        for k, exe in exes.items():
            walls[k].append(_wall_us(lambda: exe.run_static(feeds[k]), args.calls, exe.device))
    profs = {k: profile_executable(exe, feeds[k], 30, bind=False) for k, exe in exes.items()}
    spans = {k: _spans(exe, feeds[k]) for k, exe in exes.items()} if args.spans else {}
    for k, rs in spans.items():
        print(f"{label} {k} spans (µs from the first kernel's start): " + "; ".join(
            f"{n} {a:.2f}-{b:.2f}" for n, a, b in rs), flush=True)
    for k in exes:
        p = profs[k]
        rows.append(dict(model=label, precision=args.precision, pdl=k, wall_us=min(walls[k]), walls=walls[k],
                         sum_us=p.span_us, busy_us=p.busy_us, kernels=len(exes[k].steps),
                         compile_s=round(compile_s, 1), same_bits=same, spans=spans.get(k, [])))
    print(f"{label}: compiled in {compile_s:.0f} s, outputs with and without PDL equal: {same}; " + ", ".join(
        f"{r['pdl']} wall {r['wall_us']:.1f} sum {r['sum_us']:.1f} busy {r['busy_us']:.1f}" for r in rows),
        flush=True)
    for k, exe in exes.items():
        print(f"{label} {k} binaries: " + "; ".join(_binaries(exe)), flush=True)
    if args.in_graph:
        for k, exe in exes.items():
            us = _in_graph_us(exe, feeds[k], args.in_graph)
            next(r for r in rows if r["pdl"] == k)["in_graph_us"] = us
            print(f"{label} {k}: {us:.2f} us per call, {args.in_graph} calls in one graph", flush=True)
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
    parser.add_argument("--chain", default="", help="chain schedules W/M/N/L/K/S to replay instead of the tuned")
    parser.add_argument("--split", action="store_true", help="also PDL's prologue alone and its attribute alone")
    parser.add_argument("--in-graph", type=int, default=0, help="also time N calls captured in one graph")
    parser.add_argument("--late-chains", action="store_true",
                        help="also the plan with every chain kernel launched late (ChainSchedule.late)")
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
        tuned = plan_document(result)
        for chain in args.chain.split(",") if args.chain else [""]:
            plan = _with_chains(tuned, **dict(zip(CHAIN_FIELDS, map(int, chain.split("/"))))) if chain else tuned
            label = f"{name} {chain}".strip()
            rows += _measure(label, result, plan, path, args, compile_s)
        if args.json:  # after each model: a run cut off by a time limit keeps what it measured
            Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                   "torch": torch.__version__, "rows": rows}, indent=1))
    dev = torch.cuda.get_device_name()
    print(f"\n{dev}; torch {torch.__version__}; µs per call")
    print(f"{'model':24} {'pdl':11} {'wall':>7} {'sum':>7} {'busy':>7}  walls")
    for r in rows:
        print(f"{r['model']:24} {r['pdl']:11} {r['wall_us']:7.1f} {r['sum_us']:7.1f} {r['busy_us']:7.1f}  "
              + " ".join(f"{w:.1f}" for w in r["walls"]))


if __name__ == "__main__":
    main()
