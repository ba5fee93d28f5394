"""Device probe: the small-M linear layers of BERT-base and GPT-2 (M = 128 tokens) as GEMM templates
over a wide schedule sweep, against the library call, timed as tuning times them.

Why. In the fp16 transformer rows the linear kernels are what is left of issue 14's profile target:
the 128-row GEMMs take 4.7-6.9 us a call whether cuBLAS or a template runs them, several times the
time their weights need to stream from DRAM. This probe asks which schedules (tile, K step,
stages, split-K) come nearest that floor, and how far the tuning's own space
(`codegen/gemm.py::template_schedules`) is from the best of a wider sweep.

How. Each (shape, precision) is the matmul + bias kernel of `x [M, K] @ w [K, N] + b`. Every
schedule is a `Job` measured by the tuning's own `GpuProfiler` (built on all cores, timed in a
CUDA graph with the weight rotated over copies larger than L2, so it comes from DRAM as in a
model). The library job (no schedule) is cuBLAS with its bias epilogue. A weight-read floor is
timed beside them: one `torch.sum` over a cold copy of the weight.

    PYTHONPATH=. python scripts/gemm_probe.py --out probe.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

os.environ.setdefault("TESSERA_TEST_DEVICE", "cuda")
sys.path.insert(0, "tests")
import torch  # noqa: E402
from onnx import helper  # noqa: E402
from opcheck import Const, graph_model, rand  # noqa: E402
from test_gemm_template import matmul_kernel  # noqa: E402
from conv_template_probe import gpu_us  # noqa: E402 - the same CUDA-graph timer

from tessera.codegen.gemm import template_schedules  # noqa: E402
from tessera.codegen.kernels import GemmSchedule  # noqa: E402
from tessera.cost.db import Key  # noqa: E402
from tessera.cost.measured import Job  # noqa: E402
from tessera.cost.profiler import GpuProfiler  # noqa: E402
from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.rewrite import convert_precision  # noqa: E402

# (label, M, K, N): the linear layers of one BERT-base / GPT-2 layer at 128 tokens.
SHAPES = [
    ("qkv 768->2304", 128, 768, 2304),
    ("attn out 768->768", 128, 768, 768),
    ("mlp up 768->3072", 128, 768, 3072),
    ("mlp down 3072->768", 128, 3072, 768),
]
# (label, M, K, N): the two products of issue 15's GEMM chains G4-G10 in the other grouping
# (X = B·D, then A·X; `rewrite/rules/associative_matmul.py`), the rows still above 0.67 of eager.
CHAIN_SHAPES = [
    ("g4 b@d", 256, 512, 256), ("g4 a@x", 512, 256, 256), ("g5 b@d|a@x", 512, 512, 256),
    ("g6 b@d", 1024, 512, 256), ("g6 a@x", 512, 1024, 256), ("g7-9 b@d", 128, 512, 128),
    ("g7 a@x", 512, 128, 128), ("g8 a@x", 1024, 128, 128), ("g9 a@x", 2048, 128, 128), ("g10 b@d", 128, 1024, 128),
]
SETS = {"linear": SHAPES, "chains": CHAIN_SHAPES}
SMS = 132


def sweep(m: int, n: int, k: int, itemsize: int) -> list[GemmSchedule]:
    """The wide sweep: every tile of a small grid, two pipeline depths, split-K up to 16 (slices of
    at least one K step, at most 4 programs per SM), plus the tuning's own space."""
    out = list(template_schedules(1, m, n, k, itemsize))
    for bm in (16, 32, 64, 128):
        for bn in (32, 64, 128):
            for bk in (64, 128) if itemsize == 2 else (32, 64):
                for stages in (3, 5):
                    tiles = math.ceil(m / bm) * math.ceil(n / bn)
                    for split in (1, 2, 4, 8, 16):
                        chunk = math.ceil(math.ceil(k / split) / bk) * bk
                        if (split > 1 and math.ceil(k / chunk) < split) or tiles * split > 4 * SMS:
                            continue
                        for warps in (8,) if bm * bn >= 128 * 128 else (2, 4) if bm * bn <= 32 * 64 else (4,):
                            out.append(GemmSchedule(bm, bn, bk, warps, min(stages, max(2, chunk // bk)),
                                                    8 if math.ceil(m / bm) > 1 else 1, split))
    return list(dict.fromkeys(out))


def deep_sweep(m: int, n: int, k: int, itemsize: int) -> list[GemmSchedule]:
    """K steps of 256 and 512 two-byte elements (up to all of K in one step), one or two stages, no
    split: whether fewer, larger loads shorten a product whose few programs each walk a long K
    (the first product of G4-G10, 4-8 steps of 64-128 in the tuned plans). Tiles whose operands
    would pass 200 KB of shared memory are left out."""
    out = []
    for bm, bn, bk in itertools.product((16, 32, 64, 128), (32, 64, 128), (256, 512)):
        bk = min(bk, max(16, 1 << (k - 1).bit_length()))
        for stages in (1, 2):
            if (bm + bn) * bk * itemsize * stages > 200 << 10 or bk < 256:
                continue
            for warps in (4, 8):
                out.append(GemmSchedule(bm, bn, bk, warps, stages, 8 if math.ceil(m / bm) > 1 else 1, 1))
    return list(dict.fromkeys(out))


def linear_jobs(label: str, m: int, k: int, n: int, precision: str,
                deep: bool = False) -> tuple[list[Job], list[GemmSchedule], set]:
    x, w, b = rand(m, k, seed=1), rand(k, n, seed=2, lo=-0.5, hi=0.5), rand(n, seed=3)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["out"])],
                        {"x": x, "w": Const(w), "b": Const(b)}, ["out"])
    g = convert_precision(fission(load(model).graph).graph, precision)
    prims, pro, outputs = matmul_kernel(g)
    itemsize = 2 if precision in ("fp16", "bf16") else 4
    scheds = sweep(m, n, k, itemsize) + (deep_sweep(m, n, k, itemsize) if deep else [])
    own = set(template_schedules(1, m, n, k, itemsize))
    jobs = [Job(Key("probe", "probe", label, str(s)), g, tuple(prims), tuple(pro), tuple(outputs), s, precision)
            for s in [None, *scheds]]
    return jobs, scheds, own


