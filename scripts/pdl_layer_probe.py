"""Probe: does programmatic dependent launch (PDL) with a weight prefetch shorten a decoder's replay?

In llama fp16 (session 59, H100) four small-M GEMMs a layer take 239 of the 321 µs a call: each streams a
1-6 MB weight from DRAM at 15-30% of its bandwidth, most of its time spent starting up and waiting on memory.
Session 38's PDL probe (`pdl_probe.py`) chained two GEMMs of issue 15 whose operands fit in L2 and judged by
the kernel sum, which PDL cannot lower. Here the measure is the replay's wall time, which is what a model's
call costs, over a chain of kernels shaped like llama's layers (hidden 768, 128 tokens, 12 layers, weights
151 MB, more than L2):

    rmsnorm -> qkv (768 -> 1280) -> mix (attention's stand-in) -> o_proj (+ residual) -> rmsnorm
            -> gate_up (768 -> 4096) -> down (2048 -> 768, + residual)

Variants, every kernel the same code under constexpr flags:

- `plain`: launched as tessera launches today;
- `pdl`: launched with PDL, each kernel lets the next one launch at its start
  (`griddepcontrol.launch_dependents`) and waits (`griddepcontrol.wait`) before it touches memory;
- `prefetch`: as `pdl`, and each GEMM program first asks L2 for its slice of the weight (`prefetch.global.L2`),
  which no kernel writes, so it may be read before the wait: the weight streams while the kernel before runs;
- `pdl_late`: as `pdl`, but a GEMM lets the next kernel launch only after its K loop.

Every variant's output is compared with `plain`'s (the same arithmetic, so bit for bit) and `plain`'s with
torch. Times are CUDA-graph replays (µs per call, best of 5 timings of `--calls` replays).

    python scripts/pdl_layer_probe.py [--calls 20] [--layers 12]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from reassoc_probe import graph_us  # (the script's folder is on sys.path)

M, H, QKV, FF = 128, 768, 1280, 2048
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs `plain` under TRITON_INTERPRET=1 (a check)
VARIANTS = {"plain": (False, False, False), "pdl": (True, False, False), "prefetch": (True, True, False),
            "pdl_late": (True, False, True)}  # name: (PDL, PREFETCH, LATE)


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the lines at `ptrs`; the value returned is a dummy (the asm is kept as impure)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def rmsnorm(x, w, y, H: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    cols = tl.arange(0, 1024)
    mask = cols < H
    v = tl.load(x + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(v * v, axis=0) / H + 1e-6)
    g = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + row * H + cols, (v * r * g).to(tl.float16), mask=mask)


@triton.jit
def mix(x, y, H: tl.constexpr, LDX: tl.constexpr, PDL: tl.constexpr):
    """Attention's stand-in: q * sigmoid(k) over the first H columns, one row a program."""
    row = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    cols = tl.arange(0, 1024)
    mask = cols < H
    q = tl.load(x + row * LDX + cols, mask=mask, other=0.0).to(tl.float32)
    k = tl.load(x + row * LDX + 256 + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + row * H + cols, (q * tl.sigmoid(k)).to(tl.float16), mask=mask)


