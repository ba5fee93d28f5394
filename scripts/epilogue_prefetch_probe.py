"""Probe: do a GEMM template's epilogue loads cost a memory latency after the K loop, and does loading them
before the loop win it back?

tessera's GEMM templates load what their epilogue reads (a residual tile, rotary's cos and sin tables) after
the K loop, where the loads wait on memory with nothing left to overlap. In llama fp16 on the H100 (session
59) the QKV template with both rotations ran 5.73 µs against 3.91 for the bare product at the same tile. This
times one Triton GEMM at llama's shapes and tessera's chosen tiles in three forms:

- `none`: no epilogue operand (the floor);
- `after`: `acc * e1 + e2` with e1 and e2 loaded after the K loop (tessera's code today);
- `before`: the same with e1 and e2 loaded before the K loop (held in registers across it).

e1 and e2 are a residual-like [M, N] pair, or a cos/sin-like [M, d] table read at each column's place in its
head (`--table`). Weights and epilogue operands rotate over copies larger than L2, as they come from DRAM in a
model; times are CUDA-graph replays (µs per call). Each form is checked against torch first.

    python scripts/epilogue_prefetch_probe.py [--calls 48]
    TRITON_INTERPRET=1 python scripts/epilogue_prefetch_probe.py --check   # correctness only, small shapes
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

if "--check" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read at import

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from reassoc_probe import graph_us  # noqa: E402  (the script's folder is on sys.path)

FORMS = {"none": 0, "after": 1, "before": 2}
# (name, M, K, N, table head width or 0, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): llama's projections at
# the tiles tessera's H100 plans chose (session 59, call 3)
CASES = [("qkv_rotary", 128, 768, 1280, 64, 64, 64, 128, 4, 5),
         ("qkv_rotary_n32", 128, 768, 1280, 64, 64, 32, 128, 4, 5),
         ("o_proj_residual", 128, 768, 768, 0, 64, 32, 128, 4, 5),
         ("down_residual", 128, 2048, 768, 0, 64, 32, 128, 4, 5)]
CHECK_CASES = [("check_table", 32, 64, 96, 16, 16, 32, 32, 2, 2), ("check_residual", 32, 64, 64, 0, 16, 16, 32, 2, 2)]
L2_BYTES = 50 * 2**20


@triton.jit
def gemm_epilogue(a, w, e1, e2, out, N: tl.constexpr, K: tl.constexpr, D: tl.constexpr, FORM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    pid_m = pid // (N // BLOCK_N)
    pid_n = pid % (N // BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    if D > 0:  # a [M, D] table at each column's place in its head
        eo = rm * D + rn % D
    else:  # an [M, N] tensor
        eo = rm * N + rn
    if FORM == 2:
        x1 = tl.load(e1 + eo)
        x2 = tl.load(e2 + eo)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        at = tl.load(a + rm * K + (k + tl.arange(0, BLOCK_K))[None, :])
        wt = tl.load(w + (k + tl.arange(0, BLOCK_K))[:, None] * N + rn)
        acc = tl.dot(at, wt, acc)
    if FORM == 1:
        x1 = tl.load(e1 + eo)
        x2 = tl.load(e2 + eo)
    if FORM > 0:
        acc = acc * x1.to(tl.float32) + x2.to(tl.float32)
    tl.store(out + rm * N + rn, acc.to(tl.float16))


def run_case(case: tuple, calls: int, check_only: bool, device: str) -> dict[str, float]:
    name, m, k, n, d, bm, bn, bk, warps, stages = case
    g = torch.Generator(device="cpu").manual_seed(0)
    ecols = d or n
    one = (2 * (k * n + 2 * m * ecols))  # bytes a call reads beside A
    copies = 1 if check_only else max(2, -(-2 * L2_BYTES // one))
    a = torch.randn(m, k, generator=g).half().to(device)
    ws = [(torch.randn(k, n, generator=g) / k ** 0.5).half().to(device) for _ in range(copies)]
    e1s = [torch.randn(m, ecols, generator=g).half().to(device) for _ in range(copies)]
    e2s = [torch.randn(m, ecols, generator=g).half().to(device) for _ in range(copies)]
    out = torch.empty(m, n, dtype=torch.float16, device=device)
    grid = ((m // bm) * (n // bn),)
    times = {}
    for form, code in FORMS.items():
        def call(i: int = 0, code: int = code) -> None:
            gemm_epilogue[grid](a, ws[i % copies], e1s[i % copies], e2s[i % copies], out, n, k, d, code,
                                bm, bn, bk, num_warps=warps, num_stages=stages)
        call()
        want = a.float() @ ws[0].float()
        if code:
            idx = torch.arange(n, device=device) % d if d else torch.arange(n, device=device)
            want = want * e1s[0].float()[:, idx] + e2s[0].float()[:, idx]
        err = ((out.float() - want).norm() / want.norm()).item()
        if err > 2e-2:
            raise SystemExit(f"{name} {form}: rel L2 {err:.3g} against torch")
        if check_only:
            times[form] = err
            continue
        times[form] = replay_us(call, calls, copies)
    return times


def replay_us(call, calls: int, copies: int) -> float:
    """Mean µs per call over CUDA-graph replays (`reassoc_probe.graph_us`) of launches that cycle through
    the operand copies, one copy a launch."""
    count = iter(range(10**9))
    return graph_us(lambda: call(next(count) % copies), calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=48)
    ap.add_argument("--check", action="store_true", help="correctness only, small shapes (the CPU interpreter)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = CHECK_CASES if args.check else CASES
    if not args.check:
        print(f"{torch.cuda.get_device_name()}; triton {triton.__version__}; µs per call, operands rotated past L2")
    print(f"{'case':18s} " + " ".join(f"{f:>8s}" for f in FORMS) + ("  (rel L2)" if args.check else "  before/after"))
    for case in cases:
        t = run_case(case, args.calls, args.check, device)
        tail = "" if args.check else f"  {t['before'] / t['after']:.3f}"
        print(f"{case[0]:18s} " + " ".join(f"{t[f]:8.3g}" for f in FORMS) + tail)


if __name__ == "__main__":
    main()