def weight_floor_us(k: int, n: int, precision: str) -> float:
    """GPU time of one read of the weight from DRAM: torch.sum over copies rotated past the L2."""
    dt = torch.float16 if precision == "fp16" else torch.float32
    copies = max(2, math.ceil((96 << 20) / (k * n * (2 if dt == torch.float16 else 4))))
    ws = [torch.randn(k, n, device="cuda", dtype=dt) for _ in range(copies)]
    outs = [torch.empty((), device="cuda", dtype=torch.float32) for _ in range(copies)]
    turn = itertools.count()

    def one_sum() -> None:  # the next copy each call, so a graph of 2 x copies calls rotates past L2
        i = next(turn) % copies
        torch.sum(ws[i], dim=(0, 1), dtype=torch.float32, out=outs[i])

    return gpu_us(one_sum, calls=2 * copies)


def time_sweep(prof: GpuProfiler, jobs: list[Job], scheds: list, own: set) -> tuple[float, list, list, list]:
    """Measure jobs (the library call first, then one per schedule): the library's µs, every
    schedule's entry, those that ran fastest first, and those of the tuning's own space."""
    got: dict[int, tuple[float, str]] = {}
    prof.measure(jobs, lambda i, sec, why: got.__setitem__(i, (sec, why)))
    entries = [{"schedule": s.to_json(), "own_space": s in own, "us": got[i + 1][0] * 1e6, "error": got[i + 1][1]}
               for i, s in enumerate(scheds)]
    ok = sorted((e for e in entries if math.isfinite(e["us"])), key=lambda e: e["us"])
    return got[0][0] * 1e6, entries, ok, [e for e in ok if e["own_space"]]


def save(path: str, rows: list[dict], t0: float) -> None:
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "seconds": time.time() - t0, "rows": rows}, open(path, "w"), indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape labels (default: all)")
    ap.add_argument("--set", default="linear", choices=sorted(SETS), help="linear: BERT/GPT-2 layers; chains: G4-G10")
    ap.add_argument("--deep", action="store_true", help="also K steps of 256-512 with 1-2 stages (deep_sweep)")
    args = ap.parse_args()
    prof = GpuProfiler()
    rows, t0 = [], time.time()
    try:
        for precision in args.precisions.split(","):
            for label, m, k, n in SETS[args.set]:
                if args.shapes and not any(s in label for s in args.shapes.split(",")):
                    continue
                jobs, scheds, own = linear_jobs(label, m, k, n, precision, args.deep)
                lib, entries, ok, own_ok = time_sweep(prof, jobs, scheds, own)
                try:
                    floor = weight_floor_us(k, n, precision)
                except Exception as e:  # noqa: BLE001 - the GEMM rows matter more than the floor
                    print(f"weight floor failed: {e}", flush=True)
                    floor = float("nan")
                row = {"shape": label, "m": m, "k": k, "n": n, "precision": precision, "library_us": lib,
                       "weight_read_us": floor, "best": ok[:8], "best_own": own_ok[:3], "all": entries}
                rows.append(row)
                b, bo = ok[0] if ok else None, own_ok[0] if own_ok else None
                print(f"{label:20s} {precision:5s} cuBLAS {lib:6.2f} us | weight read {floor:5.2f} | "
                      f"best sweep {b['us'] if b else float('nan'):6.2f} {b['schedule'] if b else ''} | "
                      f"best own {bo['us'] if bo else float('nan'):6.2f} | {len(ok)}/{len(entries)} built",
                      flush=True)
                save(args.out, rows, t0)  # after each row: a timed-out run keeps what it measured
    finally:
        prof.close()


if __name__ == "__main__":
    main()
