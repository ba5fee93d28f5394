"""Device probe: what cuDNN does with a convolution per storage layout, padding and algorithm choice.

For each convolution it times torch's conv2d (GPU time from a CUDA graph of 20 calls, as
`conv_template_probe.py` does) stored NCHW, NHWC, and NHWC with the output (and input) channels
zero-padded to 4, 8 and 16, with `cudnn.benchmark` off (cuDNN's heuristics: what tessera's runtime
and torch's default use) and on (cuDNN times its algorithms at the first call). It lists the CUDA
kernels each variant runs, so cuDNN's own NCHW<->NHWC conversions show.

Why: candy's last convolution (32 -> 3 channels, 9x9) runs NCHW in tessera's tf32 plan, and
cuDNN converts its input, weight and output around an NHWC kernel on every call (2.3% of the
model's GPU time, issue 12).

    PYTHONPATH=. python scripts/cudnn_layout_probe.py --out probe.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, "scripts")
from conv_template_probe import gpu_us  # noqa: E402

# (label, x [n, c, h, w], out channels, kernel, padding)
CASES = [
    ("candy 32->3 9x9", (1, 32, 232, 232), 3, (9, 9), 0),
    ("candy 3->32 9x9", (1, 3, 232, 232), 32, (9, 9), 0),
    ("resnet 3->64 7x7 s2", (1, 3, 230, 230), 64, (7, 7), 0),
]


def kernels(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:90] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def variant(x: torch.Tensor, w: torch.Tensor, pad_to: int, channels_last: bool):
    """The operands as the variant stores them: channels padded with zeros up to a multiple of
    `pad_to` (1: unpadded)."""
    o, c = w.shape[:2]
    op, cp = -(-o // pad_to) * pad_to, -(-c // pad_to) * pad_to
    xp = F.pad(x, (0, 0, 0, 0, 0, cp - c))
    wp = F.pad(w, (0, 0, 0, 0, 0, cp - c, 0, op - o))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return xp.contiguous(memory_format=fmt), wp.contiguous(memory_format=fmt)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--precisions", default="tf32,fp16")
    args = ap.parse_args()
    rows = []
    for label, xs, o, k, pad in CASES:
        for prec in args.precisions.split(","):
            dt = torch.float16 if prec == "fp16" else torch.float32
            torch.backends.cudnn.allow_tf32 = prec == "tf32"
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(xs, device="cuda", generator=g).to(dt)
            w = torch.randn((o, xs[1], *k), device="cuda", generator=g).to(dt) * 0.05
            for name, pad_to, cl in [("nchw", 1, False), ("nhwc", 1, True), ("nhwc pad4", 4, True),
                                     ("nhwc pad8", 8, True), ("nhwc pad16", 16, True)]:
                xv, wv = variant(x, w, pad_to, cl)
                for bench in (False, True):
                    torch.backends.cudnn.benchmark = bench
                    fn = lambda: F.conv2d(xv, wv, None, 1, pad)  # noqa: E731
                    t0 = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    first_ms = (time.perf_counter() - t0) * 1e3
                    us = gpu_us(fn)
                    row = {"case": label, "precision": prec, "variant": name, "cudnn_benchmark": bench,
                           "us": round(us, 2), "first_call_ms": round(first_ms, 1), "kernels": kernels(fn)}
                    rows.append(row)
                    print(f"{label:22s} {prec:5s} {name:11s} bench={int(bench)} {us:8.2f} us  "
                          f"first {first_ms:7.1f} ms  {len(row['kernels'])} kernels", flush=True)
    torch.backends.cudnn.benchmark = False
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d")}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
