"""Every primitive -> Triton mapping of elementwise math, in one table.

Values are computed in a *compute type*: float32 for every float type narrower
than float64 (fp16/bf16 load as fp32 and round when stored or cast), float64,
the integer types, and int1 for bool. Operands reach these functions as Triton
expressions; `Emit` lets a mapping name intermediate results.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tessera.ir.dtype import DType
from tessera.ir.prims import Prim


class Unsupported(Exception):
    """The generator cannot produce this kernel; the message says why."""


# fp32 -> tf32, rounding to nearest (ties away). The tensor cores read only the top 19 bits of an
# fp32 operand, so unrounded operands are truncated: a bias toward zero of ~1e-3 relative, the
# whole tf32 tolerance. Rounded operands err without bias, and their products are exact in fp32,
# so the CPU interpreter computes what the GPU does. A generated module that rounds defines
# `tf32_round` once (`module_source`).
TF32_ROUND = "tf32_round({x})"

# On the GPU one PTX cvt.rna.tf32.f32 per element. The same bits as integer ops (add half an ulp,
# clear the 13 low bits; five instructions) cost the small tf32 GEMMs of issue 15's chains 1.2-1.7x
# their time with cvt on the H100 (session 40, scripts/tf32_round_probe.py), and steered some to
# wgmma with register operands. Triton's interpreter has no inline PTX, and GPUs before sm_80 (V100)
# no cvt to tf32, so they compute the integer form; infinities and NaN pass unchanged in both.
_TF32_HELPER = """\
# tf32 rounding (to nearest, ties away): one cvt.rna.tf32.f32 on a GPU of sm_80 or later; the same bits
# from integer ops in Triton's interpreter, which has no inline PTX, and before sm_80, which has no cvt to tf32.
TF32_CVT = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1"
                        and (not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] >= 8))


@triton.jit
def tf32_round(x):
    if TF32_CVT:
        return tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x.to(tl.int32, bitcast=True)],
                                         dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)
    else:
        return tl.where(tl.abs(x) < float("inf"),
                        ((x.to(tl.int32, bitcast=True) + 4096) & -8192).to(tl.float32, bitcast=True), x)
"""


# Every generated kernel takes this constexpr parameter and, when it is set, starts with these lines. A
# kernel launched with programmatic dependent launch (Hopper and later; `codegen.launch.pdl_supported`)
# waits for the kernel before it to finish (its writes visible) before it touches memory; at PDL=1 it
# also lets the next kernel in the stream launch at once, so that kernel's programs are resident when
# this one ends (at PDL=2 the next launches as this one ends, as without the call).
# Unset (the interpreter, GPUs before Hopper, TESSERA_PDL=0) the branch is compiled away.
PDL_PARAM = "PDL: tl.constexpr = 0"
PDL_PROLOGUE = (
    "if PDL:  # programmatic dependent launch: the next kernel may launch; memory once the one before ended",
    "    if PDL == 1:", "        gdc_launch_dependents()", "    gdc_wait()")


def module_source(lines: Sequence[str]) -> str:
    """A generated kernel module: the imports, the helpers its kernels call, then `lines`."""
    body = "\n".join(lines).rstrip()
    rounds = "tf32_round(" in body
    head = (["import os", "", "import torch"] if rounds else []) + [
        "import triton", "import triton.language as tl",
        "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait",  # every kernel's PDL_PROLOGUE
        "", ""]
    helpers = _TF32_HELPER.splitlines() + ["", ""] if rounds else []
    return "\n".join(head + helpers + [body]) + "\n"


# Triton element types as the pointer of a tensor of this dtype holds them.
STORAGE: dict[DType, str] = {
    DType.FLOAT32: "tl.float32", DType.FLOAT16: "tl.float16", DType.BFLOAT16: "tl.bfloat16",
    DType.FLOAT64: "tl.float64", DType.INT64: "tl.int64", DType.INT32: "tl.int32", DType.INT8: "tl.int8",
    DType.UINT8: "tl.uint8", DType.BOOL: "tl.int1",
}
COMPUTE: dict[DType, str] = {**STORAGE, DType.FLOAT16: "tl.float32", DType.BFLOAT16: "tl.float32"}


@dataclass(frozen=True)
class Val:
    """A value in the kernel: a variable or a literal, its compute type and the loops it depends on."""

    expr: str
    dtype: DType
    deps: frozenset[str] = frozenset()
    literal: Any = None  # the Python value when `expr` is a literal (a FILL)

    @property
    def is_literal(self) -> bool:
        return self.literal is not None


Emit = Callable[[str, frozenset[str]], str]  # (expression, deps) -> variable name


def literal(value: Any, dtype: DType) -> Val:
    """A FILL's value as Triton source."""
    if dtype is DType.BOOL:
        v: Any = bool(value)
        return Val("1" if v else "0", dtype, literal=v)
    if dtype.is_float:
        v = float(value)
        if math.isnan(v):
            src = 'float("nan")'
        elif math.isinf(v):
            src = 'float("inf")' if v > 0 else '-float("inf")'
        else:
            src = repr(v)
        return Val(src, dtype, literal=v)
    v = int(value)
    # int64's least: 9223372036854775808 alone is no int64 literal, so it is written as a difference
    return Val("(-9223372036854775807 - 1)" if v == -2 ** 63 else str(v), dtype, literal=v)


