"""Session 47, call 3: what lies behind call 1's unexplained GPU-machine test failures (prints only; times nothing).

1. out_dtype: do addmm/baddbmm with a float32 output (then one rounding) add an fp16 bias before it rounds?
2. A CPU run of bert_tiny in the interpreter (Triton 3.6): alone in a fresh process, and after a GPU build.
3. The measured compile of attn_s7 three times on one database: what each re-measures.
4. Which module-state changes recompile a torch.compile'd module on this torch (the guards test).
"""
from __future__ import annotations

import subprocess
import sys
import traceback

import torch

part = sys.argv[1] if len(sys.argv) > 1 else "all"


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref).norm() / ref.norm())


if part in ("all", "out_dtype"):
    for m, k, n in ((512, 24, 24), (4096, 64, 256), (6, 24, 5)):
        a = (torch.randn(k) + 0.003 * torch.randn(m, k)).half()
        w = ((torch.randn(k, 1) + 0.003 * torch.randn(k, n)) / k ** 0.5).half()
        prod = a.double() @ w.double()
        c = ((-prod * 0.99) + 0.003 * torch.randn(m, n, dtype=torch.float64)).half()
        ref = prod + c.double()
        A, W, C = a.cuda(), w.cuda(), c.cuda()
        rows = []
        for name, fn in (("addmm out_dtype", lambda: torch.addmm(C.float(), A, W, out_dtype=torch.float32).half()),
                         ("baddbmm out_dtype", lambda: torch.baddbmm(C.float()[None], A[None], W[None],
                                                                     out_dtype=torch.float32)[0].half()),
                         ("mm out_dtype + add", lambda: (torch.mm(A, W, out_dtype=torch.float32) + C.float()).half()),
                         ("addmm fp16", lambda: torch.addmm(C, A, W))):
            try:
                rows.append(f"{name} {rel(fn(), ref):.2e}")
            except Exception as e:  # noqa: BLE001
                rows.append(f"{name} {type(e).__name__}: {str(e)[:80]}")
        print(f"out_dtype {m}x{k}x{n}: " + "  ".join(rows), flush=True)

if part == "cpu_run":  # in a fresh process: [gpu_first]
    import tessera
    from tessera.runtime.executable import KernelBuildError
    if len(sys.argv) > 2:
        g = tessera.compile("../shared/models/bert_tiny.onnx", tessera.CompileOptions(cost="analytical"), device="cuda")
        g(torch.randint(0, 1000, (1, 128), device="cuda"))
        print("gpu build and run: ok")
    exe = tessera.compile("../shared/models/bert_tiny.onnx", tessera.CompileOptions(cost="analytical"), device="cpu")
    try:
        exe(torch.randint(0, 1000, (1, 128)))
        print("cpu run: ok")
    except KernelBuildError as e:
        print("cpu run:", str(e)[-200:])
        traceback.print_exception(e.__context__, limit=-12)
    import triton
    print("triton", triton.__version__)

if part in ("all", "cpu"):
    for extra in ([], ["gpu_first"]):
        r = subprocess.run([sys.executable, __file__, "cpu_run", *extra], capture_output=True, text=True, timeout=300)
        print(f"--- bert_tiny CPU run, {'after a GPU build' if extra else 'alone'} (rc {r.returncode})")
        print((r.stdout + r.stderr)[-5000:], flush=True)

if part in ("all", "cache"):
    import tempfile

    import tessera
    db = tempfile.mkdtemp() + "/t.db"
    opts = tessera.CompileOptions(cost="measured", db=db, solver="highs")
    for i in range(3):
        r = tessera.compile_model("../shared/models/attn_s7.onnx", opts)
        t = r.tuning
        print(f"attn_s7 measured compile {i}: " + ", ".join(f"{k}={v}" for k, v in t.items()
                                                           if not isinstance(v, (dict, list))), flush=True)
        print("   kernels:", [k.name for k in r.plan.kernels] if hasattr(r.plan, "kernels") else "")

if part in ("all", "guards"):
    for change in ("requires_grad", "train", "attr", "new_param"):
        torch._dynamo.reset()
        calls = []

        def backend(gm, ex):
            calls.append(1)
            return gm.forward

        m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
        fn = torch.compile(m, backend=backend)
        x = torch.randn(2, 8)
        with torch.no_grad():
            fn(x)
            if change == "requires_grad":
                m[0].weight.requires_grad_(False)
            elif change == "train":
                m.train()
            elif change == "attr":
                m[0].in_features = 9
            else:
                m[0].weight = torch.nn.Parameter(m[0].weight.detach().clone())
            fn(x)
        print(f"guards: {change}: {len(calls)} compile(s)", flush=True)
    print("torch", torch.__version__)
