"""Probe a one-kernel GEMM chain that recomputes the right grouping's intermediate (issue 15, G4-G10).

out = A·(B·D). Each program owns an output tile out[m-block, l-block] and computes the column block
X[:, l-block] = B·D[:, l-block] of the intermediate itself, K-block by K-block, before multiplying
A[m-block, k-block] into it. No program waits on another and there is no split sum; the price is
that X is computed M/BM times over and every program streams all of B.

Why it might pay where the left chain (tessera's chain template) and the cooperative kernel did not:
per program it does K·N·BL + BM·K·BL multiply-adds against the left chain's BM·K·N + BM·N·BL, which
for G7-G10 (K = 128, N = 512-1024) is 2-4x fewer, and it keeps one launch.

Naming as in reassoc_probe: a is M×K, b is K×N, d is N×L. GPU time per call from one CUDA graph of
`--calls` calls, beside eager's two cuBLAS calls in both groupings; the best schedule of a sweep.

    python scripts/recompute_chain_probe.py [--cases 4,...,10] [--precisions fp16,tf32]
    TRITON_INTERPRET=1 python scripts/recompute_chain_probe.py --check   # small shapes, CPU
"""
from __future__ import annotations

import argparse
import itertools
import time

import torch
import triton
import triton.language as tl

from reassoc_probe import SHAPES, graph_us  # (the script's folder is on sys.path)