@triton.jit
def gemm(a, w, res, out, LDA: tl.constexpr, K: tl.constexpr, N: tl.constexpr, RES: tl.constexpr,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
         PDL: tl.constexpr, PREFETCH: tl.constexpr, LATE: tl.constexpr):
    """out[M, N] = a[M, K] @ w[K, N] (+ res): w row-major, a with row stride LDA."""
    pid = tl.program_id(0)
    pid_m = pid // (N // BN)
    pid_n = pid % (N // BN)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if PDL:
        if not LATE:
            gdc_launch_dependents()
        if PREFETCH:  # the weight is a constant: no kernel writes it, so it may be read before the wait
            for k0 in range(0, K, 256):
                _prefetch_l2(w + (k0 + tl.arange(0, 256)) * N + pid_n * BN)
        gdc_wait()
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        at = tl.load(a + rm[:, None] * LDA + (k0 + rk)[None, :])
        wt = tl.load(w + (k0 + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(at, wt, acc)
    if PDL and LATE:
        gdc_launch_dependents()
    if RES:
        acc += tl.load(res + rm[:, None] * N + rn[None, :]).to(tl.float32)
    tl.store(out + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


class Model:
    """The layers' weights and every activation buffer (none reused, so no kernel overwrites what another reads)."""

    def __init__(self, layers: int) -> None:
        g = torch.Generator(device=DEV).manual_seed(0)

        def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, device=DEV, generator=g) * scale).half()

        self.x = rand(M, H)
        self.layers = []
        for _ in range(layers):
            self.layers.append(dict(
                n1=rand(H, scale=0.1) + 1, n2=rand(H, scale=0.1) + 1,
                wqkv=rand(H, QKV, scale=H ** -0.5), wo=rand(H, H, scale=H ** -0.5),
                wgu=rand(H, 2 * FF, scale=H ** -0.5), wd=rand(FF, H, scale=FF ** -0.5),
                h1=torch.empty(M, H, device=DEV, dtype=torch.half),
                qkv=torch.empty(M, QKV, device=DEV, dtype=torch.half),
                att=torch.empty(M, H, device=DEV, dtype=torch.half),
                r1=torch.empty(M, H, device=DEV, dtype=torch.half),
                h2=torch.empty(M, H, device=DEV, dtype=torch.half),
                gu=torch.empty(M, 2 * FF, device=DEV, dtype=torch.half),
                r2=torch.empty(M, H, device=DEV, dtype=torch.half)))

    def run(self, variant: str) -> torch.Tensor:
        pdl, pre, late = VARIANTS[variant]
        flags = dict(PDL=pdl, PREFETCH=pre, LATE=late, launch_pdl=pdl)
        x = self.x
        for p in self.layers:
            rmsnorm[(M,)](x, p["n1"], p["h1"], H=H, PDL=pdl, num_warps=4, launch_pdl=pdl)
            gemm[(2 * QKV // 64,)](p["h1"], p["wqkv"], p["h1"], p["qkv"], LDA=H, K=H, N=QKV, RES=False,
                                   BM=64, BN=64, BK=128, num_warps=4, num_stages=5, **flags)
            mix[(M,)](p["qkv"], p["att"], H=H, LDX=QKV, PDL=pdl, num_warps=4, launch_pdl=pdl)
            gemm[(2 * H // 32,)](p["att"], p["wo"], x, p["r1"], LDA=H, K=H, N=H, RES=True,
                                 BM=64, BN=32, BK=128, num_warps=4, num_stages=5, **flags)
            rmsnorm[(M,)](p["r1"], p["n2"], p["h2"], H=H, PDL=pdl, num_warps=4, launch_pdl=pdl)
            gemm[(2 * 2 * FF // 64,)](p["h2"], p["wgu"], p["h2"], p["gu"], LDA=H, K=H, N=2 * FF, RES=False,
                                      BM=64, BN=64, BK=128, num_warps=4, num_stages=5, **flags)
            gemm[(2 * H // 32,)](p["gu"], p["wd"], p["r1"], p["r2"], LDA=2 * FF, K=FF, N=H, RES=True,
                                 BM=64, BN=32, BK=128, num_warps=4, num_stages=5, **flags)
            x = p["r2"]
        return x

    def reference(self) -> torch.Tensor:
        x = self.x.float()
        for p in self.layers:
            def norm(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half().float()
            qkv = (norm(x, p["n1"]) @ p["wqkv"].float()).half().float()
            att = (qkv[:, :H] * torch.sigmoid(qkv[:, 256:256 + H])).half().float()
            r1 = (att @ p["wo"].float() + x).half().float()
            gu = (norm(r1, p["n2"]) @ p["wgu"].float()).half().float()
            x = (gu[:, :FF] @ p["wd"].float() + r1).half().float()
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="timings of each variant, interleaved")
    args = parser.parse_args()
    model = Model(args.layers)
    want = model.reference()
    base = model.run("plain").float().clone()
    err = ((base - want).norm() / want.norm()).item()
    print(f"plain vs torch: rel L2 {err:.2e}")
    for v in VARIANTS:
        same = torch.equal(model.run(v).float(), base)
        print(f"{v:9} output equal to plain's: {same}")
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for v in VARIANTS:
            times[v].append(graph_us(lambda v=v: model.run(v), args.calls))
    plain = min(times["plain"])
    print(f"\n{'variant':9} {'us/call':>8} {'vs plain':>9}  all")
    for v, ts in times.items():
        print(f"{v:9} {min(ts):8.1f} {min(ts) / plain:9.3f}  " + " ".join(f"{t:.1f}" for t in ts))


if __name__ == "__main__":
    main()
