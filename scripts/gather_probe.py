"""Where the time of segformer_b0's bilinear upsampling kernel goes (session 43): the W pass of a 2x
half-pixel resize, fp16 [256, 128, 64] -> [256, 128, 128], as tessera generates it (int64 index tables
with the wrap of negative indices), with 32-bit positions, with the indices and weights computed in
the kernel (no tables), and a plain gather-shaped copy (out[.., x] = in[.., x // 2]). GPU time per call
from CUDA-graph replays (`triton.testing.do_bench_cudagraph`), six schedules each (1 to 16 elements a
thread). Then tessera's generated kernels for the W pass, the H pass and both, at their flat
schedules (and tiled ones where the kernel has them: 963a5ba gave gathering kernels tiles, session 44
call 2, since reverted; from eeef598 the kernels compute their closed-form tables).

    python3 scripts/gather_probe.py [--generated]   (GPU machine; prints two tables, or the second)
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

R, W_IN, W_OUT = 256 * 128, 64, 128
N = R * W_OUT


@triton.jit
def gen(in0, in1, in2, in3, in4, out0, XBLOCK: tl.constexpr):  # tessera's source, as generated
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < 4194304
    i1 = xindex % 128
    v2 = tl.load(in3 + i1, mask=xmask, other=0)
    i3 = tl.where(v2 < 0, v2 + 64, v2)
    i4 = (xindex // 16384) * 8192 + (((xindex // 128) % 128) * 64 + i3)
    v5 = tl.load(in2 + i4, mask=xmask, other=0).to(tl.float32)
    v6 = tl.load(in0 + i1, mask=xmask, other=0).to(tl.float32)
    v8 = tl.load(in4 + i1, mask=xmask, other=0)
    i9 = tl.where(v8 < 0, v8 + 64, v8)
    i10 = (xindex // 16384) * 8192 + (((xindex // 128) % 128) * 64 + i9)
    v11 = tl.load(in2 + i10, mask=xmask, other=0).to(tl.float32)
    v12 = tl.load(in1 + i1, mask=xmask, other=0).to(tl.float32)
    tl.store(out0 + xindex, v5 * v6 + v11 * v12, mask=xmask)


@triton.jit
def i32(in0, in1, in2, in3, in4, out0, XBLOCK: tl.constexpr):  # 32-bit positions, no wrap
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < 4194304
    i1 = xindex % 128
    i3 = tl.load(in3 + i1, mask=xmask, other=0).to(tl.int32)
    row = (xindex // 128) * 64
    v5 = tl.load(in2 + row + i3, mask=xmask, other=0).to(tl.float32)
    v6 = tl.load(in0 + i1, mask=xmask, other=0).to(tl.float32)
    i9 = tl.load(in4 + i1, mask=xmask, other=0).to(tl.int32)
    v11 = tl.load(in2 + row + i9, mask=xmask, other=0).to(tl.float32)
    v12 = tl.load(in1 + i1, mask=xmask, other=0).to(tl.float32)
    tl.store(out0 + xindex, v5 * v6 + v11 * v12, mask=xmask)


@triton.jit
def arith(in0, in1, in2, in3, in4, out0, XBLOCK: tl.constexpr):  # no tables: half-pixel 2x in the kernel
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < 4194304
    x = xindex % 128
    s = tl.minimum(tl.maximum((x.to(tl.float32) + 0.5) * 0.5 - 0.5, 0.0), 63.0)
    lo = s.to(tl.int32)
    hi = tl.minimum(lo + 1, 63)
    w_hi = s - lo.to(tl.float32)
    row = (xindex // 128) * 64
    a = tl.load(in2 + row + lo, mask=xmask, other=0).to(tl.float32)
    b = tl.load(in2 + row + hi, mask=xmask, other=0).to(tl.float32)
    tl.store(out0 + xindex, a * (1.0 - w_hi) + b * w_hi, mask=xmask)


@triton.jit
def copy(in0, in1, in2, in3, in4, out0, XBLOCK: tl.constexpr):  # the access pattern alone
    pid = tl.program_id(0)
    xindex = pid * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < 4194304
    v = tl.load(in2 + (xindex // 128) * 64 + (xindex % 128) // 2, mask=xmask, other=0)
    tl.store(out0 + xindex, v, mask=xmask)


def tables() -> tuple[np.ndarray, ...]:
    x = np.clip((np.arange(W_OUT, dtype=np.float32) + 0.5) / 2 - 0.5, 0, W_IN - 1)
    lo = np.minimum(x.astype(np.int64), W_IN - 1)
    hi = np.minimum(lo + 1, W_IN - 1)
    w_hi, w_lo = np.abs(x - lo), np.abs(x - hi)
    edge = lo == hi
    w_lo[edge], w_hi[edge] = 1, 0
    return lo, hi, w_lo, w_hi


def resize_graph(shape: tuple[int, ...], scales: tuple[int, ...]):
    """A bilinear half-pixel Resize of an fp16 NCHW tensor, as tessera's primitives."""
    from onnx import TensorProto, helper, numpy_helper

    from tessera.fission import fission
    from tessera.frontend import load

    out = [d * f for d, f in zip(shape, scales)]
    n = helper.make_node("Resize", ["x", "", "sc"], ["out"], mode="linear", coordinate_transformation_mode="half_pixel")
    m = helper.make_model(helper.make_graph(
        [n], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, out)],
        [numpy_helper.from_array(np.array(scales, np.float32), "sc")]), opset_imports=[helper.make_opsetid("", 20)])
    return fission(load(m).graph).graph