@triton.jit
def recompute_right(a, b, d, out, M, K, N, L,
                    sab, sam, sak, sbb, sbk, sbn, sdb, sdn, sdl, sob, som, sol,
                    BM: tl.constexpr, BL: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    """out[m, l] = sum_k A[m, k] · X[k, l], X[k, l] = sum_n B[k, n] · D[n, l] computed in place."""
    pm, pl, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pm * BM + tl.arange(0, BM)
    rl = pl * BL + tl.arange(0, BL)
    a += pb * sab
    b += pb * sbb
    d += pb * sdb
    acc = tl.zeros([BM, BL], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.zeros([BK, BL], dtype=tl.float32)
        for n0 in range(0, N, BN):
            rn = n0 + tl.arange(0, BN)
            bt = tl.load(b + rk[:, None] * sbk + rn[None, :] * sbn,
                         mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            dt = tl.load(d + rn[:, None] * sdn + rl[None, :] * sdl,
                         mask=(rn[:, None] < N) & (rl[None, :] < L), other=0.0)
            x += tl.dot(bt, dt)
        at = tl.load(a + rm[:, None] * sam + rk[None, :] * sak,
                     mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        # X rounded to the operands' dtype, as eager's B·D is stored before A multiplies it.
        acc += tl.dot(at, x.to(at.dtype))
    tl.store(out + pb * sob + rm[:, None] * som + rl[None, :] * sol, acc.to(out.dtype.element_ty),
             mask=(rm[:, None] < M) & (rl[None, :] < L))


def run(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, out: torch.Tensor, cfg: tuple) -> torch.Tensor:
    bm, bl, bk, bn, warps, stages = cfg
    bs, m, k = a.shape
    n, l = d.shape[1:]
    grid = (triton.cdiv(m, bm), triton.cdiv(l, bl), bs)
    recompute_right[grid](a, b, d, out, m, k, n, l, *a.stride(), *b.stride(), *d.stride(), *out.stride(),
                          BM=bm, BL=bl, BK=bk, BN=bn, num_warps=warps, num_stages=stages)
    return out


SPACES = {  # BM, BL, BK, BN, warps, stages
    "base": ((128, 64, 256), (16, 32, 64), (64, 128), (64, 128), (4, 8), (3,)),
    # the base sweep's best sat at its small-tile corner (BM 64, BL 16): smaller tiles, longer pipes
    "small": ((16, 32, 64), (16, 32), (64, 128), (64, 128, 256), (2, 4, 8), (2, 3, 4)),
}


def configs(k: int, itemsize: int, space: str = "base") -> list[tuple]:
    """Schedules whose two fp32 accumulators fit 128 registers a thread and whose tiles fit K."""
    keep = []
    for bm, bl, bk, bn, warps, stages in itertools.product(*SPACES[space]):
        if bk > k or (bk * bl + bm * bl) > 128 * 32 * warps:
            continue
        smem = stages * (bk * bn + bn * bl) * itemsize + bm * bk * itemsize + bk * bl * itemsize
        if smem > 200 * 1024:
            continue
        keep.append((bm, bl, bk, bn, warps, stages))
    return keep


def operands(bs, m, k, n, l, dtype, device):
    return tuple(torch.randn(bs, *s, device=device, dtype=dtype) / s[0] ** 0.25 for s in ((m, k), (k, n), (n, l)))


def rel_err(got: torch.Tensor, a, b, d) -> float:
    ref = torch.matmul(torch.matmul(a.double(), b.double()), d.double())
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


def check() -> None:
    """Odd shapes (every mask used) against float64, on the CPU under TRITON_INTERPRET=1."""
    for bs, m, k, n, l in ((1, 37, 80, 50, 19), (2, 64, 64, 96, 40)):
        a, b, d = operands(bs, m, k, n, l, torch.float32, "cpu")
        for cfg in ((16, 16, 32, 32, 4, 2), (32, 32, 64, 16, 4, 2)):
            err = rel_err(run(a, b, d, torch.empty(bs, m, l), cfg), a, b, d)
            assert err < 1e-5, (bs, m, k, n, l, cfg, err)
    print("recompute_chain_probe: check passed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default="4,5,6,7,8,9,10")
    parser.add_argument("--precisions", default="fp16,tf32")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--case-budget-s", type=float, default=90.0, help="sweep time per case (compiles included)")
    parser.add_argument("--space", choices=sorted(SPACES), default="base")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        check()
        return
    rows = []
    cases = [int(c) for c in args.cases.split(",")]
    for prec in args.precisions.split(","):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dtype = torch.float16 if prec == "fp16" else torch.float32
        for case in cases:
            start = time.time()
            bs, m, k, n, l = SHAPES[case]
            a, b, d = operands(bs, m, k, n, l, dtype, "cuda")
            out = torch.empty(bs, m, l, device="cuda", dtype=dtype)
            left = graph_us(lambda: torch.matmul(torch.matmul(a, b), d), args.calls)
            right = graph_us(lambda: torch.matmul(a, torch.matmul(b, d)), args.calls)
            eager_err = rel_err(torch.matmul(torch.matmul(a, b), d), a, b, d)
            best, best_cfg, tried = float("inf"), None, 0
            for cfg in configs(k, a.element_size(), args.space):
                if time.time() - start > args.case_budget_s:
                    break
                try:
                    us = graph_us(lambda: run(a, b, d, out, cfg), args.calls)
                except Exception as exc:  # a schedule that does not compile (resources): skip it
                    print(f"  gemm_g{case} {prec} {cfg}: {type(exc).__name__}")
                    continue
                tried += 1
                if us < best:
                    best, best_cfg = us, cfg
            err = rel_err(run(a, b, d, out, best_cfg), a, b, d) if best_cfg else float("nan")
            rows.append((case, prec, left, right, best, best_cfg, tried, err, eager_err))
            print(f"gemm_g{case} {prec}: eager {left:.2f} regrouped {right:.2f} recompute {best:.2f} "
                  f"{best_cfg} ({tried} schedules) err {err:.1e} eager err {eager_err:.1e}", flush=True)
    print(f"\n{'case':8} {'prec':5} {'eager us':>8} {'A(BD) us':>8} {'recompute us':>12} {'/eager':>7} "
          f"{'err':>8} {'eager err':>9}  schedule (BM BL BK BN warps stages)")
    for case, prec, left, right, best, cfg, tried, err, eager_err in rows:
        print(f"gemm_g{case:<3} {prec:5} {left:8.2f} {right:8.2f} {best:12.2f} {best / left:7.2f} "
              f"{err:8.1e} {eager_err:9.1e}  {cfg} of {tried}")


if __name__ == "__main__":
    main()
