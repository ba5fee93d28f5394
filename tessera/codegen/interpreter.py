"""Triton's CPU interpreter, made to compute what the GPU computes, in two places.

The differential fuzzer (tests/test_fuzz.py, scripts/fuzz.py) found two differences between
Triton's interpreter (3.6 to 3.9 at least) and compiled kernels in code tessera generates:

- **float32 -> bfloat16 rounding.** Compiled kernels round to nearest even (`cvt.rn.bf16.f32`),
  in an explicit `.to(tl.bfloat16)` and in a `tl.store` to a bfloat16 pointer. The interpreter
  truncates the mantissa (`_convert_float` without a rounding mode), so a bf16 plan on the CPU
  was biased toward zero and up to twice as far from the reference as on the GPU: `x * x` missed
  the 1e-2 tolerance (1.4%).
- **Masks from loop counters.** A pooling window's bound check on an axis whose output has one
  element depends on the window counter only (`m = (w - 1 >= 0)`). The interpreter gives that
  scalar comparison the operands' type (int32) instead of int1, so `m & xmask` holds int32 data,
  and `tl.load` raises "mask has unsupported dtype".

A third came with GEMM templates (`codegen/gemm.py`):

- **bfloat16 dots.** The interpreter holds bfloat16 tensors as their uint16 bit patterns and
  `tl.dot` multiplies those integers (`create_dot` widens only fp8). Compiled kernels multiply
  the values on the tensor cores, accumulating in float32; so does the patched dot, on the
  operands widened to float32 (exact: every bfloat16 is a float32).

A fourth came from the fuzzer in session 50:

- **Scalar comparisons.** A comparison's result keeps its operands' type in the interpreter; for two
  scalars it is never made boolean, so `x > 0.0` on a one-element input broadcast as float32 and `&`
  with a boolean tensor failed. Comparisons now return int1 data.

`match_gpu_semantics()` replaces the interpreter builder's float32 -> bfloat16 conversion and its
dot of bfloat16 operands, and makes load/store masks and comparisons boolean. On Triton 3.6 it also reads a scalar
tensor as a Python integer as 3.9 does (`_index_scalars`). Every other operation keeps the
interpreter's code; GPU kernels never run through it. `codegen/launch.use_interpreter` applies it
wherever the interpreter is chosen.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

_PATCHED = False


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even (ml_dtypes' cast)."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def match_gpu_semantics() -> None:
    """Patch the interpreter once per process (a no-op where its builder looks different)."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as ti
        builder = ti.InterpreterBuilder
        cast_impl, masked_load, masked_store = builder.cast_impl, builder.create_masked_load, \
            builder.create_masked_store
        create_dot = builder.create_dot
        handle = ti.TensorHandle
    except (ImportError, AttributeError):
        return

    def rounding_cast(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return handle(bf16_bits(src.data), dst_type.scalar)
        return cast_impl(self, src, dst_type)

    def boolean(mask: Any) -> Any:
        if mask is None or mask.data.dtype == np.bool_:
            return mask
        return handle(mask.data != 0, tl.int1)

    def load(self: Any, ptrs: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        return masked_load(self, ptrs, boolean(mask), *rest, **kw)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        return masked_store(self, ptrs, value, boolean(mask), *rest, **kw)

    def widened(x: Any) -> Any:
        if x.dtype.scalar != tl.bfloat16:
            return x
        return handle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def dot(self: Any, a: Any, b: Any, *rest: Any, **kw: Any) -> Any:
        return create_dot(self, widened(a), widened(b), *rest, **kw)

    builder.cast_impl = rounding_cast
    builder.create_dot = dot
    builder.create_masked_load = load
    builder.create_masked_store = store
    for name in dir(builder):
        if name.startswith(("create_fcmp", "create_icmp")):
            setattr(builder, name, _boolean_comparison(getattr(builder, name), handle, tl.int1))
    _index_scalars(ti)


def _boolean_comparison(compare: Any, handle: Any, int1: Any) -> Any:
    """A comparison whose result is int1, as its type says. The interpreter gives a comparison's
    result its operands' type, and for two scalars (a value loaded from a one-element tensor, a loop
    counter) that type stays: `x > 0.0` was a float32 scalar, broadcast as float32 1.0/0.0, and `&` with
    a boolean tensor raised "ufunc 'bitwise_and' not supported" (fuzz seed 5001)."""
    def boolean(self: Any, lhs: Any, rhs: Any) -> Any:
        out = compare(self, lhs, rhs)
        if out.dtype == int1 and out.data.dtype == np.bool_:
            return out
        return handle(np.asarray(out.data != 0), int1)
    return boolean


def _index_scalars(ti: Any) -> None:
    """A tensor used as a Python integer (a loop bound from `tl.program_id`) as Triton 3.9 reads it.

    Triton 3.6's interpreter takes `int(data)` of the scalar's one-element array, which NumPy 2 refuses
    ("only 0-dimensional arrays can be converted to Python scalars"): every chain kernel whose walk is split
    over programs failed on the CPU. Triton 3.9 squeezes first; so does this, after each run's own patch
    (the run's scope puts both back, in order)."""
    patch_tensor = getattr(ti, "_patch_lang_tensor", None)
    if patch_tensor is None:
        return

    def patch_lang_tensor(tensor: Any, scope: Any, *rest: Any) -> None:
        patch_tensor(tensor, scope, *rest)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    ti._patch_lang_tensor = patch_lang_tensor
