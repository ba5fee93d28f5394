"""Device probe: what rounding tf32 operands in the K loop costs the small GEMMs of issue 15's chains.

Why. tessera's tf32 templates round every operand they do not read pre-rounded to tf32 (to
nearest, `codegen/triton_ops.py::TF32_ROUND`, five ALU instructions per element) inside the K
loop, since the tensor cores truncate unrounded operands (a bias of about 1e-3, the whole tf32
tolerance). The chain products G4-G10 read graph inputs (always rounded in the loop) and the
intermediate X = b @ d that a GEMM template writes (not stored rounded today: only elementwise and
reduction writers round what they store, `rewrite/precision.py::mark_tf32_operands`). Session 40's
split-K probe timed the same products unrounded at 0.6-0.8 of the tuned templates' time.

Each variant times one plain Triton GEMM C = A @ B (fp32 in and out, tf32 dot) over a small tile
menu, as the bench's GPU mode times (profiler kernel sum, warm L2):
- `round`: none; `bits` (TF32_ROUND on the loaded tile); `cvt` (PTX cvt.rna.tf32.f32, one
  instruction per element, the same bits: checked below);
- which operands are rounded: both (two graph inputs), or A only (B stored rounded by its writer);
- B's storage: [K, N] (N contiguous, as a graph input or today's X) or [N, K] (K-major, which
  Hopper's wgmma needs for 32-bit operands).
The MMA version Triton chose is read from each kernel's TTGIR.

    PYTHONPATH=. python3 scripts/tf32_round_probe.py [--out probe.json]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gemm_probe import CHAIN_SHAPES  # noqa: E402  (label, M, K, N)

from tessera.runtime.profile import profile_callable  # noqa: E402


@triton.jit
def _round(x, HOW: tl.constexpr):
    if HOW == 1:  # tessera's TF32_ROUND
        x = tl.where(tl.abs(x) < float("inf"),
                     ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True), x)
    elif HOW == 2:
        x = tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x.to(tl.int32, bitcast=True)],
                                      dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)
    return x


@triton.jit
def gemm(a, b, c, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, RA: tl.constexpr, RB: tl.constexpr,
         BT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    pm, pn = pid // (N // BN), pid % (N // BN)
    om, on, ok = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        x = _round(tl.load(a + om[:, None] * K + (k0 + ok)[None, :]), RA)
        if BT:  # B stored [N, K]
            y = tl.load(b + on[None, :] * K + (k0 + ok)[:, None])
        else:
            y = tl.load(b + (k0 + ok)[:, None] * N + on[None, :])
        acc = tl.dot(x, _round(y, RB), acc, input_precision="tf32")
    tl.store(c + om[:, None] * N + on[None, :], acc)


TILES = ((32, 32, 64, 4, 3), (32, 32, 32, 4, 3), (64, 32, 32, 4, 3), (32, 64, 32, 4, 3))
# (name, round A, round B, B stored [N, K])
VARIANTS = (("none", 0, 0, 0), ("bits both", 1, 1, 0), ("cvt both", 2, 2, 0), ("bits A", 1, 0, 0),
            ("cvt A", 2, 0, 0), ("none, B K-major", 0, 0, 1), ("bits A, B K-major", 1, 0, 1),
            ("cvt A, B K-major", 2, 0, 1), ("cvt both, B K-major", 2, 2, 1))


def launch(a, b, c, v, tile):
    m, k = a.shape
    n = c.shape[1]
    bm, bn, bk, warps, stages = tile
    return gemm[((m // bm) * (n // bn),)](a, b, c, M=m, N=n, K=k, RA=v[1], RB=v[2], BT=v[3], BM=bm, BN=bn, BK=bk,
                                          STAGES=stages, num_warps=warps)


def mma_version(kernel) -> str:
    found = re.search(r"versionMajor\s*=\s*(\d)", kernel.asm.get("ttgir", ""))
    return f"v{found.group(1)}" if found else "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    gen = torch.Generator(device="cpu").manual_seed(40)
    rows = []
    for label, m, k, n in CHAIN_SHAPES:
        a = torch.randn(m, k, generator=gen).cuda()
        b = torch.randn(k, n, generator=gen).cuda()
        bt = b.t().contiguous()
        c = torch.empty(m, n, device="cuda")
        ref = None
        for v in VARIANTS:
            best = (math.inf, None, "?")
            for tile in TILES:
                if m % tile[0] or n % tile[1] or k % tile[2]:
                    continue
                operand = bt if v[3] else b
                try:
                    kernel = launch(a, operand, c, v, tile)
                    us = profile_callable(lambda: launch(a, operand, c, v, tile), reps=args.reps,
                                          source="probe").total_us
                except OutOfResources:
                    continue
                if v[1] and v[2] and not v[3] and tile == TILES[0]:  # same tile and MMA: bits and cvt agree bit for bit
                    if ref is None:
                        ref = c.clone()
                    elif not torch.equal(ref, c):
                        raise SystemExit(f"{label}: {v[0]} differs from bits both by {(ref - c).abs().max():.3e}")
                best = min(best, (us, tile, mma_version(kernel)), key=lambda r: r[0])
            rows.append({"product": label, "variant": v[0], "us": best[0], "tile": best[1], "mma": best[2]})
            print(label, v[0], f"{best[0]:.2f}", best[1], best[2], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    names = [v[0] for v in VARIANTS]
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; fp32 operands, "
          f"tf32 dot; GPU µs per call (profiler kernel sum, {args.reps} calls), best of {len(TILES)} tiles; MMA version")
    print("| product | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for label, *_ in CHAIN_SHAPES:
        cells = [next(r for r in rows if r["product"] == label and r["variant"] == nm) for nm in names]
        print(f"| {label} | " + " | ".join(f"{r['us']:.2f} ({r['mma']})" for r in cells) + " |")


if __name__ == "__main__":
    main()
