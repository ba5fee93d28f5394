"""Probe matmul associativity for the GEMM chains of issue 15 (GPU time, CUDA-graph replay).

(A·B)·D costs M·N·(K+L) multiply-adds, A·(B·D) costs K·L·(M+N). For MCFuser's G4-G12 the right
grouping is 4-8x cheaper; this times both groupings as eager cuBLAS calls so the rewrite's worth
is known before the rewrite search is asked to find it.

    python scripts/reassoc_probe.py [--cases 1,4,...] [--calls 200]
"""
from __future__ import annotations

import argparse

import torch

SHAPES = {  # (batch, M, K, N, L): a is M×K, b is K×N, d is N×L (../shared/models/gemm_g*.onnx)
    1: (1, 512, 64, 256, 64), 4: (1, 512, 256, 512, 256), 5: (1, 512, 512, 512, 256),
    6: (1, 512, 1024, 512, 256), 7: (1, 512, 128, 512, 128), 8: (1, 1024, 128, 512, 128),
    9: (1, 2048, 128, 512, 128), 10: (1, 1024, 128, 1024, 128), 11: (4, 1024, 128, 1024, 128),
    12: (8, 1024, 128, 1024, 128),
}


def graph_us(fn, calls: int) -> float:
    """Mean µs per call of `calls` replays captured in one CUDA graph (no launch gaps counted twice)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default=",".join(map(str, SHAPES)))
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print(f"{'case':8} {'prec':5} {'(AB)D us':>9} {'A(BD) us':>9} {'ratio':>6} {'MAC ratio':>9} {'rel err':>8}")
    for prec in ("fp16", "tf32"):
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        dtype = torch.float16 if prec == "fp16" else torch.float32
        for case in map(int, args.cases.split(",")):
            bs, m, k, n, l = SHAPES[case]
            a, b, d = (torch.randn(bs, *s, device="cuda", dtype=dtype) / s[0] ** 0.25
                       for s in ((m, k), (k, n), (n, l)))
            left = graph_us(lambda: torch.matmul(torch.matmul(a, b), d), args.calls)
            right = graph_us(lambda: torch.matmul(a, torch.matmul(b, d)), args.calls)
            ref = torch.matmul(torch.matmul(a.double(), b.double()), d.double())
            err = ((torch.matmul(a, torch.matmul(b, d)).double() - ref).abs().max() / ref.abs().max()).item()
            macs = (m * n * (k + l)) / (k * l * (m + n))
            print(f"gemm_g{case:<3} {prec:5} {left:9.2f} {right:9.2f} {right / left:6.2f} {macs:9.1f} {err:8.1e}")


if __name__ == "__main__":
    main()
