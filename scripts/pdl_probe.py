"""Probe programmatic dependent launch (PDL, Hopper) between two dependent Triton GEMMs (issue 15).

The GEMM chains G4-G10 run as two kernels of ~2 µs each (the right grouping: X = B·D, out = A·X),
and every one-kernel form probed so far was no faster. With PDL the second kernel is launched
while the first still runs; its programs wait (`griddepcontrol.wait`) until the first has finished
and its writes are visible. Variants of the second kernel:

- `plain`: no PDL (the baseline: what tessera launches today);
- `wait`: PDL, the wait first thing (always safe: no memory is touched before it);
- `prefetch`: PDL, A's tile (a graph input no kernel writes) loaded before the wait, X after it.

`trigger` adds `griddepcontrol.launch_dependents` at the first kernel's start, so the second may
launch before the first's programs exit. Times: the mean of CUDA-graph replays (what a call costs,
gaps included) and the CUDA profiler's kernel sum (what `tessera bench --timing gpu` reports).

    python scripts/pdl_probe.py [--cases 4,7,8,9,10] [--precisions fp16,tf32]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from reassoc_probe import SHAPES, graph_us  # (the script's folder is on sys.path)


@triton.jit
def gemm(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
         WAIT: tl.constexpr, PREFETCH: tl.constexpr, TRIGGER: tl.constexpr):
    """c = a·b for one [BM, BN] tile; the GDC calls as the variant asks (no-ops without PDL)."""
    if TRIGGER:
        gdc_launch_dependents()
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if PREFETCH:  # one K tile (K <= BK); a is an input no kernel writes, so it is loaded before the wait
        at = tl.load(a + rm[:, None] * sam + rk[None, :] * sak, mask=(rm[:, None] < M) & (rk[None, :] < K))
        gdc_wait()
        bt = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn, mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = tl.dot(at, bt)
    else:
        if WAIT:
            gdc_wait()
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            at = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K))
            bt = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N))
            acc += tl.dot(at, bt)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def launch(a, b, c, cfg, wait=False, prefetch=False, trigger=False, pdl=False):
    bm, bn, bk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[1]
    gemm[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BM=bm, BN=bn, BK=bk,
        WAIT=wait, PREFETCH=prefetch, TRIGGER=trigger, num_warps=warps, num_stages=stages, launch_pdl=pdl)


CONFIGS = [(bm, bn, bk, w, s) for bm, bn, bk, w, s in itertools.product(
    (32, 64, 128), (32, 64), (64, 128), (4,), (3,))]
VARIANTS = {  # name: (first kernel's trigger, second kernel's wait, prefetch, pdl)
    "plain": (False, False, False, False),
    "wait": (False, True, False, True),
    "wait+trigger": (True, True, False, True),
    "prefetch+trigger": (True, True, True, True),
}


def profiler_us(fn, calls: int = 50) -> float:
    """The CUDA kernels' summed time per call (the way tessera bench --timing gpu counts)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages()) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default="4,7,8,9,10")
    parser.add_argument("--precisions", default="fp16,tf32")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rows = []
    warm = torch.randn(4096, 4096, device="cuda")
    for _ in range(200):  # a second of work first, so the clocks are up before anything is timed
        warm @ warm
    for prec in args.precisions.split(","):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dtype = torch.float16 if prec == "fp16" else torch.float32
        for case in map(int, args.cases.split(",")):
            bs, m, k, n, l = SHAPES[case]
            assert bs == 1
            a, b, d = (torch.randn(*s, device="cuda", dtype=dtype) / s[0] ** 0.25 for s in ((m, k), (k, n), (n, l)))
            x = torch.empty(k, l, device="cuda", dtype=dtype)
            out = torch.empty(m, l, device="cuda", dtype=dtype)
            eager = graph_us(lambda: torch.matmul(torch.matmul(a, b), d), args.calls)
            ref = torch.matmul(torch.matmul(a.double(), b.double()), d.double())
            # each kernel's best schedule, without PDL
            fits = [c for c in CONFIGS if 3 * (c[0] + c[1]) * c[2] * a.element_size() <= 200 * 1024]
            c1 = min((c for c in fits if c[2] <= n), key=lambda c: graph_us(lambda: launch(b, d, x, c), 50))
            c2 = min(fits, key=lambda c: graph_us(lambda: launch(a, x, out, c), 50))
            prefetch_ok = k <= c2[2]  # the prefetch variant holds all of K in one tile
            times = {}
            for name, (trigger, wait, prefetch, pdl) in VARIANTS.items():
                if prefetch and not prefetch_ok:
                    continue

                def call(trigger=trigger, wait=wait, prefetch=prefetch, pdl=pdl):
                    launch(b, d, x, c1, trigger=trigger)
                    launch(a, x, out, c2, wait=wait, prefetch=prefetch, pdl=pdl)
                out.zero_()
                g = graph_us(call, args.calls)  # replays: a wrong wait would show in the check below
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                times[name] = (g, profiler_us(call), err)
            eager_prof = profiler_us(lambda: torch.matmul(torch.matmul(a, b), d))
            rows.append((case, prec, eager, eager_prof, c1, c2, times))
            print(f"gemm_g{case} {prec}: eager {eager:.2f} ({eager_prof:.2f}) " + " ".join(
                f"{k_}={g:.2f}({p:.2f}, err {e:.0e})" for k_, (g, p, e) in times.items()), flush=True)
    names = list(VARIANTS)
    print("\ngraph replay µs per call (profiler kernel sum in brackets); ratio = best PDL graph / eager graph")
    print(f"{'case':9} {'prec':5} {'eager':>13} " + " ".join(f"{n_:>17}" for n_ in names) + "  ratio  schedules")
    for case, prec, eager, eager_prof, c1, c2, times in rows:
        cells = " ".join(f"{times[n_][0]:7.2f} ({times[n_][1]:6.2f})" if n_ in times else f"{'-':>17}" for n_ in names)
        best = min(v[0] for n_, v in times.items() if n_ != "plain")
        print(f"gemm_g{case:<3} {prec:5} {eager:6.2f} ({eager_prof:5.2f}) {cells}  {best / eager:5.2f}  {c1} {c2}")
        worst_err = max(v[2] for v in times.values())
        assert worst_err < (2e-3 if prec == "fp16" else 5e-3), (case, prec, worst_err)


if __name__ == "__main__":
    main()
