"""How much cuDNN's algorithm choice costs: every distinct convolution of the zoo's convolution
networks, timed alone on the GPU with cuDNN's heuristic choice and with its measured choice
(`torch.backends.cudnn.benchmark`), stored NCHW and channels-last, in fp16 and tf32.

Each convolution runs 10 times inside one CUDA graph, replayed after warm-up; the time is the median
replay over 10 calls (GPU time, no launch gaps). Prints a per-model table last; `--out` saves JSON.

    python scripts/cudnn_probe.py --models candy,resnet50 --out probe.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tessera import zoo  # noqa: E402

CALLS, REPLAYS = 10, 10


def conv_shapes(name: str) -> list[dict]:
    """Distinct (input shape, conv parameters) of every Conv2d that runs in zoo model `name`."""
    model, args = zoo.make(name)
    seen: dict[tuple, dict] = {}

    def hook(m: torch.nn.Conv2d, inp: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        key = (tuple(inp[0].shape), tuple(m.weight.shape), m.stride, m.padding, m.dilation, m.groups)
        if isinstance(m.padding, str):
            return
        row = seen.setdefault(key, {"x": list(inp[0].shape), "w": list(m.weight.shape), "stride": list(m.stride),
                                    "padding": list(m.padding), "dilation": list(m.dilation), "groups": m.groups,
                                    "count": 0})
        row["count"] += 1

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    return list(seen.values())


def time_conv(c: dict, dtype: torch.dtype, channels_last: bool, benchmark: bool, out_channels: int = 0) -> float:
    """GPU µs per call of one convolution, replayed from a CUDA graph (`out_channels`: the weight
    padded to that many output channels)."""
    torch.backends.cudnn.benchmark = benchmark
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(c["x"], device="cuda", dtype=dtype).to(memory_format=fmt)
    w = (torch.randn([max(out_channels, c["w"][0]), *c["w"][1:]], device="cuda", dtype=dtype) * 0.05)
    w = w.to(memory_format=fmt)

    def call() -> torch.Tensor:
        return F.conv2d(x, w, None, c["stride"], c["padding"], c["dilation"], c["groups"])

    for _ in range(3):  # the first call runs cuDNN's search when benchmark is on
        call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
        with torch.cuda.graph(g, stream=s):
            for _ in range(CALLS):
                call()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return statistics.median(times)


VARIANTS = (("nchw", False, False), ("nchw+bench", False, True), ("nhwc", True, False), ("nhwc+bench", True, True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="candy,resnet50,inception_v3,mobilenet_v2")
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--pad-out", default="",
                    help="comma-separated output-channel counts: convolutions with fewer output channels are also "
                         "timed channels-last with their weight zero-padded to each")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    rows, table = [], []
    t0 = time.time()
    for name in args.models.split(","):
        convs = conv_shapes(name)
        for prec in args.precisions.split(","):
            dtype = torch.float16 if prec == "fp16" else torch.float32
            torch.backends.cudnn.allow_tf32 = prec == "tf32"
            totals = dict.fromkeys((v for v, _, _ in VARIANTS), 0.0)
            for c in convs:
                row = {"model": name, "precision": prec, **c}
                for v, cl, bench in VARIANTS:
                    row[v] = time_conv(c, dtype, cl, bench)
                    totals[v] += row[v] * c["count"]
                for k in (int(p) for p in args.pad_out.split(",") if p):
                    if c["w"][0] < k and c["groups"] == 1:
                        row[f"nhwc cout{k}"] = time_conv(c, dtype, True, False, k)
                        print(f"  {name} {prec} x{c['x']} w{c['w']}: nchw {row['nchw']:.1f} nhwc {row['nhwc']:.1f} "
                              f"nhwc with {k} outputs {row[f'nhwc cout{k}']:.1f} µs", flush=True)
                rows.append(row)
            table.append((name, prec, len(convs), totals))
            print(f"{name} {prec}: {len(convs)} convs, {time.time() - t0:.0f} s", flush=True)
    torch.backends.cudnn.benchmark = False
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    print("\nGPU µs per model call, summed over its convolutions (each timed alone):")
    print("| model | precision | distinct convs | " + " | ".join(v for v, _, _ in VARIANTS) + " |")
    print("| --- | --- | ---: |" + " ---: |" * len(VARIANTS))
    for name, prec, n, totals in table:
        print(f"| {name} | {prec} | {n} | " + " | ".join(f"{totals[v]:.1f}" for v, _, _ in VARIANTS) + " |")


if __name__ == "__main__":
    main()
