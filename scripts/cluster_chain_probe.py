"""Device probe (issue 15): the regrouped GEMM chains G4, G5 and G7-G10 in fp16 as ONE kernel of Hopper
thread-block clusters that share the intermediate X = b @ d through distributed shared memory
(`scripts/cluster_chain_probe.cu` says how), beside eager's two cuBLAS calls (issue 15's yardstick,
target 0.67) and eager's regrouped pair a @ (b @ d).

Each configuration (C CTAs per cluster, RM rows of out per CTA, LB columns of X per cluster) is checked against float64 on fresh
random inputs (fp16's tolerance, 1e-2) and timed as the bench's GPU mode times: the profiler's kernel
sum over `--reps` calls (`tessera.runtime.profile.profile_callable`). The same kernel also runs with
stages left out (the launch alone, the staging, phase 1 alone, all but phase 2), so a loss can be placed,
and with phase 2 reading X from the peers' shared memory instead of gathering it first.

    PYTHONPATH=. python3 scripts/cluster_chain_probe.py [--cases 7,8,9,10,4,5] [--reps 50]
    PYTHONPATH=. python3 scripts/cluster_chain_probe.py --emulate   # the kernel's index math in numpy, CPU

Needs a Hopper GPU and nvcc (built with torch.utils.cpp_extension.load for sm_90a, about a minute).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from reassoc_probe import SHAPES  # noqa: E402  (batch, M, K, N, L)

from tessera.runtime.profile import profile_callable  # noqa: E402
from tessera.tolerance import TOLERANCE  # noqa: E402

# (C, RM, N / C, K, LB): the configurations the .cu file builds (its CONFIGS).
BUILT = ((8, 64, 64, 128, 128), (8, 32, 64, 128, 128), (16, 32, 32, 128, 128), (16, 16, 32, 128, 128),
         (8, 64, 128, 128, 128), (8, 32, 128, 128, 128), (16, 32, 64, 128, 128), (16, 16, 64, 128, 128),
         (8, 64, 64, 256, 64), (8, 32, 64, 256, 32), (16, 32, 32, 256, 64),
         (16, 32, 32, 512, 32), (8, 32, 64, 512, 32))


def emulate(c: int, rm: int, ns: int, kx: int, lb: int, m: int, n: int, l_: int, rng: np.random.Generator) -> float:
    """The .cu kernel's steps for every CTA in numpy, with its index formulas and padded strides (not its
    CUDA): rel L2 of out against float64. A wrong offset or slice shows as an error far over fp16's."""
    a, b, d = (rng.standard_normal(s).astype(np.float16) for s in ((m, kx), (kx, n), (n, l_)))
    out = np.zeros((m, l_), np.float16)
    rows, tn = kx // c, lb // 16
    row_clusters = m // (c * rm)

    def product(x: np.ndarray, y: np.ndarray, tiles: int, depth: int) -> np.ndarray:  # warp_product + store
        per_warp = -(-tiles // 8)
        z = np.zeros((x.shape[0], lb + 4), np.float32)
        for tile in range(min(tiles, 8 * per_warp)):
            tr, tc = tile // tn, tile % tn
            z[tr * 16:tr * 16 + 16, tc * 16:tc * 16 + 16] = \
                x[tr * 16:tr * 16 + 16, :depth].astype(np.float32) @ y[:depth, tc * 16:tc * 16 + 16].astype(np.float32)
        return z

    for cid in range((l_ // lb) * (m // rm) // c):
        col0 = (cid // row_clusters) * lb
        ctas = []
        for r in range(c):
            row0 = (cid % row_clusters) * (c * rm) + r * rm
            sb, sd = b[:, r * ns:r * ns + ns], d[r * ns:r * ns + ns, col0:col0 + lb]
            ctas.append({"row0": row0, "P": product(sb, sd, (kx // 16) * tn, ns), "A": a[row0:row0 + rm],
                         "X": np.zeros((kx, lb), np.float16)})
        for r, cta in enumerate(ctas):  # the partials summed in rank order, rounded
            for i in range(rows * lb // 4):
                row, col = r * rows + (i * 4) // lb, (i * 4) % lb
                acc = np.zeros(4, np.float32)
                for q in range(c):
                    acc += ctas[q]["P"][row, col:col + 4]
                cta["X"][row, col:col + 4] = acc.astype(np.float16)
        for r, cta in enumerate(ctas):  # the peers' rows of X
            for i in range((c - 1) * rows * (lb // 8)):
                q, rr, col = (r + 1 + i // (rows * (lb // 8))) % c, (i // (lb // 8)) % rows, (i % (lb // 8)) * 8
                cta["X"][q * rows + rr, col:col + 8] = ctas[q]["X"][q * rows + rr, col:col + 8]
        for cta in ctas:
            p = product(cta["A"], cta["X"], (rm // 16) * tn, kx)
            out[cta["row0"]:cta["row0"] + rm, col0:col0 + lb] = p[:rm, :lb].astype(np.float16)
    ref = a.astype(np.float64) @ (b.astype(np.float64) @ d.astype(np.float64))
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def check_emulated(cases: list[int]) -> None:
    rng = np.random.default_rng(15)
    for case in cases:
        _, m, k, n, l_ = SHAPES[case]
        for c, rm, ns, kx, lb in BUILT:
            if kx == k and ns * c == n and not m % (c * rm) and not l_ % lb:
                err = emulate(c, rm, ns, kx, lb, m, n, l_, rng)
                print(f"gemm_g{case} C={c} RM={rm} LB={lb}: rel L2 {err:.1e}")
                assert err < TOLERANCE["fp16"], (case, c, rm, lb, err)


def build():
    from torch.utils.cpp_extension import load
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")  # Hopper: clusters and distributed shared memory need sm_90
    src = Path(__file__).with_suffix(".cu")
    return load(name="cluster_chain_probe", sources=[str(src)], extra_cuda_cflags=["-O3"], verbose=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="7,8,9,10,4,5")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--emulate", action="store_true", help="check the kernel's index math in numpy (CPU)")
    args = ap.parse_args()
    if args.emulate:
        check_emulated([int(c) for c in args.cases.split(",")])
        return
    ext = build()
    us = lambda fn: profile_callable(fn, reps=args.reps, source="probe").total_us  # noqa: E731
    gen = torch.Generator(device="cpu").manual_seed(15)
    rows = []
    for case in (int(c) for c in args.cases.split(",")):
        _, m, k, n, l_ = SHAPES[case]
        a, b, d = [(torch.randn(*s, generator=gen) / s[0] ** 0.25).to("cuda", torch.float16)
                   for s in ((m, k), (k, n), (n, l_))]
        ref = a.double() @ (b.double() @ d.double())
        eager = us(lambda: (a @ b) @ d)
        regrouped = us(lambda: a @ (b @ d))
        stream = torch.cuda.current_stream().cuda_stream
        for c, rm, ns, kx, lb in BUILT:
            if kx != k or ns * c != n or m % (c * rm) or l_ % lb:
                continue
            out = torch.empty(m, l_, device="cuda", dtype=torch.float16)
            try:
                ext.chain(a, b, d, out, c, rm, lb, 0, stream)
                torch.cuda.synchronize()
            except RuntimeError as e:  # a launch the GPU refuses (cluster size, shared memory): say which
                print(f"gemm_g{case} C={c} RM={rm} LB={lb}: {e}", flush=True)
                continue
            err = ((out.double() - ref).norm() / ref.norm()).item()
            t = us(lambda: ext.chain(a, b, d, out, c, rm, lb, 0, stream))
            # the same kernel leaving stages out: phase 1 alone; all but phase 2 (and the store of out); the
            # launch alone; the launch and the staging of b and d
            p1, no2, launch, staged = (us(lambda s=s: ext.chain(a, b, d, out, c, rm, lb, s, stream))
                                       for s in (1, 2, 3, 4))
            direct = direct_err = float("nan")
            if (k // c) % 16 == 0:  # phase 2 reading X in the peers' shared memory (no gather)
                out.zero_()
                ext.chain(a, b, d, out, c, rm, lb, 5, stream)
                direct_err = ((out.double() - ref).norm() / ref.norm()).item()
                direct = us(lambda: ext.chain(a, b, d, out, c, rm, lb, 5, stream))
            err = max(err, direct_err) if direct_err == direct_err else err
            rows.append((f"gemm_g{case}", c, rm, lb, (l_ // lb) * (m // rm), t, direct, launch, staged, p1, no2,
                         eager, regrouped, err))
            print(*rows[-1], flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; fp16, GPU µs per call (profiler kernel sum, "
          f"{args.reps} calls); eager = (a @ b) @ d, two cuBLAS calls; target 0.67 of eager")
    print("| case | C | RM | LB | CTAs | cluster kernel µs | no gather µs | launch alone µs | launch + staging µs "
          "| phase 1 alone µs | all but phase 2 µs | eager µs | eager a @ (b @ d) µs | best / eager | rel L2 | check |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for case, c, rm, lb, ctas, t, direct, launch, staged, p1, no2, eager, regrouped, err in rows:
        ok = "PASS" if err < TOLERANCE["fp16"] else "FAIL"
        best = min(t, direct) if direct == direct else t
        print(f"| {case} | {c} | {rm} | {lb} | {ctas} | {t:.2f} | {direct:.2f} | {launch:.2f} | {staged:.2f} | "
              f"{p1:.2f} | {no2:.2f} | {eager:.2f} | {regrouped:.2f} | {best / eager:.2f} | {err:.1e} | {ok} |")


if __name__ == "__main__":
    main()
