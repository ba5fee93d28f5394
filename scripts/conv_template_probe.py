"""Device probe: convolution templates alone against cuDNN, GPU time per call.

For each convolution (conv + bias + ReLU, the shape of a network's layer), storage layout (NCHW,
NHWC) and precision (tf32, fp16), it generates the template under the schedule model's top
`--top` schedules, checks each against a float64 reference, and times it and cuDNN (torch's
conv2d in the same memory format, bias and ReLU after it) from CUDA graphs of 20 calls.

Findings of 2026-11-23 (H100, Triton 3.6; `scripts/results/conv_probe/`): addressing a 'same'
convolution's pixels as one linear index (so Triton's analysis sees them contiguous) changed no
template's time by more than noise, and was not kept.

    PYTHONPATH=. python scripts/conv_template_probe.py --out probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TESSERA_TEST_DEVICE", "cuda")  # else the test helpers pick Triton's interpreter
sys.path.insert(0, "tests")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from test_conv_template import NCHW, conv_kernel, conv_relu  # noqa: E402
from test_gemm_template import template_launch  # noqa: E402

from tessera.codegen.select import implement  # noqa: E402
from tessera.cost.schedule_model import rank_templates  # noqa: E402
from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.ir import interp  # noqa: E402
from tessera.ir.graph import TensorType  # noqa: E402
from tessera.orchestrate.layout import NHWC  # noqa: E402
from tessera.rewrite import convert_precision  # noqa: E402
from tessera.runtime.buffers import inverse_perm  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2  # noqa: E402

# (label, x [n, c, h, w], out channels, kernel, attrs): candy's distinct convolutions (its padding
# is a separate ReflectionPad, so each is 'valid'), and 'same' ones from ResNet-50 and a
# candy-like last layer with the padding inside the conv.
CASES = [
    ("candy 3->32 9x9", (1, 3, 232, 232), 32, (9, 9), {}),
    ("candy 32->64 3x3 s2", (1, 32, 226, 226), 64, (3, 3), {"strides": [2, 2]}),
    ("candy 64->128 3x3 s2", (1, 64, 114, 114), 128, (3, 3), {"strides": [2, 2]}),
    ("candy 128->128 3x3", (1, 128, 58, 58), 128, (3, 3), {}),
    ("candy 128->64 3x3", (1, 128, 114, 114), 64, (3, 3), {}),
    ("candy 64->32 3x3", (1, 64, 226, 226), 32, (3, 3), {}),
    ("candy 32->3 9x9", (1, 32, 232, 232), 3, (9, 9), {}),
    ("same 32->3 9x9", (1, 32, 224, 224), 3, (9, 9), {"pads": [4, 4, 4, 4]}),
    ("resnet 64->64 3x3 same", (1, 64, 56, 56), 64, (3, 3), {"pads": [1, 1, 1, 1]}),
    ("resnet 256->256 3x3 same", (1, 256, 14, 14), 256, (3, 3), {"pads": [1, 1, 1, 1]}),
]


def gpu_us(fn, calls: int = 20, reps: int = 10) -> float:
    """GPU time of one fn() call: a CUDA graph of `calls` calls, replayed `reps` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return float(np.median(times))


def cudnn_us(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict, layout, precision: str) -> float:
    dt = torch.float16 if precision == "fp16" else torch.float32
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    fmt = torch.channels_last if layout else torch.contiguous_format
    xt = torch.from_numpy(x).cuda().to(dt).contiguous(memory_format=fmt)
    wt = torch.from_numpy(w).cuda().to(dt).contiguous(memory_format=fmt)
    bt = torch.from_numpy(b).cuda().to(dt)
    pads = attrs.get("pads", [0, 0, 0, 0])
    kw = dict(stride=tuple(attrs.get("strides", [1, 1])), padding=(pads[0], pads[1]))
    return gpu_us(lambda: torch.relu(torch.nn.functional.conv2d(xt, wt, bt, **kw)))


def probe(label, shape, o, k, attrs, layout, precision: str, top: int) -> dict:
    n, c, h, w = shape
    model, feeds = conv_relu(n, c, h, w, o, k, seed=1, **attrs)
    g32 = fission(load(model).graph).graph
    g = convert_precision(g32, precision)
    if layout:  # every activation (the casts of an fp16 graph too) stored channels-last
        for t, ty in list(g.types.items()):
            if ty.rank == 4 and t not in g.constants:
                g.types[t] = TensorType(ty.shape, ty.dtype, layout)
    prims, pro, outputs = conv_kernel(g)
    ref = interp.run(g32, feeds, exact=True)[g32.outputs[0]]
    env = {**g.constants, **interp.run(g, feeds, keep_all=True)}
    row = {"case": label, "x": list(shape), "o": o, "k": list(k), "attrs": attrs,
           "layout": "nhwc" if layout else "nchw", "precision": precision,
           "cudnn_us": cudnn_us(feeds["x"], g32.constants["w"], g32.constants["b"], attrs, layout, precision),
           "templates": []}
    for sched in rank_templates(g, pro + prims, outputs, precision)[:top]:
        entry = {"schedule": str(sched)}
        try:
            ks = implement(g, prims, pro, outputs, "k0_probe", ("Conv_0",), sched, precision).triton
            kern, args, outs = template_launch(g, ks, env)
            kern(*args, *outs)
            lay = g.types[ks.outputs[0]].layout
            got = outs[0].float().cpu().numpy()
            got = got.transpose(inverse_perm(lay)) if lay else got
            entry["rel_l2"] = rel_l2(got, ref)
            entry["us"] = gpu_us(lambda: kern(*args, *outs))
        except Exception as e:  # a schedule Triton cannot compile is a result too
            entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["templates"].append(entry)
    ok = [t for t in row["templates"] if "us" in t and t["rel_l2"] < TOLERANCE[precision]]
    row["best_template_us"] = min((t["us"] for t in ok), default=None)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--precisions", default="tf32,fp16")
    ap.add_argument("--cases", default="", help="comma-separated substrings of case labels (default: all)")
    ap.add_argument("--layouts", default="nchw,nhwc")
    args = ap.parse_args()
    rows = []
    t0 = time.time()
    for label, shape, o, k, attrs in CASES:
        if args.cases and not any(s in label for s in args.cases.split(",")):
            continue
        for precision in args.precisions.split(","):
            for layout in [{"nchw": NCHW, "nhwc": NHWC}[s] for s in args.layouts.split(",")]:
                r = probe(label, shape, o, k, attrs, layout, precision, args.top)
                rows.append(r)
                best = r["best_template_us"]
                print(f"{label:26s} {precision:5s} {r['layout']}: cuDNN {r['cudnn_us']:7.1f} us, "
                      f"best template {best if best is None else round(best, 1)} us  "
                      + " ".join(f"[{t['schedule'][13:60]} {t.get('us', t.get('error', ''))!s:.6} "
                                 f"{t.get('rel_l2', '')!s:.7}]" for t in r["templates"]), flush=True)
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,  # after each row:
                           "date": time.strftime("%Y-%m-%d"), "seconds": time.time() - t0, "rows": rows},  # a
                          open(args.out, "w"), indent=1)  # timed-out run keeps what it measured


if __name__ == "__main__":
    main()
