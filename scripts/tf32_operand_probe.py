"""Device probe: what bounds the small-M tf32 GEMMs of BERT-base and GPT-2 (M = 128 tokens)?

Why. In tf32 the transformer rows miss issue 14's profile target: the templates' GEMMs run only
4-7% under cuBLAS (session 26), at 6-12 µs for weights of 2.4-9.4 MB. Two causes are possible:
- the weight operand's layout. The ONNX export stores a Linear's weight as [K, N] (N contiguous).
  Hopper's wgmma takes 32-bit (tf32) operands only K-major, so Triton may fall back to the older
  mma.sync path for such a B;
- the bytes. A tf32 weight is twice an fp16 one.

Each variant below times `x [M, K] @ w + b` (fp32 x, fp32 out, tf32 dot, fp32 accumulation) with
one plain Triton kernel over a small schedule sweep, the weight rotated over copies larger than L2:
- `kn32`: w stored [K, N] fp32 (what tessera's templates read today);
- `nk32`: w stored [N, K] fp32 (K-major), read through strides;
- `kn16`, `nk16`: w stored in fp16, widened to fp32 in registers before the tf32 dot. tf32 keeps
  10 mantissa bits, as fp16 does, so a weight inside fp16's normal range reaches the MMA unchanged
  up to rounding mode;
- `nk32r`: as `nk32`, with the activation rounded to tf32 in the K loop as tessera's templates round it
  (`codegen/tile.py` TF32_ROUND; session 29: what that costs, since rounding feeds the MMA from
  registers, not from shared memory);
(a split-K schedule zeroes y first and adds its slices atomically,
so it carries one memset) beside cuBLAS (`torch.addmm`, tf32) and, for scale, the fp16 GEMM. It also records which MMA
version Triton chose for each variant (from the kernel's TTGIR).

    PYTHONPATH=. python scripts/tf32_operand_probe.py --out probe.json
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, "scripts")
from conv_template_probe import gpu_us  # noqa: E402 - the same CUDA-graph timer

SHAPES = [("qkv 768->2304", 128, 768, 2304), ("attn out 768->768", 128, 768, 768),
          ("mlp up 768->3072", 128, 768, 3072), ("mlp down 3072->768", 128, 3072, 768)]
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


@triton.jit
def linear(x, w, b, y, M, N, K, sxm, sxk, swk, swn, CHUNK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
           BK: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr):
    """y = x @ w + b over one [BM, BN] tile; with SPLIT > 1, this program's K slice is added
    into y (zeroed first, the bias added by slice 0)."""
    pid = tl.program_id(0)
    pk = tl.program_id(1)
    tn = tl.cdiv(N, BN)
    rm = (pid // tn) * BM + tl.arange(0, BM)
    rn = (pid % tn) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(pk * CHUNK, min(pk * CHUNK + CHUNK, K), BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x + rm[:, None] * sxm + rk[None, :] * sxk, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        bw = tl.load(w + rk[:, None] * swk + rn[None, :] * swn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        if PREC == "tf32r":  # round to nearest, as tessera's TF32_ROUND
            a = tl.where(tl.abs(a) < float("inf"),
                         ((a.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True), a)
        if PREC == "ieee16":
            acc = tl.dot(a.to(tl.float16), bw.to(tl.float16), acc)
        else:
            acc = tl.dot(a, bw.to(tl.float32), acc, input_precision="tf32")
    bias = tl.load(b + rn, mask=rn < N, other=0.0) * (pk == 0).to(tl.float32)
    out = acc + bias[None, :]
    ptrs = y + rm[:, None] * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        tl.store(ptrs, out, mask=mask)
    else:
        tl.atomic_add(ptrs, out, mask=mask, sem="relaxed")


def schedules(m: int, n: int, k: int) -> list[tuple[int, int, int, int, int, int]]:
    """Tiles near session 21's tf32 winners (small rows, split-K), 3 stages, 4 warps."""
    out = []
    for bm, bn, bk in ((16, 128, 32), (16, 64, 64), (16, 32, 64), (32, 32, 64), (32, 64, 32), (32, 64, 64),
                       (64, 64, 32), (64, 32, 64)):
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
        for split in (1, 2, 4, 8):
            chunk = math.ceil(math.ceil(k / split) / bk) * bk
            if (split > 1 and math.ceil(k / chunk) < split) or tiles * split > 4 * SMS:
                continue
            out.append((bm, bn, bk, 4, 3, split))
    return out


