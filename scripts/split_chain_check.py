"""GPU check of split-L chain kernels (issue 15): correctness, run-to-run bits, and CUDA-graph time.

For each GEMM-chain case and precision, the model's best schedule of each split (1, 2, 4, 8, 16)
is generated and launched on the GPU: its error against a float64 product, whether 50 replays
in one CUDA graph give the same bits each time (the arrival counters reset, the last program sums
the slices in a fixed order), and its time under `triton.testing.do_bench_cudagraph` beside
eager's two library calls in the same precision. A race in the split's hand-off would show as
a wrong or a changing result.

    python scripts/split_chain_check.py [--cases gemm_g1,gemm_g4] [--precisions fp16,tf32] [--out F.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import onnx
import torch
import triton.testing

from tessera.codegen.launch import TritonKernel
from tessera.codegen.select import implement, prologue_of
from tessera.cost.chain_search import chain_search
from tessera.fission import fission
from tessera.frontend import load
from tessera.orchestrate import build_ograph
from tessera.rewrite import convert_precision
from tessera.runtime.buffers import round_tf32
from tessera.tolerance import TOLERANCE
from tessera.zoo import build

CASES = [f"gemm_g{i}" for i in range(1, 13)]


def check(case: str, precision: str, tmp: Path) -> list[dict[str, object]]:
    g = convert_precision(fission(load(onnx.load(build(case, tmp))).graph).graph, precision, "precision")
    og = build_ograph(g)
    prims = list(og.nodes)
    nodes = prologue_of(og, prims) + prims
    outputs = list(g.outputs)
    found = chain_search(g, nodes, outputs, precision)
    picks = {}
    for s in sorted(found.predicted, key=found.predicted.__getitem__):
        picks.setdefault(s.split_l, s)
    dt = torch.float16 if precision == "fp16" else torch.float32
    gen = torch.Generator().manual_seed(0)
    feeds = [torch.rand(g.types[n].shape, generator=gen, dtype=torch.float64) * 2 - 1 for n in g.inputs]
    a, b, d = feeds
    ref = (a @ b) @ d
    dev = [x.to("cuda", dt) for x in feeds]
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    eager_ms = triton.testing.do_bench_cudagraph(lambda: (dev[0] @ dev[1]) @ dev[2], rep=200)
    rows = []
    for split, s in sorted(picks.items()):
        ks = implement(g, nodes, [], outputs, f"k_{case}", (), s, precision).triton
        kernel = TritonKernel(ks)
        by_name = dict(zip(g.inputs, dev))
        args = [round_tf32(by_name[t]) if t in ks.rounded_inputs else by_name[t] for t in ks.inputs]
        out = torch.empty(ref.shape, dtype=dt, device="cuda")
        kernel(*args, out)
        torch.cuda.synchronize()
        first = out.clone()
        err = float(torch.linalg.norm(first.double().cpu() - ref) / torch.linalg.norm(ref))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(50):
                kernel(*args, out)
        same = True
        for _ in range(4):
            graph.replay()
            torch.cuda.synchronize()
            same = same and torch.equal(out, first)
        ms = triton.testing.do_bench_cudagraph(lambda: kernel(*args, out), rep=200)
        rows.append({"case": case, "precision": precision, "split_l": split, "schedule": s.to_json(),
                     "predicted_us": found.predicted[s] * 1e6, "us": ms * 1e3, "eager_us": eager_ms * 1e3,
                     "rel_l2": err, "passed": err < TOLERANCE[precision], "same_bits": same})
        print(json.dumps(rows[-1]), flush=True)  # a call cut short keeps what it measured
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for case in a.cases.split(","):
        for p in a.precisions.split(","):
            try:
                rows += check(case, p, tmp)
            except Exception as e:  # report and go on: one case's failure must not hide the others
                rows.append({"case": case, "precision": p, "error": f"{type(e).__name__}: {e}"})
                print(f"{case} {p}: {rows[-1]['error']}", file=sys.stderr)
    if a.out:
        Path(a.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"{'case':10} {'prec':5} {'split':>5} {'us':>7} {'eager':>7} {'ratio':>6} {'pred':>7} {'relL2':>8} ok bits")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:10} {r['precision']:5} ERROR {r['error'][:80]}")
            continue
        print(f"{r['case']:10} {r['precision']:5} {r['split_l']:5d} {r['us']:7.2f} {r['eager_us']:7.2f} "
              f"{r['us'] / r['eager_us']:6.2f} {r['predicted_us']:7.2f} {r['rel_l2']:8.1e} "
              f"{'y' if r['passed'] else 'N'}  {'y' if r['same_bits'] else 'N'}")
    return 0 if all(r.get("passed") and r.get("same_bits") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