def generated_forms() -> None:
    """tessera's own kernels for three upsamplings (the W pass, the H pass, both) at flat schedules
    and at tiled ones where the kernel has a tiled form, each checked against the first schedule's output."""
    from tessera.codegen.kernels import Schedule, generate, schedules, tile_shape
    from tessera.codegen.launch import TritonKernel
    from tessera.runtime.torch_prims import TORCH_DTYPES

    cases = {"W pass": ((1, 256, 128, 64), (1, 1, 1, 2)), "H pass": ((1, 256, 64, 128), (1, 1, 2, 1)),
             "H and W": ((1, 256, 64, 64), (1, 1, 2, 2))}
    print(f"\n{'case':8} {'schedule':22} {'us':>7} {'TB/s':>6} {'max err':>8}")
    for case, (shape, scales) in cases.items():
        g = resize_graph(shape, scales)
        tile = tile_shape(g, g.nodes, list(g.outputs))
        n = g.types[g.outputs[0]].numel
        space = schedules(n, 1, tile) + [Schedule(xb, cb, w, cb >= tile[1]) for xb, cb in ((8, 128), (16, 128), (4, 256))
                                         for w in (4, 8) if tile and cb <= tile[1]]
        x = torch.randn(shape, dtype=torch.float16, device="cuda")
        env = {**{t: torch.as_tensor(np.asarray(v)).to("cuda", TORCH_DTYPES[g.types[t].dtype]) for t, v in g.constants.items()},
               "x": x}
        ref = None
        gb = (x.numel() + n) * 2 / 1e9
        for s in dict.fromkeys(space):
            ks = generate(g, g.nodes, list(g.outputs), "k", s)
            kern = TritonKernel(ks)
            out = torch.empty(g.types[g.outputs[0]].shape, dtype=torch.float16, device="cuda")
            args = [env[t] for t in ks.inputs]
            launch = lambda: kern(*args, out)  # noqa: E731
            launch()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.float().clone()
            err = (out.float() - ref).abs().max().item()
            us = triton.testing.do_bench_cudagraph(launch, rep=100) * 1e3
            form = f"x{s.xblock}-r{s.rblock}-w{s.num_warps}" + ("-p" if s.persistent and s.rblock > 1 else "")
            print(f"{case:8} {form:22} {us:7.2f} {gb / us * 1e6 / 1e3:6.2f} {err:8.1e}")


def main() -> None:
    lo, hi, w_lo, w_hi = tables()
    dev = "cuda"
    args = [torch.tensor(w_lo, dtype=torch.float16, device=dev), torch.tensor(w_hi, dtype=torch.float16, device=dev),
            torch.randn(R * W_IN, dtype=torch.float16, device=dev), torch.tensor(lo, device=dev),
            torch.tensor(hi, device=dev)]
    ref = None
    rows = []
    for fn in (gen, i32, arith, copy):
        # Tuning tried 2048 and 1024 (8 elements a thread and more); fewer elements a thread may
        # coalesce the gathers (a warp's load then spans adjacent input elements).
        for xb, w in ((2048, 8), (1024, 4), (512, 4), (512, 8), (256, 8), (128, 4)):
            out = torch.empty(N, dtype=torch.float16, device=dev)
            launch = lambda: fn[(triton.cdiv(N, xb),)](*args, out, XBLOCK=xb, num_warps=w)  # noqa: E731
            launch()
            torch.cuda.synchronize()
            if fn is gen and ref is None:
                ref = out.float().clone()
            err = (out.float() - ref).abs().max().item() if fn is not copy else float("nan")
            us = triton.testing.do_bench_cudagraph(launch, rep=100) * 1e3
            rows.append((fn.fn.__name__, xb, w, us, err))
    gb = (R * W_IN + N) * 2 / 1e9
    print(f"{'kernel':8} {'XBLOCK':>6} {'warps':>5} {'us':>7} {'TB/s':>6} {'max err vs gen':>14}")
    for name, xb, w, us, err in rows:
        print(f"{name:8} {xb:6d} {w:5d} {us:7.2f} {gb / us * 1e6 / 1e3:6.2f} {err:14.2e}")


if __name__ == "__main__":
    import sys

    if "--generated" not in sys.argv:  # --generated: tessera's kernels only
        main()
    generated_forms()