def _np_cast(value: Any, to: DType) -> Any:
    if to is DType.BOOL:
        return value != 0
    if not to.is_float and isinstance(value, float):
        return int(math.trunc(value))
    return np.array(value).astype(to.to_numpy()).item()


def _tanh(x: str, emit: Emit, deps: frozenset[str]) -> str:
    # tanh x = 1 - 2 / (1 + e**2x), with e**2x as exp2: e**2x overflowing to inf gives 1, and
    # underflowing to 0 gives -1. Against (1 - e**-2|x|) / (1 + e**-2|x|) with a sign select this is
    # a quarter of the instructions per element (SASS of a GEMM template's GELU epilogue, which
    # runs on 4 warps per tile: session 29). Near 0 both lose the same few ulps to cancellation.
    e = emit(f"tl.exp2({x} * {2.0 / math.log(2.0)!r})", deps)
    return f"1.0 - 2.0 / (1.0 + {e})"


def _divide(x: Val, y: Val, emit: Emit) -> str:
    """x / y, as a product with y's reciprocal where y varies over fewer loops than x.

    Triton's `/` is the correctly rounded division, about ten instructions; a divisor invariant in
    x's inner loops (attention's scale, a row's sum or deviation) is inverted once, where its own
    loops place it, and each element pays one multiply (within 1 ulp of the quotient; the GPU probe
    of issue 15 measured 3-10% on an attention chain). A zero, infinite or NaN literal keeps the
    division, so x/0's signs and NaNs stay the quotient's.
    """
    if y.is_literal:
        v = float(y.literal)
        if v != 0.0 and math.isfinite(v) and math.isfinite(1.0 / v):
            return f"{x.expr} * {repr(1.0 / v)}"
        return f"{x.expr} / {y.expr}"
    if y.deps < x.deps:
        return f"{x.expr} * {emit(f'1.0 / {y.expr}', y.deps)}"
    return f"{x.expr} / {y.expr}"


def _pow(x: Val, y: Val, emit: Emit, deps: frozenset[str]) -> str:
    if not x.dtype.is_float:
        raise Unsupported("integer pow")
    if y.is_literal:
        k = float(y.literal)
        special = {1.0: x.expr, 2.0: f"{x.expr} * {x.expr}", 0.5: f"tl.sqrt({x.expr})",
                   -1.0: f"1.0 / {x.expr}", 3.0: f"{x.expr} * {x.expr} * {x.expr}",
                   -0.5: f"1.0 / tl.sqrt({x.expr})", 0.0: f"{x.expr} * 0.0 + 1.0"}
        if k in special:
            return special[k]
        if not math.isfinite(k):  # the general rule below needs a tensor: 0-d, as x may be
            y = Val(f"tl.full([], {y.expr}, tl.float32)", y.dtype)
    # x**y = e**(y ln|x|), negative only for x < 0 and odd integer y, NaN for x < 0 and fractional y.
    r = emit(f"tl.exp({y.expr} * tl.log(tl.abs({x.expr})))", deps)
    if y.is_literal:  # a finite literal: the sign rule decided here
        k = float(y.literal)
        if k.is_integer():
            return f"tl.where({x.expr} < 0, ({r}) * -1.0, {r})" if int(k) % 2 else r
        return f"tl.where({x.expr} < 0, float(\"nan\"), {r})"
    yi = emit(f"({y.expr}).to(tl.int64)", deps)
    whole = emit(f"({yi}).to(tl.float32) == {y.expr}", deps)
    signed = f"tl.where({whole}, tl.where({yi} % 2 != 0, ({r}) * -1.0, {r}), float(\"nan\"))"
    return f"tl.where({y.expr} == 0, 1.0, tl.where({x.expr} < 0, {signed}, {r}))"


_INFIX = {Prim.ADD: "+", Prim.SUB: "-", Prim.MUL: "*", Prim.EQUAL: "==", Prim.GREATER: ">",
          Prim.LESS: "<", Prim.AND: "&", Prim.OR: "|"}
