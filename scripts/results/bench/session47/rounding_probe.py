"""Does a library call on CUDA add the bias before the fp16 product rounds? (session 47, call 2)

The float16 cases of tests/test_bias_rounding.py whose columns are padded (512 rows) and whose conv bias is a
graph input fail on CUDA only. This times nothing: it runs each torch entry point the executable uses on
inputs whose bias nearly cancels the product and prints the relative L2 error against float64 (a product
rounded before the add shows as about 1e-2, one rounding after the add as about 5e-4)."""
from __future__ import annotations

import sys

import torch

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
torch.manual_seed(0)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref).norm() / ref.norm())


def matmul_case(m: int, k: int, n: int) -> None:
    a = (torch.randn(k) + 0.003 * torch.randn(m, k)).half()
    w = ((torch.randn(k, 1) + 0.003 * torch.randn(k, n)) / k ** 0.5).half()
    prod = a.double() @ w.double()
    for kind in ("whole", "vector"):
        c = (-prod if kind == "whole" else -prod[0]) * 0.99
        c = (c + 0.003 * torch.randn(c.shape, dtype=torch.float64)).half()
        ref = prod + c.double()
        A, W, C = (t.to(dev) for t in (a, w, c))
        for rpr in (True, False):
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = rpr
            rows = [("addmm", rel(torch.addmm(C, A, W), ref)),
                    ("addmm(C.expand)", rel(torch.addmm(C.expand(m, n).contiguous(), A, W), ref)),
                    ("baddbmm", rel(torch.baddbmm(C.expand(m, n).reshape(1, m, n), A[None], W[None])[0], ref))]
            if kind == "vector":
                rows.append(("_addmm_activation relu", rel(torch._addmm_activation(C, A, W), ref.clamp_min(0))))
            print(f"matmul {m}x{k}x{n} bias {kind:6s} reduced_precision_reduction={rpr!s:5s} "
                  + "  ".join(f"{name} {e:.2e}" for name, e in rows))
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True


def conv_case(channels_last: bool) -> None:
    c, o = 16, 17
    w = ((0.01 * torch.randn(o, 1, 3, 3) + torch.randn(1, c, 3, 3)) / (c * 9) ** 0.5).half()
    x = (torch.randn(1, c, 1, 1) + 0.003 * torch.randn(1, c, 24, 24)).half()
    prod = torch.nn.functional.conv2d(x.double(), w.double())
    b = (-prod[0, :, 11, 11] * 0.99).half()
    ref = prod + b.double()[None, :, None, None]
    X, W, B = (t.to(dev) for t in (x, w, b))
    if channels_last:
        X, W = X.to(memory_format=torch.channels_last), W.to(memory_format=torch.channels_last)
    rows = [("conv2d(bias)", rel(torch.nn.functional.conv2d(X, W, B), ref)),
            ("conv2d then add", rel(torch.nn.functional.conv2d(X, W) + B[None, :, None, None], ref)),
            ("conv2d fp32 then add", rel((torch.nn.functional.conv2d(X.float(), W.float()) + B.float()[None, :, None, None]).half(), ref))]
    print(f"conv {'NHWC' if channels_last else 'NCHW'} " + "  ".join(f"{name} {e:.2e}" for name, e in rows))


for shape in ((6, 24, 5), (512, 24, 17), (512, 24, 24), (4096, 64, 256)):
    matmul_case(*shape)
conv_case(False)
conv_case(True)
print("cudnn", torch.backends.cudnn.version() if dev == "cuda" else "-", "torch", torch.__version__)
