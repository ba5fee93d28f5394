"""Does Triton compile a 0-d `tl.full([], ...)` broadcast into a row kernel for an H100 (sm_90)?
Session 36: the emitter writes 0-d literals (codegen/emitter.py). Runs on a CPU: `triton.compile`
with a named target needs no GPU (ptxas comes with Triton). Run under Triton 3.6 and 3.9:
    python scripts/results/fuzz/session36/tl_full_0d_check.py
"""
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def k(x_ptr, out_ptr, out2_ptr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    v = tl.load(x_ptr + 0)
    t5 = tl.full([], 0.78, tl.float32) + 1e-05
    t12 = v * tl.sqrt(t5)
    xs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r = tl.arange(0, RBLOCK)[None, :]
    row = tl.broadcast_to(t12, [XBLOCK, RBLOCK])
    m = tl.max(row, 1)[:, None]
    tl.store(out_ptr + xs, tl.broadcast_to(t12, [XBLOCK, 1]))
    tl.store(out2_ptr + xs + r, row - m)

src = ASTSource(fn=k, signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "out2_ptr": "*fp32", "XBLOCK": "constexpr", "RBLOCK": "constexpr"},
                constexprs={"XBLOCK": 1, "RBLOCK": 1})
c = triton.compile(src, target=GPUTarget("cuda", 90, 32))
print(triton.__version__, "compiled for sm_90:", len(c.asm["cubin"]), "bytes of cubin")
