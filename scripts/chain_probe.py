"""Probe a chain kernel's variants on the GPU (issue 15): the generated attention kernel against edits
of its source, and SDPA, under CUDA-graph timing.

Variant `direct-k`: the transposed K operand loaded in its storage type straight into the dot
(the generated kernel upcasts it to fp32 and back, a round trip that stands between the load and
the tensor cores); `direct-k+mul`: also the scale's division as a product with its reciprocal.
The probe tells whether the generator should emit those forms.

    python scripts/chain_probe.py [--case attn_s2] [--precision fp16]
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton.testing

from tessera.codegen.chain import generate_chain
from tessera.codegen.kernels import ChainSchedule
from tessera.compiler import CompileOptions, compile_model
from tessera.runtime.torch_prims import TORCH_DTYPES
from tessera.zoo import build, make, sdpa_form

SCHEDULES = [ChainSchedule(64, 64, 128, 64, 8, 3), ChainSchedule(64, 64, 128, 64, 4, 3),
             ChainSchedule(128, 64, 64, 64, 4, 3), ChainSchedule(128, 64, 64, 64, 8, 3),
             ChainSchedule(128, 64, 128, 64, 8, 2), ChainSchedule(64, 64, 64, 64, 4, 4)]


def direct_k(src: str) -> str:
    """Loads upcast to fp32 only to be narrowed back for a dot: load them as stored."""
    pat = re.compile(r"(\w+) = (tl\.load\([^\n]*\))\.to\(tl\.float32\)\n(\s+)(\w+) = \(\1\)\.to\(tl\.float16\)")
    return pat.sub(lambda m: f"{m.group(1)} = {m.group(2)}\n{m.group(3)}{m.group(4)} = {m.group(1)}", src)


def times_reciprocal(src: str) -> str:
    """A division by a scalar loaded before the walk as a product with its reciprocal."""
    scalars = set(re.findall(r"(v\d+) = tl\.load\(in\d+ \+ 0\)", src))
    return re.sub(r" / (v\d+)\n", lambda m: f" * (1.0 / {m.group(1)})\n" if m.group(1) in scalars else m.group(0), src)


def load(src: str, fn: str):
    path = Path(tempfile.mkdtemp()) / f"{fn}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(fn, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="attn_s2")
    ap.add_argument("--precision", default="fp16")
    a = ap.parse_args()
    r = compile_model(build(a.case, Path(tempfile.mkdtemp())),
                      CompileOptions(cost="analytical", templates="force", precision=a.precision, io="precision",
                                     solver="highs"))
    (k,) = [k for k in r.kernels if isinstance(getattr(k.triton, "schedule", None), ChainSchedule)]
    g = r.graph
    torch.manual_seed(0)
    env = {t: (torch.from_numpy(g.constants[t]) if t in g.constants else torch.randn(g.types[t].shape))
           .to("cuda", TORCH_DTYPES[g.types[t].dtype]) for t in k.triton.inputs}
    rows = []
    ref = None
    for s in SCHEDULES:
        ks = generate_chain(g, k.nodes, k.outputs, "k_probe", s, (), a.precision)
        (launch,) = ks.launches
        meta = dict(launch.meta)
        for name, src in (("generated", ks.source), ("direct-k", direct_k(ks.source)),
                          ("direct-k+mul", times_reciprocal(direct_k(ks.source)))):
            fn = load(src, launch.fn)
            outs = [torch.empty(g.types[t].shape, device="cuda", dtype=TORCH_DTYPES[g.types[t].dtype])
                    for t in ks.outputs]
            args = [env[t] for t in ks.inputs] + outs
            try:
                fn[launch.grid](*args, **meta)
                torch.cuda.synchronize()
                us = triton.testing.do_bench_cudagraph(lambda: fn[launch.grid](*args, **meta)) * 1e3
            except Exception as e:  # a schedule Triton refuses
                rows.append((str(s), name, float("nan"), f"{type(e).__name__}"))
                continue
            ref = outs[0].float() if ref is None else ref
            err = ((outs[0].float() - ref).norm() / ref.norm()).item()
            rows.append((str(s), name, us, f"vs first {err:.1e}" + ("" if src != ks.source or name == "generated"
                                                                    else " (no edit)")))
    module, _ = make(a.case)
    sd = sdpa_form(module)
    if sd is not None:
        dt = TORCH_DTYPES[g.types[k.triton.inputs[0]].dtype]
        q, kk, v = (torch.randn(x.shape, device="cuda", dtype=dt) for x in make(a.case)[1])
        us = triton.testing.do_bench_cudagraph(lambda: sd(q, kk, v)) * 1e3
        rows.append(("SDPA", "torch", us, ""))
    for s, name, us, note in rows:
        print(f"{s:<70}{name:<11}{us:8.2f} µs  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
