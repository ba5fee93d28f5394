"""The Triton kernel of `index_check.py`, in a module of its own so that Triton is imported on first
use, not with the runtime (importing it fixes for the process whether its jit functions run in the
interpreter; tests/test_tuning.py says why that matters)."""
import triton
import triton.language as tl


@triton.jit(debug=True)  # debug: device_assert is compiled in
def index_in_range(x_ptr, numel, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < numel, other=0)
    tl.device_assert((v >= -n) & (v < n), "tessera: an index input holds a value outside the dim it gathers from")
