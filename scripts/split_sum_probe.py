"""Probe how a split chain's partial products should be summed (issue 15, GEMM chains G4-G11).

A split walk (`codegen/chain.py` `_sum_slices`) stores each program's float32 partial, and the
tile's last program reads all `split` of them back and sums them in order: one SM reads
split x tile bytes alone, after everyone else is done. This probe times, per schedule, edits of
the generated source under CUDA-graph timing:

- `ordered`: the generated kernel;
- `atomic`: each program adds its partial into one float32 tile (`tl.atomic_add`, relaxed); the
  last reads that tile once and zeroes it again (not bit-stable: the adds' order varies);
- `floor`: each program stores its partial and nothing sums it (wrong, a lower bound).

beside eager's two cuBLAS calls, so the generator's choice is made on numbers.

    python scripts/split_sum_probe.py [--cases gemm_g4,gemm_g8,gemm_g10,gemm_g11] [--precision fp16]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton.testing

from chain_probe import load
from tessera.codegen.chain import chain_problem, chain_schedules, generate_chain
from tessera.codegen.kernels import ChainSchedule
from tessera.compiler import CompileOptions, compile_model
from tessera.runtime.torch_prims import TORCH_DTYPES
from tessera.zoo import build


def atomic(src: str) -> str:
    """Partials added into slice 0's place; the last reads it once and leaves zeros behind."""
    store = re.search(r"\n(\s+)tl\.store\(ws \+ ([^\n]*pid_s[^\n]*), acc\)\n", src)
    loop = re.search(r"\n(\s+)tot = tl\.zeros\(\[BLOCK_M, BLOCK_N\], dtype=tl\.float32\)\n"
                     r"\s+for split in tl\.static_range\(\d+\):\n\s+tot \+= tl\.load\(ws \+ ([^\n]*split[^\n]*), "
                     r"cache_modifier=\"\.cg\"\)\n", src)
    if store is None or loop is None or ", mask=" in store.group(2) + loop.group(2):
        raise ValueError("unexpected split-walk source (masked tiles are not handled by this probe)")
    off = re.sub(r"\bpid_s\b", "0", store.group(2))
    src = src.replace(store.group(0), f"\n{store.group(1)}tl.atomic_add(ws + {off}, acc, sem=\"relaxed\")\n")
    ind, off2 = loop.group(1), re.sub(r"\bsplit\b", "0", loop.group(2))
    return src.replace(loop.group(0), f"\n{ind}tot = tl.load(ws + {off2}, cache_modifier=\".cg\")\n"
                                      f"{ind}tl.store(ws + {off2}, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))\n")


def floor(src: str) -> str:
    """No sum: the partial stored, the counter and the last program's block gone."""
    head, _, _ = src.partition("    tl.debug_barrier()\n")
    return head


def schedules(cp, itemsize: int) -> list[ChainSchedule]:
    """Split schedules with N flat and K flat (the family the split form exists for), and the
    best-known unsplit ones."""
    kept = chain_schedules(cp, itemsize).kept
    flat = [s for s in kept if s.block_n >= cp.n and s.block_k >= cp.k and s.num_stages == 3 and s.num_warps == 4
            and s.block_l in (64, 128)]
    return flat + [s for s in kept if s.split_l == 1 and s.num_stages == 3 and s.num_warps == 4
                   and (s.block_m, s.block_n, s.block_l) in ((64, 32, 64), (64, 64, 128), (16, 32, 128))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="gemm_g4,gemm_g8,gemm_g10,gemm_g11")
    ap.add_argument("--precision", default="fp16")
    a = ap.parse_args()
    table = []
    for case in a.cases.split(","):
        r = compile_model(build(case, Path(tempfile.mkdtemp())),
                          CompileOptions(cost="analytical", templates="force", precision=a.precision,
                                         io="precision", solver="highs"))
        (k,) = [k for k in r.kernels if isinstance(getattr(k.triton, "schedule", None), ChainSchedule)]
        g = r.graph
        torch.manual_seed(0)
        env = {t: (torch.from_numpy(g.constants[t]) if t in g.constants else torch.randn(g.types[t].shape))
               .to("cuda", TORCH_DTYPES[g.types[t].dtype]) for t in k.triton.inputs}
        cp = chain_problem(g, k.nodes)
        a_, b_, d_ = (env[t] for t in k.triton.inputs[:3])
        ref = torch.matmul(torch.matmul(a_.double(), b_.double()).to(a_.dtype).double(), d_.double())
        eager = triton.testing.do_bench_cudagraph(lambda: torch.matmul(torch.matmul(a_, b_), d_)) * 1e3
        table.append((case, "eager two cuBLAS calls", "", eager, ""))
        for s in schedules(cp, a_.element_size()):
            ks = generate_chain(g, k.nodes, k.outputs, "k_probe", s, (), a.precision)
            (launch,) = ks.launches
            meta = dict(launch.meta)
            variants = [("ordered", ks.source)] + ([("atomic", atomic(ks.source)), ("floor", floor(ks.source))]
                                                   if s.split_l > 1 else [])
            for name, src in variants:
                out = torch.empty(g.types[ks.outputs[0]].shape, device="cuda",
                                  dtype=TORCH_DTYPES[g.types[ks.outputs[0]].dtype])
                ws = [torch.zeros(ks.workspace, device="cuda")] if ks.workspace else []
                args = [env[t] for t in ks.inputs] + ws + [out]
                try:
                    fn = load(src, launch.fn)
                    fn[launch.grid](*args, **meta)
                    torch.cuda.synchronize()
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    us = triton.testing.do_bench_cudagraph(lambda: fn[launch.grid](*args, **meta)) * 1e3
                    fn[launch.grid](*args, **meta)  # after many replays: the workspace left clean?
                    err2 = ((out.double() - ref).norm() / ref.norm()).item()
                except Exception as e:  # a schedule Triton refuses
                    table.append((case, str(s), name, float("nan"), type(e).__name__))
                    continue
                table.append((case, str(s), name, us, f"err {err:.1e} / after replays {err2:.1e}"))
        print(f"{case} done", flush=True)
    for case in dict.fromkeys(c for c, *_ in table):
        rows = [r for r in table if r[0] == case]
        eager = rows[0][3]
        print(f"\n{case}: eager {eager:.2f} µs; fastest 12 of {len(rows) - 1}")
        for _, s, name, us, note in sorted(rows[1:], key=lambda r: r[3] if r[3] == r[3] else 1e9)[:12]:
            print(f"  {s:<72}{name:<8}{us:7.2f} µs  {us / eager:5.2f}  {note}")
        for name in ("ordered", "atomic", "floor"):
            best = min((r for r in rows[1:] if r[2] == name and r[3] == r[3] and "split_l=1)" not in r[1]),
                       key=lambda r: r[3], default=None)
            if best:
                print(f"  best split {name:<8}{best[3]:7.2f} µs ({best[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