def variant_us(m: int, k: int, n: int, kind: str, sched) -> tuple[float, str]:
    bm, bn, bk, warps, stages, split = sched
    wdt = torch.float16 if kind.endswith("16") else torch.float32
    copies = max(2, math.ceil((128 << 20) / (k * n * wdt.itemsize)))
    x = torch.randn(m, k, device="cuda")
    b = torch.randn(n, device="cuda")
    y = torch.empty(m, n, device="cuda")
    if kind.startswith("nk"):  # [N, K] storage, read as [K, N] through strides
        ws = [torch.randn(n, k, device="cuda").to(wdt) for _ in range(copies)]
        strides = (1, k)
    else:
        ws = [torch.randn(k, n, device="cuda").to(wdt) for _ in range(copies)]
        strides = (n, 1)
    chunk = math.ceil(math.ceil(k / split) / bk) * bk
    grid = (math.ceil(m / bm) * math.ceil(n / bn), split)
    prec = "ieee16" if kind == "fp16" else "tf32r" if kind.endswith("r") else "tf32"
    turn = [0]

    def call():
        w = ws[turn[0] % copies]
        turn[0] += 1
        if split > 1:
            y.zero_()
        return linear[grid](x, w, b, y, m, n, k, x.stride(0), x.stride(1), *strides, CHUNK=chunk, BM=bm, BN=bn,
                            BK=bk, SPLIT=split, PREC=prec, num_warps=warps, num_stages=stages)

    h = call()  # the first call reads ws[0]
    torch.cuda.synchronize()
    ref = torch.addmm(b.double(), x.double(), ws[0].double().T if kind.startswith("nk") else ws[0].double())
    err = ((y.double() - ref.double()).norm() / ref.double().norm()).item()
    if err > 1e-2:
        raise RuntimeError(f"wrong result: rel L2 {err:.2e}")
    mma = re.search(r"versionMajor = (\d)", h.asm["ttgir"]) if h is not None else None
    return gpu_us(call, calls=2 * copies), f"mmav{mma.group(1) if mma else '?'}"


def cublas_us(m: int, k: int, n: int, dt: torch.dtype) -> float:
    torch.backends.cuda.matmul.allow_tf32 = True
    copies = max(2, math.ceil((128 << 20) / (k * n * dt.itemsize)))
    x, b = torch.randn(m, k, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
    ws = [torch.randn(k, n, device="cuda", dtype=dt) for _ in range(copies)]
    out = torch.empty(m, n, device="cuda", dtype=dt)
    turn = [0]

    def call():
        torch.addmm(b, x, ws[turn[0] % copies], out=out)
        turn[0] += 1

    return gpu_us(call, calls=2 * copies)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="kn32,nk32,kn16,nk16,fp16")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape labels (default: all)")
    args = ap.parse_args()
    rows, t0 = [], time.time()
    for label, m, k, n in SHAPES:
        if args.shapes and not any(x in label for x in args.shapes.split(",")):
            continue
        row = {"shape": label, "m": m, "k": k, "n": n, "cublas_tf32_us": cublas_us(m, k, n, torch.float32),
               "cublas_fp16_us": cublas_us(m, k, n, torch.float16), "variants": {}}
        for kind in args.kinds.split(","):
            timed = []
            for s in schedules(m, n, k):
                try:
                    us, mma = variant_us(m, k, n, kind, s)
                except Exception as e:  # noqa: BLE001 - a schedule that fails to build is skipped
                    timed.append({"schedule": s, "us": float("nan"), "error": str(e)[:200]})
                    continue
                timed.append({"schedule": s, "us": us, "mma": mma})
            ok = sorted((t for t in timed if math.isfinite(t["us"])), key=lambda t: t["us"])
            row["variants"][kind] = {"best": ok[:5], "built": len(ok), "tried": len(timed)}
            best = ok[0] if ok else {"us": float("nan"), "schedule": None, "mma": "-"}
            print(f"{label:20s} {kind:5s} best {best['us']:6.2f} us {best['schedule']} {best.get('mma')} "
                  f"({len(ok)}/{len(timed)} built)", flush=True)
        print(f"{label:20s} cuBLAS tf32 {row['cublas_tf32_us']:6.2f} us, fp16 {row['cublas_fp16_us']:6.2f} us",
              flush=True)
        rows.append(row)
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "date": time.strftime("%Y-%m-%d"), "seconds": time.time() - t0, "rows": rows},
                  open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
