"""Probe a cooperative two-phase kernel for the GEMM chains of issue 15 (G4-G12).

Session 17 found that the chain kernel's walk over the intermediate is too serial for G4-G11: even
a split walk that skips its sum reaches only 0.59-0.76 of eager's two cuBLAS calls. This probe
times one kernel whose programs take tickets in launch order: the first tickets compute the
intermediate's tiles (phase 1), the rest compute output tiles (phase 2), each waiting only for the
intermediate tiles it reads. A program that holds a ticket is running, so every phase-1 ticket is
held by a running program before any phase-2 program waits: no deadlock, whatever the grid.

- `left`: C = A·B in phase 1 (stored in the chain's dtype, as eager rounds it), out = C·D; an output
  row block waits for its row block of C.
- `right`: X = B·D in phase 1, its reduction over N split in S slices whose last program sums
  them in order (the same bits whichever comes last), out = A·X; an output column block waits for
  its column block of X. The other grouping: K·L·(M+N) multiply-adds instead of M·N·(K+L).

The last program to finish zeroes the counters, so CUDA-graph replays need no memset.
GPU time per call from one CUDA graph of `--calls` calls, beside eager's (A·B)·D.

    python scripts/coop_chain_probe.py [--cases 4,8,10] [--precisions fp16,tf32]
    TRITON_INTERPRET=1 python scripts/coop_chain_probe.py --check   # small shapes, CPU
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from reassoc_probe import SHAPES, graph_us  # (the script's folder is on sys.path)



@triton.jit
def _wait(counter, need):
    seen = tl.atomic_add(counter, 0, sem="acquire")
    while seen < need:
        seen = tl.atomic_add(counter, 0, sem="acquire")


@triton.jit
def _finish(sync, n_counters, total):
    """Count this program out; the last one zeroes every counter (the ticket is sync[0])."""
    done = tl.atomic_add(sync + 1, 1)
    if done == total - 1:
        offs = tl.arange(0, 1024)
        tl.store(sync + offs, tl.zeros([1024], dtype=tl.int32), mask=offs < n_counters)


@triton.jit
def coop_left(a, b, d, c, out, sync, M, K, N, L,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BL: tl.constexpr):
    """Phase 1: C[m, n] = A[m, :]·B[:, n]; phase 2: out[m, l] = C[m, :]·D[:, l] (batch-major tiles)."""
    t = tl.atomic_add(sync, 1)  # ticket: launch order of running programs
    mt, nt, lt = tl.cdiv(M, BM), tl.cdiv(N, BN), tl.cdiv(L, BL)
    p1 = mt * nt
    nb = tl.num_programs(0) // (p1 + mt * lt)
    rows = tl.arange(0, BM)
    if t < p1 * nb:
        bi, r = t // p1, t % p1
        pm, pn = r // nt, r % nt
        om, on, ok = pm * BM + rows, pn * BN + tl.arange(0, BN), tl.arange(0, BK)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            x = tl.load(a + bi * M * K + om[:, None] * K + (k0 + ok)[None, :])
            y = tl.load(b + bi * K * N + (k0 + ok)[:, None] * N + on[None, :])
            acc = tl.dot(x, y, acc)
        tl.store(c + bi * M * N + om[:, None] * N + on[None, :], acc.to(c.dtype.element_ty))
        tl.debug_barrier()
        tl.atomic_add(sync + 2 + bi * mt + pm, 1, sem="release")
    else:
        q = t - p1 * nb
        bi, r = q // (mt * lt), q % (mt * lt)
        pm, pl = r // lt, r % lt
        _wait(sync + 2 + bi * mt + pm, nt)
        om2, ol2, on2 = pm * BM + rows, pl * BL + tl.arange(0, BL), tl.arange(0, BN)
        acc2 = tl.zeros([BM, BL], dtype=tl.float32)
        for n0 in range(0, N, BN):
            x2 = tl.load(c + bi * M * N + om2[:, None] * N + (n0 + on2)[None, :], cache_modifier=".cg")
            y2 = tl.load(d + bi * N * L + (n0 + on2)[:, None] * L + ol2[None, :])
            acc2 = tl.dot(x2, y2, acc2)
        tl.store(out + bi * M * L + om2[:, None] * L + ol2[None, :], acc2.to(out.dtype.element_ty))
    _finish(sync, 2 + nb * mt, tl.num_programs(0))


@triton.jit
def coop_right(a, b, d, x_ws, part, out, sync, M, K, N, L,
               BK1: tl.constexpr, BL1: tl.constexpr, BN: tl.constexpr, S: tl.constexpr,
               BM: tl.constexpr, BK2: tl.constexpr):
    """Phase 1: X[k, l] = B[k, :]·D[:, l] in S slices of N, summed in order by the tile's last
    slice; phase 2: out[m, l] = A[m, :]·X[:, l], each output tile waiting for its column block of X."""
    t = tl.atomic_add(sync, 1)
    kt, lt, mt = tl.cdiv(K, BK1), tl.cdiv(L, BL1), tl.cdiv(M, BM)
    p1 = kt * lt * S
    nb = tl.num_programs(0) // (p1 + mt * lt)
    ol = tl.arange(0, BL1)
    if t < p1 * nb:
        bi, r = t // p1, t % p1
        tile, s = r // S, r % S
        pk, pl = tile // lt, tile % lt
        ok, ol1, on = pk * BK1 + tl.arange(0, BK1), pl * BL1 + ol, tl.arange(0, BN)
        acc = tl.zeros([BK1, BL1], dtype=tl.float32)
        span = N // S
        for n0 in range(s * span, (s + 1) * span, BN):
            x = tl.load(b + bi * K * N + ok[:, None] * N + (n0 + on)[None, :])
            y = tl.load(d + bi * N * L + (n0 + on)[:, None] * L + ol1[None, :])
            acc = tl.dot(x, y, acc)
        slot = ((bi * kt * lt + tile) * S + s) * BK1 * BL1
        cell = tl.arange(0, BK1)[:, None] * BL1 + ol[None, :]
        tl.store(part + slot + cell, acc)
        tl.debug_barrier()
        tile_counter = sync + 2 + nb * lt + bi * kt * lt + tile
        if tl.atomic_add(tile_counter, 1, sem="acq_rel") == S - 1:
            tot = tl.zeros([BK1, BL1], dtype=tl.float32)
            first = (bi * kt * lt + tile) * S * BK1 * BL1
            for i in tl.static_range(S):
                tot += tl.load(part + first + i * BK1 * BL1 + cell, cache_modifier=".cg")
            tl.store(x_ws + bi * K * L + ok[:, None] * L + ol1[None, :], tot.to(x_ws.dtype.element_ty))
            tl.debug_barrier()
            tl.atomic_add(sync + 2 + bi * lt + pl, 1, sem="release")
    else:
        q = t - p1 * nb
        bi, r = q // (mt * lt), q % (mt * lt)
        pm, pl = r // lt, r % lt
        _wait(sync + 2 + bi * lt + pl, kt)
        om2, ol2, ok2 = pm * BM + tl.arange(0, BM), pl * BL1 + ol, tl.arange(0, BK2)
        acc2 = tl.zeros([BM, BL1], dtype=tl.float32)
        for k0 in range(0, K, BK2):
            x2 = tl.load(a + bi * M * K + om2[:, None] * K + (k0 + ok2)[None, :])
            y2 = tl.load(x_ws + bi * K * L + (k0 + ok2)[:, None] * L + ol2[None, :], cache_modifier=".cg")
            acc2 = tl.dot(x2, y2, acc2)
        tl.store(out + bi * M * L + om2[:, None] * L + ol2[None, :], acc2.to(out.dtype.element_ty))
    _finish(sync, 2 + nb * lt + nb * kt * lt, tl.num_programs(0))


def run_left(a, b, d, cfg, scratch):
    bs, m, k = a.shape
    n, l = b.shape[2], d.shape[2]
    bm, bn, bk, bl, warps, stages = cfg
    grid = bs * ((m // bm) * (n // bn) + (m // bm) * (l // bl))
    c, out, sync = scratch
    coop_left[(grid,)](a, b, d, c, out, sync, m, k, n, l, BM=bm, BN=bn, BK=bk, BL=bl,
                       num_warps=warps, num_stages=stages)
    return out


def run_right(a, b, d, cfg, scratch):
    bs, m, k = a.shape
    n, l = b.shape[2], d.shape[2]
    bk1, bl1, bn, s, bm, bk2, warps, stages = cfg
    grid = bs * ((k // bk1) * (l // bl1) * s + (m // bm) * (l // bl1))
    x, part, out, sync = scratch
    coop_right[(grid,)](a, b, d, x, part, out, sync, m, k, n, l, BK1=bk1, BL1=bl1, BN=bn, S=s, BM=bm, BK2=bk2,
                        num_warps=warps, num_stages=stages)
    return out


def scratch_left(a, b, d):
    bs, m, _ = a.shape
    return (torch.empty(bs, m, b.shape[2], device=a.device, dtype=a.dtype),
            torch.empty(bs, m, d.shape[2], device=a.device, dtype=a.dtype),
            torch.zeros(1024, device=a.device, dtype=torch.int32))


def scratch_right(a, b, d, s):
    bs, m, k = a.shape
    l = d.shape[2]
    return (torch.empty(bs, k, l, device=a.device, dtype=a.dtype),
            torch.empty(bs * s * k * l, device=a.device, dtype=torch.float32),
            torch.empty(bs, m, l, device=a.device, dtype=a.dtype),
            torch.zeros(1024, device=a.device, dtype=torch.int32))


def left_configs(m, k, n, l):
    for bm, bn, bk, bl, w, st in itertools.product((64,), (64, 128), (64,), (64, 128), (4,), (3,)):
        if m % bm == 0 and n % bn == 0 and k % bk == 0 and l % bl == 0 and 2 + m // bm * 12 < 1024:
            yield (bm, bn, bk, bl, w, st)


def right_configs(m, k, n, l):
    for bk1, bl1, bn, s, bm, w in itertools.product((64,), (64,), (64,), (2, 4, 8), (64, 128), (4,)):
        if k % bk1 == 0 and l % bl1 == 0 and (n // s) % bn == 0 and m % bm == 0:
            yield (bk1, bl1, bn, s, bm, 64, w, 3)


def operands(bs, m, k, n, l, dtype, device):
    gen = torch.Generator(device="cpu").manual_seed(bs * m + k * n + l)
    return [(torch.randn(bs, *s, generator=gen) / s[0] ** 0.25).to(device=device, dtype=dtype)
            for s in ((m, k), (k, n), (n, l))]


def check() -> None:
    """Both forms against float64 on small shapes (the interpreter runs programs in ticket order)."""
    for form, (bs, m, k, n, l) in (("left", (2, 128, 64, 128, 64)), ("right", (2, 128, 64, 256, 64))):
        a, b, d = operands(bs, m, k, n, l, torch.float32, "cpu")
        ref = (a.double() @ b.double()) @ d.double()
        if form == "left":
            scratch = scratch_left(a, b, d)
            got = run_left(a, b, d, (64, 64, 64, 64, 4, 3), scratch)
        else:
            scratch = scratch_right(a, b, d, 2)
            got = run_right(a, b, d, (64, 64, 64, 2, 64, 64, 4, 3), scratch)
        err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
        left_zero = int(scratch[-1].abs().sum())
        print(f"{form}: max err {err:.1e}, counters left {left_zero}")
        assert err < 1e-2 and left_zero == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default="4,8,10")
    parser.add_argument("--precisions", default="fp16,tf32")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        check()
        return
    print(f"{'case':9} {'prec':5} {'eager':>7} {'left':>7} {'right':>7} {'best/eager':>10}  best config")
    for prec in args.precisions.split(","):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dtype = torch.float16 if prec == "fp16" else torch.float32
        for case in map(int, args.cases.split(",")):
            bs, m, k, n, l = SHAPES[case]
            a, b, d = operands(bs, m, k, n, l, dtype, "cuda")
            ref = (a.double() @ b.double()) @ d.double()
            eager = graph_us(lambda: torch.matmul(torch.matmul(a, b), d), args.calls)
            best = {"left": (float("inf"), None), "right": (float("inf"), None)}
            for form, configs in (("left", left_configs(m, k, n, l)), ("right", right_configs(m, k, n, l))):
                for cfg in configs:
                    scratch = scratch_left(a, b, d) if form == "left" else scratch_right(a, b, d, cfg[3])
                    fn = run_left if form == "left" else run_right
                    try:
                        got = fn(a, b, d, cfg, scratch)
                        torch.cuda.synchronize()
                    except Exception as e:  # a config Triton cannot build is skipped, and said
                        print(f"  {form} {cfg}: {type(e).__name__}: {str(e)[:100]}")
                        continue
                    err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                    if err > 5e-3 or int(scratch[-1].abs().sum()):
                        print(f"  {form} {cfg}: wrong (err {err:.1e}, counters {int(scratch[-1].abs().sum())})")
                        continue
                    us = graph_us(lambda: fn(a, b, d, cfg, scratch), args.calls)
                    if us < best[form][0]:
                        best[form] = (us, cfg)
            win = min(best, key=lambda f: best[f][0])
            print(f"gemm_g{case:<3} {prec:5} {eager:7.2f} {best['left'][0]:7.2f} {best['right'][0]:7.2f} "
                  f"{best[win][0] / eager:10.2f}  {win} {best[win][1]}", flush=True)


if __name__ == "__main__":
    main()
