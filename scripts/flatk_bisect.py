"""Which part of a flat-K convolution template Triton miscompiles (session 8, Triton 3.6, H100).

The kernel: x [1, 3, 13, 5] * w [17, 3, 3, 3], strides 2x1, no padding. Each variant edits the
generated source (a runtime stride instead of a constant, no dot, an operand replaced by ones)
and compares with torch's conv2d. Writes the TTGIR and PTX of three variants to $OUT.

    TESSERA_TEST_DEVICE=cuda OUT=out PYTHONPATH=. python scripts/flatk_bisect.py
Result: scripts/results/templates_gpu/bisect_ec093a5.txt.
"""
import importlib.util, sys, tempfile
sys.path.insert(0, "tests")
import torch, triton
from test_conv_template import conv_relu, conv_kernel
from tessera.codegen.kernels import ConvSchedule
from tessera.codegen.select import implement
from tessera.fission import fission
from tessera.frontend import load

m, _ = conv_relu(1, 3, 13, 5, 17, (3, 3), seed=6, strides=[2, 1])
g = fission(load(m).graph).graph
prims, pro, outputs = conv_kernel(g)
torch.manual_seed(0)
x = torch.randn(1, 3, 13, 5, device="cuda"); w = torch.randn(17, 3, 3, 3, device="cuda"); b = torch.randn(17, device="cuda")
ref = torch.relu(torch.nn.functional.conv2d(x, w, b, stride=(2, 1)))
VARIANTS = {
    "orig": [],
    "store_rt": [("i22 = rn * 18 + rm", "i22 = rn * s18 + rm")],
    "xk_rt": [("i15 = i8 * 65 + (i9 * 5) + i10", "i15 = i8 * s65 + (i9 * s5) + i10")],
    "xm_rt": [("i13 = i11 * 5 + i12", "i13 = i11 * s5 + i12")],
    "w_rt": [("i17 = rn * 27", "i17 = rn * s27")],
    "maxcontig": [("p16 = p14 + i15", "p16 = p14 + tl.max_contiguous(i15, [1, 1])")],
    "nodot": [("acc = tl.dot(a20, a21, acc", "acc += tl.sum(a20[:, :, None] * a21[None, :, :], axis=1) #")],
    "x_zero": [("a20 = tl.load(p16, mask=m1 & m6, other=0.0)", "a20 = tl.load(p16, mask=m1 & m6, other=0.0) * 0 + 1.0")],
    "w_zero": [("a21 = tl.load(p19, mask=m2 & m7, other=0.0)", "a21 = tl.load(p19, mask=m2 & m7, other=0.0) * 0 + 1.0")],
}
import os
for (bm, bn, bk, wp, st) in [(32, 16, 32, 2, 2), (16, 16, 16, 1, 3)]:
    s = ConvSchedule(bm, bn, bk, wp, st, 1)
    src = implement(g, prims, pro, outputs, "k0_test", ("Conv_0",), s, "fp32").triton.source
    for name, subs in VARIANTS.items():
        v = src.replace("out0, BLOCK_M", "out0, s18, s65, s5, s27, BLOCK_M")
        for a, c in subs:
            assert a in v, (name, a)
            v = v.replace(a, c)
        f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False); f.write(v); f.close()
        spec = importlib.util.spec_from_file_location(f"v_{name}_{bm}_{bn}_{bk}_{wp}_{st}", f.name)
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        out = torch.empty(1, 17, 6, 3, device="cuda")
        grid = (triton.cdiv(18, bm) * triton.cdiv(17, bn),)
        kern = mod.k0_test[grid](b, x, w, out, 18, 65, 5, 27, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, num_warps=wp, num_stages=st)
        want = ref
        if name in ("orig", "xk_rt", "maxcontig"):
            for ir in ("ttgir", "ptx"):
                open(os.path.join(os.environ["OUT"], f"{name}_m{bm}k{bk}s{st}.{ir}"), "w").write(kern.asm[ir])
        if name == "x_zero":
            want = torch.relu(torch.nn.functional.conv2d(torch.ones_like(x), w, b, stride=(2, 1)))
        if name == "w_zero":
            want = torch.relu(torch.nn.functional.conv2d(x, torch.ones_like(w), b, stride=(2, 1)))
        err = ((out - want).norm() / want.norm()).item()
        print(f"m{bm} n{bn} k{bk} w{wp} s{st} {name:10s} {err:.2e}" + ("  BAD" if err > 1e-3 else ""), flush=True)
