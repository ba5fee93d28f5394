"""Device probe: the convolutions of ResNet-50 (and a few of Inception-v3) as templates over a wide
schedule sweep, against cuDNN, timed as tuning times them; data to fit the convolution ranking.

Why. Convolution templates are ranked by the old roofline (`predict_template` over the implicit
GEMM), never fitted to measurements; session 23 found ResNet-50's last-stage 3x3 convolutions in
tf32 choosing 64x64 tiles split 8 at 15 us where their weights stream in ~3 us. This probe times
every schedule of the tuning's own space (`codegen/conv.py::conv_schedules`) and a wider sweep
(tile, K step, stages, split-K) per convolution, so a model can be fitted and its ranking checked,
and so we learn how far the own space is from the best of the sweep.

How. Each (shape, precision) is the conv + bias + ReLU kernel with channels-last activations (the
layout tessera's plans give convolutions). Every schedule is a `Job` measured by the tuning's own
`GpuProfiler` (built on all cores, timed in a CUDA graph with the weight rotated over copies
larger than L2, as in a model). The library job (no schedule) is cuDNN with its epilogue kernel.

    PYTHONPATH=. python scripts/conv_sweep_probe.py --out probe.json [--precisions fp16,tf32] [--shapes l4,stem]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("TESSERA_TEST_DEVICE", "cuda")
sys.path.insert(0, "tests")
from test_conv_template import conv_kernel, conv_relu  # noqa: E402
from gemm_probe import save, time_sweep  # noqa: E402 - the GEMM probe's measuring and saving

from tessera.codegen.conv import conv_problem, conv_schedules  # noqa: E402
from tessera.codegen.kernels import ConvSchedule  # noqa: E402
from tessera.codegen.tile import cdiv  # noqa: E402
from tessera.cost.db import Key  # noqa: E402
from tessera.cost.measured import Job  # noqa: E402
from tessera.cost.profiler import GpuProfiler  # noqa: E402
from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.ir.graph import TensorType  # noqa: E402
from tessera.orchestrate.layout import NHWC  # noqa: E402
from tessera.rewrite import convert_precision  # noqa: E402

# (label, c, h, w, o, (kh, kw), stride, (pad h, pad w)) at batch 1: torchvision's ResNet-50 (v1.5,
# stride on the 3x3) at 224, every distinct convolution, and Inception-v3's factorised ones at 299.
SHAPES = [
    ("stem 3->64 7x7 s2", 3, 224, 224, 64, (7, 7), 2, (3, 3)),
    ("l1 64->64 1x1", 64, 56, 56, 64, (1, 1), 1, (0, 0)),
    ("l1 64->64 3x3", 64, 56, 56, 64, (3, 3), 1, (1, 1)),
    ("l1 64->256 1x1", 64, 56, 56, 256, (1, 1), 1, (0, 0)),
    ("l1 256->64 1x1", 256, 56, 56, 64, (1, 1), 1, (0, 0)),
    ("l2 256->128 1x1", 256, 56, 56, 128, (1, 1), 1, (0, 0)),
    ("l2 128->128 3x3 s2", 128, 56, 56, 128, (3, 3), 2, (1, 1)),
    ("l2 128->512 1x1", 128, 28, 28, 512, (1, 1), 1, (0, 0)),
    ("l2 256->512 1x1 s2", 256, 56, 56, 512, (1, 1), 2, (0, 0)),
    ("l2 512->128 1x1", 512, 28, 28, 128, (1, 1), 1, (0, 0)),
    ("l2 128->128 3x3", 128, 28, 28, 128, (3, 3), 1, (1, 1)),
    ("l3 512->256 1x1", 512, 28, 28, 256, (1, 1), 1, (0, 0)),
    ("l3 256->256 3x3 s2", 256, 28, 28, 256, (3, 3), 2, (1, 1)),
    ("l3 256->1024 1x1", 256, 14, 14, 1024, (1, 1), 1, (0, 0)),
    ("l3 512->1024 1x1 s2", 512, 28, 28, 1024, (1, 1), 2, (0, 0)),
    ("l3 1024->256 1x1", 1024, 14, 14, 256, (1, 1), 1, (0, 0)),
    ("l3 256->256 3x3", 256, 14, 14, 256, (3, 3), 1, (1, 1)),
    ("l4 1024->512 1x1", 1024, 14, 14, 512, (1, 1), 1, (0, 0)),
    ("l4 512->512 3x3 s2", 512, 14, 14, 512, (3, 3), 2, (1, 1)),
    ("l4 512->2048 1x1", 512, 7, 7, 2048, (1, 1), 1, (0, 0)),
    ("l4 1024->2048 1x1 s2", 1024, 14, 14, 2048, (1, 1), 2, (0, 0)),
    ("l4 2048->512 1x1", 2048, 7, 7, 512, (1, 1), 1, (0, 0)),
    ("l4 512->512 3x3", 512, 7, 7, 512, (3, 3), 1, (1, 1)),
    ("inc 192->192 1x7", 192, 17, 17, 192, (1, 7), 1, (0, 3)),
    ("inc 160->192 7x1", 160, 17, 17, 192, (7, 1), 1, (3, 0)),
    ("inc 288->384 3x3 s2", 288, 35, 35, 384, (3, 3), 2, (0, 0)),
    ("inc 2048->448 1x1", 2048, 8, 8, 448, (1, 1), 1, (0, 0)),
    ("inc 448->384 3x3", 448, 8, 8, 384, (3, 3), 1, (1, 1)),
]
SMS = 132


def sweep(space: list[ConvSchedule], steps_of, m: int, og: int, itemsize: int) -> list[ConvSchedule]:
    """The tuning's own space, then a wider sweep: a grid of tiles, two K steps, two pipeline
    depths, split-K up to 16 (at least two K steps per slice, at most 4 programs per SM)."""
    out = list(space)
    for bm in (32, 64, 128):
        for bn in (32, 64, 128):
            if bm > max(32, 2 ** math.ceil(math.log2(m))) or bn > max(32, 2 ** math.ceil(math.log2(og))):
                continue
            for bk in (64, 128) if itemsize == 2 else (32, 64):
                steps = steps_of(bk)
                tiles = cdiv(m, bm) * cdiv(og, bn)
                for stages in (3, 4):
                    for split in (1, 2, 4, 8, 16):
                        chunk = cdiv(steps, split)
                        if split > 1 and (chunk < 2 or cdiv(steps, chunk) < split or tiles * split > 4 * SMS):
                            continue
                        warps = 8 if bm * bn >= 128 * 128 else 4
                        out.append(ConvSchedule(bm, bn, bk, warps, min(stages, max(2, chunk)),
                                                8 if cdiv(m, bm) > 1 and cdiv(og, bn) > 1 else 1, split))
    return list(dict.fromkeys(out))


def conv_jobs(label: str, c: int, h: int, w: int, o: int, k: tuple[int, int], stride: int, pad: tuple[int, int],
              precision: str) -> tuple[list[Job], list[ConvSchedule], set, dict]:
    model, _ = conv_relu(1, c, h, w, o, k, seed=1, strides=[stride, stride], pads=[pad[0], pad[1], pad[0], pad[1]])
    g = convert_precision(fission(load(model).graph).graph, precision)
    for t, ty in list(g.types.items()):  # every activation channels-last, as in a plan
        if ty.rank == 4 and t not in g.constants:
            g.types[t] = TensorType(ty.shape, ty.dtype, NHWC)
    prims, pro, outputs = conv_kernel(g)
    p = conv_problem(g, prims[0])
    itemsize = 2 if precision in ("fp16", "bf16") else 4
    own = conv_schedules(p, itemsize, SMS)
    scheds = sweep(own, p.steps, p.m, p.og, itemsize)
    jobs = [Job(Key("probe", "probe", label, str(s)), g, tuple(prims), tuple(pro), tuple(outputs), s, precision)
            for s in [None, *scheds]]
    problem = {"m": p.m, "og": p.og, "k": p.k, "c": c, "kh": k[0], "kw": k[1], "stride": stride,
               "weight_bytes": o * c * k[0] * k[1] * itemsize}
    return jobs, scheds, set(own), problem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape labels (default: all)")
    args = ap.parse_args()
    prof = GpuProfiler()
    rows, t0 = [], time.time()
    try:
        for precision in args.precisions.split(","):
            for label, *shape in SHAPES:
                if args.shapes and not any(s in label for s in args.shapes.split(",")):
                    continue
                jobs, scheds, own, problem = conv_jobs(label, *shape, precision)
                lib, entries, ok, own_ok = time_sweep(prof, jobs, scheds, own)
                rows.append({"shape": label, "precision": precision, **problem, "library_us": lib,
                             "best": ok[:8], "best_own": own_ok[:3], "all": entries})
                b, bo = ok[0] if ok else None, own_ok[0] if own_ok else None
                print(f"{label:22s} {precision:5s} cuDNN {lib:6.2f} us | weight read "
                      f"{problem['weight_bytes'] / 3.35e6:5.2f} | best sweep {b['us'] if b else math.nan:6.2f} "
                      f"{tuple(b['schedule'].values())[1:] if b else ''} | best own "
                      f"{bo['us'] if bo else math.nan:6.2f} | {len(ok)}/{len(entries)} built, "
                      f"{len(own_ok)} own", flush=True)
                save(args.out, rows, t0)  # after each row: a timed-out run keeps what it measured
    finally:
        prof.close()


if __name__ == "__main__":
    main()
