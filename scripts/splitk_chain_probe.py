"""Probe a split-K first product for the regrouped GEMM chains of issue 15 (G4-G10): out = a @ (b @ d).

Sessions 37-39 ran the regrouped chain as two GEMM templates; the first, X = b @ d, walks a long
K (the chain's N: 512-1024) on few programs (X is only K x L, e.g. 128 x 128), and the floor probe
(`scripts/floor_probe.py`, session 39) timed G7's four serial K steps on 8 programs at 2.39 µs
against 1.76 µs for one step on 32. Here the first kernel splits that walk in S slices, one program
per (tile of X, slice), and stores the S float32 partials; the second GEMM sums them as it loads
its B operand (S loads per K step, summed in float32, rounded to the operand type as eager rounds
X), so nothing waits, nothing counts arrivals and no kernel only sums. S = 1 is the plain pair.

Each kernel is timed alone over a small schedule menu (the profiler's kernel sum, as the bench's
GPU mode), the best of each S is paired and timed together, checked against float64, and set
beside eager's (a @ b) @ d (two cuBLAS calls, issue 15's yardstick; target 0.67).

    PYTHONPATH=. python3 scripts/splitk_chain_probe.py [--cases 7,8,9,10,4,5,6] [--precisions fp16,tf32]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 scripts/splitk_chain_probe.py --check   # small shapes, CPU
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from reassoc_probe import SHAPES  # noqa: E402  (batch, M, K, N, L)

from tessera.runtime.profile import profile_callable  # noqa: E402


@triton.jit
def partials(b, d, p, K: tl.constexpr, N: tl.constexpr, L: tl.constexpr, S: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, TF32: tl.constexpr):
    """p[s] = b[:, slice s of N] @ d[slice s, :] in float32; program (tile of X, s)."""
    pid, s = tl.program_id(0), tl.program_id(1)
    pm, pn = pid // (L // BN), pid % (L // BN)
    om, on, ok = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.range(0, N // S, BK, num_stages=STAGES):
        x = tl.load(b + om[:, None] * N + (s * (N // S) + k0 + ok)[None, :])
        y = tl.load(d + (s * (N // S) + k0 + ok)[:, None] * L + on[None, :])
        acc = tl.dot(x, y, acc, input_precision="tf32" if TF32 else "ieee")
    tl.store(p + s * K * L + om[:, None] * L + on[None, :], acc)


@triton.jit
def consume(a, p, out, M: tl.constexpr, K: tl.constexpr, L: tl.constexpr, S: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, TF32: tl.constexpr):
    """out = a @ X, X = sum over s of p[s], summed as the B tile is loaded."""
    pid = tl.program_id(0)
    pm, pn = pid // (L // BN), pid % (L // BN)
    om, on, ok = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        x = tl.load(a + om[:, None] * K + (k0 + ok)[None, :])
        y = tl.zeros([BK, BN], dtype=tl.float32)
        for s in tl.static_range(S):
            y += tl.load(p + s * K * L + (k0 + ok)[:, None] * L + on[None, :])
        acc = tl.dot(x, y.to(a.dtype.element_ty), acc, input_precision="tf32" if TF32 else "ieee")
    tl.store(out + om[:, None] * L + on[None, :], acc.to(out.dtype.element_ty))


def run_partials(b, d, p, s, cfg, tf32):
    k, n = b.shape
    l_ = d.shape[1]
    bm, bn, bk, warps, stages = cfg
    partials[((k // bm) * (l_ // bn), s)](b, d, p, K=k, N=n, L=l_, S=s, BM=bm, BN=bn, BK=bk, STAGES=stages,
                                          TF32=tf32, num_warps=warps)


def run_consume(a, p, out, s, cfg, tf32):
    m, k = a.shape
    l_ = out.shape[1]
    bm, bn, bk, warps, stages = cfg
    consume[((m // bm) * (l_ // bn),)](a, p, out, M=m, K=k, L=l_, S=s, BM=bm, BN=bn, BK=bk, STAGES=stages,
                                       TF32=tf32, num_warps=warps)


def menu(rows: int, cols: int, depth: int, itemsize: int) -> list[tuple[int, int, int, int, int]]:
    """Tiles that divide the problem: (BM, BN, BK, warps, stages)."""
    steps = (64, 128) if itemsize == 2 else (32, 64)
    out = []
    for (bm, bn), bk, st in itertools.product(((64, 32), (32, 32), (64, 64), (32, 64)), steps, (3,)):
        if rows % bm == 0 and cols % bn == 0 and depth % bk == 0:
            out.append((bm, bn, bk, 4, st))
    return out


def operands(m, k, n, l_, dtype, device):
    gen = torch.Generator(device="cpu").manual_seed(m * k + n * l_)
    return [(torch.randn(*s, generator=gen) / s[0] ** 0.25).to(device=device, dtype=dtype)
            for s in ((m, k), (k, n), (n, l_))]


def check() -> None:
    """Every S and both precisions' paths against float64 on small shapes (CPU interpreter)."""
    for s in (1, 2, 4):
        a, b, d = operands(64, 32, 256, 32, torch.float32, "cpu")
        p = torch.empty(s, 32, 32)
        out = torch.empty(64, 32)
        run_partials(b, d, p, s, (32, 32, 32, 4, 2), False)
        run_consume(a, p, out, s, (32, 32, 32, 4, 2), False)
        ref = a.double() @ (b.double() @ d.double())
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (s, err)
        print(f"S={s}: rel L2 {err:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="7,8,9,10,4,5,6")
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.check:
        check()
        return
    torch.backends.cuda.matmul.allow_tf32 = True

    def us(fn) -> float:
        try:
            return profile_callable(fn, reps=args.reps, source="probe").total_us
        except OutOfResources:  # a schedule over the shared-memory limit (the S-way sum multiplies the B tiles)
            return math.inf

    table = []
    for prec, case in itertools.product(args.precisions.split(","), [int(c) for c in args.cases.split(",")]):
        _, m, k, n, l_ = SHAPES[case]
        dtype, tf32 = (torch.float16, False) if prec == "fp16" else (torch.float32, True)
        a, b, d = operands(m, k, n, l_, dtype, "cuda")
        out = torch.empty(m, l_, device="cuda", dtype=dtype)
        eager = us(lambda: (a @ b) @ d)
        ref = a.double() @ (b.double() @ d.double())
        size = a.element_size()
        for s in (1, 2, 4, 8):
            if (n // s) < (64 if size == 2 else 32):
                continue
            p = torch.empty(s, k, l_, device="cuda", dtype=torch.float32)
            first = min((us(lambda c=c: run_partials(b, d, p, s, c, tf32)), c)
                        for c in menu(k, l_, n // s, size) if (n // s) % c[2] == 0)
            if math.isinf(first[0]):
                continue
            run_partials(b, d, p, s, first[1], tf32)
            second = min((us(lambda c=c: run_consume(a, p, out, s, c, tf32)), c) for c in menu(m, l_, k, size))
            if math.isinf(second[0]):
                continue
            pair = us(lambda: (run_partials(b, d, p, s, first[1], tf32), run_consume(a, p, out, s, second[1], tf32)))
            err = ((out.double() - ref).norm() / ref.norm()).item()
            table.append((f"gemm_g{case}", prec, s, first[0], first[1], second[0], second[1], pair, eager, err))
            print(*table[-1], flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; GPU µs per call "
          f"(profiler kernel sum, {args.reps} calls); schedules (BM, BN, BK, warps, stages)")
    print("| case | prec | S | X partials µs | schedule | a @ sum µs | schedule | pair µs | eager µs | pair / eager | rel L2 |")
    print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for case, prec, s, t1, c1, t2, c2, pair, eager, err in table:
        print(f"| {case} | {prec} | {s} | {t1:.2f} | {c1} | {t2:.2f} | {c2} | {pair:.2f} | {eager:.2f} | "
              f"{pair / eager:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
