"""How much of a small Triton GEMM's GPU time is fixed cost (issue 15's GEMM chains, fp16).

Times, as the bench's GPU mode does (the profiler's kernel sum per call; `runtime.profile.profile_callable`),
kernels that do less and less of one G7-sized GEMM's work: an empty kernel, a tile store, a tile
load and store, one K step of a 64x32 tile (G7's `a @ x`: 512x128 @ 128x128, 32 programs) and four
K steps (G7's `b @ d`: 128x512 @ 512x128, 8 programs); cuBLAS's calls for the same two products beside.

    PYTHONPATH=. python3 scripts/floor_probe.py          # on the GPU machine
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tessera.runtime.profile import profile_callable


@triton.jit
def empty(x):
    pass


@triton.jit
def store_tile(c, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    pm, pn = tl.program_id(0) // (N // BN), tl.program_id(0) % (N // BN)
    om, on = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN)
    tl.store(c + om[:, None] * N + on[None, :], tl.zeros([BM, BN], dtype=tl.float16))


@triton.jit
def gemm(a, b, c, N: tl.constexpr, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
         DOT: tl.constexpr):
    """c = a @ b over a grid of BMxBN tiles; DOT=False loads the operands and stores their first
    columns' sum instead (the loads without the tensor-core work)."""
    pm, pn = tl.program_id(0) // (N // BN), tl.program_id(0) % (N // BN)
    om, on, ok = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=3):
        x = tl.load(a + om[:, None] * K + (k0 + ok)[None, :])
        y = tl.load(b + (k0 + ok)[:, None] * N + on[None, :])
        if DOT:
            acc = tl.dot(x, y, acc)
        else:
            acc += tl.sum(x.to(tl.float32), axis=1)[:, None] + tl.sum(y.to(tl.float32), axis=0)[None, :]
    tl.store(c + om[:, None] * N + on[None, :], acc.to(tl.float16))


def main() -> None:
    dev = "cuda"
    rows = []

    def time(name: str, fn) -> None:
        p = profile_callable(fn, reps=200, device=dev, source=name)
        rows.append((name, p.total_us, len(p.kernels)))

    x = torch.empty(1, device=dev)
    for grid in (8, 32, 132):
        time(f"empty kernel, {grid} programs", lambda g=grid: empty[(g,)](x))
    for m, k, n in ((512, 128, 128), (128, 512, 128)):
        a = torch.randn(m, k, device=dev, dtype=torch.float16)
        b = torch.randn(k, n, device=dev, dtype=torch.float16)
        c = torch.empty(m, n, device=dev, dtype=torch.float16)
        grid = (m // 64) * (n // 32)
        tag = f"{m}x{k} @ {k}x{n}, {grid} programs of 64x32"
        time(f"store a tile: {tag}", lambda: store_tile[(grid,)](c, N=n, BM=64, BN=32, num_warps=4))
        time(f"loads, no dot, K step 128: {tag}",
             lambda: gemm[(grid,)](a, b, c, N=n, K=k, BM=64, BN=32, BK=128, DOT=False, num_warps=4))
        time(f"GEMM, K step 128: {tag}",
             lambda: gemm[(grid,)](a, b, c, N=n, K=k, BM=64, BN=32, BK=128, DOT=True, num_warps=4))
        torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
        time(f"cuBLAS torch.mm: {m}x{k} @ {k}x{n}", lambda: torch.mm(a, b, out=c))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| kernel | GPU µs per call | kernels |\n| --- | ---: | ---: |")
    for name, us, n in rows:
        print(f"| {name} | {us:.2f} | {n} |")


if __name__ == "__main__":
    main()