_UNARY_FN = {Prim.ABS: "tl.abs", Prim.EXP: "tl.exp", Prim.LOG: "tl.log", Prim.SQRT: "tl.sqrt",
             Prim.ERF: "tl.erf", Prim.SIGMOID: "tl.sigmoid", Prim.SIN: "tl.sin", Prim.COS: "tl.cos",
             Prim.FLOOR: "tl.floor"}


def _cast(x: Val, to: DType) -> str:
    if to is DType.BOOL:
        return f"{x.expr} != 0"
    if COMPUTE[to] == COMPUTE[x.dtype] and to.itemsize >= x.dtype.itemsize \
            and {to, x.dtype} != {DType.FLOAT16, DType.BFLOAT16}:
        # Widening holds every value; float16 <-> bfloat16 (one size, other mantissa and range)
        # rounds: a bfloat16 round trip in an fp16 plan ran as no cast (the fuzzer, session 44).
        return x.expr
    if to in (DType.FLOAT16, DType.BFLOAT16):  # round to the narrow type, compute on in fp32
        # Integers and booleans go through float32, as onnxruntime's Cast does (and Triton's
        # interpreter reads an integer cast to bfloat16 as its bits).
        wide = "" if x.dtype.is_float else ".to(tl.float32)"
        return f"({x.expr}){wide}.to({STORAGE[to]}).to(tl.float32)"
    return f"({x.expr}).to({COMPUTE[to]})"


def elementwise(prim: Prim, args: Sequence[Val], out: DType, attrs: Any, emit: Emit) -> str:
    """The Triton expression for elementwise `prim` of `args`, in `out`'s compute type."""
    deps = frozenset().union(*(a.deps for a in args))
    if prim is Prim.CAST:
        return _cast(args[0], out)
    if prim in _INFIX:
        a, b = args
        return f"{a.expr} {_INFIX[prim]} {b.expr}"
    if prim in _UNARY_FN:
        if not args[0].dtype.is_float and prim is not Prim.ABS:
            raise Unsupported(f"{prim.value} of {args[0].dtype.value}")
        return f"{_UNARY_FN[prim]}({args[0].expr})"
    x = args[0]
    if prim is Prim.NEG:
        # Triton 3.6 negates a float as 0 - x, which makes -(0.0) +0.0 (ceil(-0.3) came out +0.0 on the
        # GPU); a product by -1 is exact and flips the sign of zero in every version.
        return f"{x.expr} * -1.0" if x.dtype.is_float else f"-{x.expr}"
    if prim is Prim.RECIPROCAL:
        if not x.dtype.is_float:
            raise Unsupported("integer reciprocal")
        return f"1.0 / {x.expr}"
    if prim is Prim.TANH:
        return _tanh(x.expr, emit, deps)
    if prim is Prim.ISNAN:
        return f"{x.expr} != {x.expr}"
    if prim is Prim.NOT:
        return f"{x.expr} == 0"
    if prim is Prim.DIV:
        if not x.dtype.is_float:
            raise Unsupported("integer division (ONNX truncates, Triton's // does not promise to)")
        return _divide(x, args[1], emit)
    if prim is Prim.POW:
        return _pow(x, args[1], emit, deps)
    if prim is Prim.MOD:
        if x.dtype.is_float:
            # frem compiles to x - trunc(x / y) * y on the GPU, off once the quotient passes float32's
            # precision (8388607.5 % -1e-3 gave 0.1256 for 5.6e-4 on the H200): torch.fmod runs it, exactly.
            raise Unsupported("float remainder (the GPU's frem is inexact for large quotients)")
        # Triton's % on integers is C's remainder (srem), as MOD is. Two Python literals would fold in
        # Python, whose % takes the divisor's sign: the dividend becomes a tensor first.
        lhs = f"tl.full([], {x.expr}, {COMPUTE[x.dtype]})" if x.is_literal else x.expr
        return f"{lhs} % {args[1].expr}"
    if prim in (Prim.MAX, Prim.MIN):
        fn = "tl.maximum" if prim is Prim.MAX else "tl.minimum"
        nan = ", propagate_nan=tl.PropagateNan.ALL" if x.dtype.is_float else ""
        return f"{fn}({x.expr}, {args[1].expr}{nan})"
    if prim is Prim.WHERE:
        c, a, b = args
        return f"tl.where({c.expr}, {a.expr}, {b.expr})"
    raise Unsupported(f"no Triton mapping for {prim.value}")


def fold_literal(prim: Prim, args: Sequence[Val], out: DType) -> Val | None:
    """Constant-fold an elementwise primitive of literals (a cast of a FILL, say)."""
    if not all(a.is_literal for a in args):
        return None
    if prim is Prim.CAST:
        return literal(_np_cast(args[0].literal, out), out)
    if prim is Prim.NEG:
        return literal(-args[0].literal, out)
    return None
