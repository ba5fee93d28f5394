"""Elementwise operators: arithmetic, comparisons, logic and activations.

Every rule here emits only elementwise primitives, plus the BROADCASTs that
make NumPy-style broadcasting explicit (`PrimBuilder.binary`).
"""
from __future__ import annotations

import math
from functools import reduce

from tessera.ir.dtype import DType
from tessera.ir.prims import Prim
from tessera.ops.registry import OpCtx, Unsupported, float_dtype_check, register

_BINARY = {"Add": Prim.ADD, "Sub": Prim.SUB, "Mul": Prim.MUL, "Div": Prim.DIV,
           "Equal": Prim.EQUAL, "Greater": Prim.GREATER, "Less": Prim.LESS,
           "And": Prim.AND, "Or": Prim.OR}
_UNARY = {"Neg": Prim.NEG, "Abs": Prim.ABS, "Exp": Prim.EXP, "Log": Prim.LOG, "Sqrt": Prim.SQRT,
          "Reciprocal": Prim.RECIPROCAL, "Tanh": Prim.TANH, "Erf": Prim.ERF, "Sigmoid": Prim.SIGMOID,
          "Sin": Prim.SIN, "Cos": Prim.COS, "Floor": Prim.FLOOR, "IsNaN": Prim.ISNAN, "Not": Prim.NOT}


@register(list(_BINARY), since=7)
def binary(ctx: OpCtx) -> list[str]:
    return [ctx.b.binary(_BINARY[ctx.node.op], ctx.input(0), ctx.input(1))]


@register(list(_UNARY), since=6)
def unary(ctx: OpCtx) -> list[str]:
    return [ctx.b.unary(_UNARY[ctx.node.op], ctx.input(0))]


@register(["GreaterOrEqual", "LessOrEqual"], since=12)
def compare_or_equal(ctx: OpCtx) -> list[str]:
    # x >= y is (x > y) or (x == y): NOT(x < y) would be true for NaN.
    strict = Prim.GREATER if ctx.node.op == "GreaterOrEqual" else Prim.LESS
    b, x, y = ctx.b, ctx.input(0), ctx.input(1)
    return [b.binary(Prim.OR, b.binary(strict, x, y), b.binary(Prim.EQUAL, x, y))]


@register("Pow", since=7)
def pow_(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    return [b.binary(Prim.POW, x, b.cast(ctx.input(1), b.dtype(x)))]


@register(["Max", "Min", "Sum", "Mean"], since=8)
def variadic(ctx: OpCtx) -> list[str]:
    prim = {"Max": Prim.MAX, "Min": Prim.MIN, "Sum": Prim.ADD, "Mean": Prim.ADD}[ctx.node.op]
    xs = [ctx.input(i) for i in range(len(ctx.node.inputs))]
    if ctx.node.op == "Mean":
        float_dtype_check(ctx, xs[0])  # a float op in ONNX
    y = reduce(lambda acc, x: ctx.b.binary(prim, acc, x), xs)
    if ctx.node.op == "Mean" and len(xs) > 1:  # the sum over the count
        y = ctx.b.emit(Prim.DIV, [y, ctx.b.scalar(len(xs), y)])
    return [y]


@register("Where", since=9)
def where(ctx: OpCtx) -> list[str]:
    return [ctx.b.where(ctx.input(0), ctx.input(1), ctx.input(2))]


@register("Cast", since=6)
def cast(ctx: OpCtx) -> list[str]:
    try:
        to = DType.from_onnx(int(ctx.attr("to")))
    except ValueError as e:
        raise Unsupported(str(e)) from None
    return [ctx.b.cast(ctx.input(0), to)]


@register("Relu", since=6)
def relu(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    return [ctx.b.emit(Prim.MAX, [x, ctx.b.scalar(0, x)])]


@register("LeakyRelu", since=6)
def leaky_relu(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    neg = b.emit(Prim.LESS, [x, b.scalar(0, x)])
    return [b.emit(Prim.WHERE, [neg, b.mul_scalar(x, ctx.attr("alpha", 0.01)), x])]


def _clamp(ctx: OpCtx, x: str, lo: str | None, hi: str | None) -> str:
    # ONNX Clip is min(max(x, lo), hi).
    b = ctx.b
    if lo is not None:
        x = b.binary(Prim.MAX, x, lo)
    if hi is not None:
        x = b.binary(Prim.MIN, x, hi)
    return x


@register("Clip", since=6)
def clip6(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    lo = b.scalar(ctx.attr("min", -3.4028234663852886e38), x)
    hi = b.scalar(ctx.attr("max", 3.4028234663852886e38), x)
    return [_clamp(ctx, x, lo, hi)]


@register("Clip", since=11)
def clip11(ctx: OpCtx) -> list[str]:
    return [_clamp(ctx, ctx.input(0), ctx.optional(1), ctx.optional(2))]


def _hard_sigmoid(ctx: OpCtx, x: str, alpha: float, beta: float) -> str:
    """max(0, min(1, alpha*x + beta))"""
    b = ctx.b
    y = b.add_scalar(b.mul_scalar(x, alpha), beta)
    y = b.emit(Prim.MIN, [y, b.scalar(1, x)])
    return b.emit(Prim.MAX, [y, b.scalar(0, x)])


@register("HardSigmoid", since=6)
def hard_sigmoid(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    float_dtype_check(ctx, x)
    return [_hard_sigmoid(ctx, x, ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))]


@register("HardSwish", since=14)
def hard_swish(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    float_dtype_check(ctx, x)
    return [ctx.b.emit(Prim.MUL, [x, _hard_sigmoid(ctx, x, 1.0 / 6.0, 0.5)])]


def _softplus(ctx: OpCtx, x: str) -> str:
    # log(1 + e^x) written as max(x, 0) + log(1 + e^-|x|), which cannot overflow.
    b = ctx.b
    pos = b.emit(Prim.MAX, [x, b.scalar(0, x)])
    tail = b.unary(Prim.LOG, b.add_scalar(b.unary(Prim.EXP, b.unary(Prim.NEG, b.unary(Prim.ABS, x))), 1.0))
    return b.emit(Prim.ADD, [pos, tail])


@register("Softplus", since=1)
def softplus(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    float_dtype_check(ctx, x)
    return [_softplus(ctx, x)]


@register("Mish", since=18)
def mish(ctx: OpCtx) -> list[str]:
    """x tanh(softplus(x)) (YOLOv4's activation)."""
    x = ctx.input(0)
    float_dtype_check(ctx, x)
    return [ctx.b.emit(Prim.MUL, [x, ctx.b.unary(Prim.TANH, _softplus(ctx, x))])]


def _exp_minus_one(ctx: OpCtx, x: str, alpha: float) -> str:
    """alpha (e^x - 1): the negative branch of Elu, Selu and Celu."""
    b = ctx.b
    return b.mul_scalar(b.add_scalar(b.unary(Prim.EXP, x), -1.0), alpha)


def _positive_else(ctx: OpCtx, x: str, other: str) -> str:
    """x where x > 0, else `other` (NaN takes `other`, as onnxruntime's Elu gives NaN from it)."""
    b = ctx.b
    return b.emit(Prim.WHERE, [b.emit(Prim.GREATER, [x, b.scalar(0, x)]), x, other])


@register("Elu", since=6)
def elu(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    float_dtype_check(ctx, x)
    return [_positive_else(ctx, x, _exp_minus_one(ctx, x, float(ctx.attr("alpha", 1.0))))]


@register("Selu", since=6)
def selu(ctx: OpCtx) -> list[str]:
    x = ctx.input(0)
    float_dtype_check(ctx, x)
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    return [ctx.b.mul_scalar(_positive_else(ctx, x, _exp_minus_one(ctx, x, alpha)), gamma)]


@register("Celu", since=12)
def celu(ctx: OpCtx) -> list[str]:
    """max(0, x) + min(0, alpha (e^(x/alpha) - 1))."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    alpha = float(ctx.attr("alpha", 1.0))
    neg = _exp_minus_one(ctx, b.mul_scalar(x, 1.0 / alpha), alpha)
    return [b.emit(Prim.ADD, [b.emit(Prim.MAX, [x, b.scalar(0, x)]), b.emit(Prim.MIN, [neg, b.scalar(0, x)])])]


@register("PRelu", since=7)
def prelu(ctx: OpCtx) -> list[str]:
    """x where x >= 0, else slope x; the slope broadcasts to x (one value per channel, say)."""
    b, x, slope = ctx.b, ctx.input(0), ctx.input(1)
    neg = b.emit(Prim.LESS, [x, b.scalar(0, x)])
    return [b.where(neg, b.binary(Prim.MUL, x, b.cast(slope, b.dtype(x))), x)]


@register("ThresholdedRelu", since=10)
def thresholded_relu(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    over = b.emit(Prim.GREATER, [x, b.scalar(float(ctx.attr("alpha", 1.0)), x)])
    return [b.emit(Prim.WHERE, [over, x, b.scalar(0, x)])]


@register("Softsign", since=1)
def softsign(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    return [b.emit(Prim.DIV, [x, b.add_scalar(b.unary(Prim.ABS, x), 1.0)])]


@register("Shrink", since=9)
def shrink(ctx: OpCtx) -> list[str]:
    """x + bias below -lambd, x - bias above lambd, else 0 (NaN too, as in onnxruntime)."""
    b, x = ctx.b, ctx.input(0)
    bias, lambd = float(ctx.attr("bias", 0.0)), float(ctx.attr("lambd", 0.5))
    below = b.emit(Prim.LESS, [x, b.scalar(-lambd, x)])
    above = b.emit(Prim.GREATER, [x, b.scalar(lambd, x)])
    inner = b.emit(Prim.WHERE, [above, b.add_scalar(x, -bias), b.scalar(0, x)])
    return [b.emit(Prim.WHERE, [below, b.add_scalar(x, bias), inner])]


@register("Sign", since=9)
def sign(ctx: OpCtx) -> list[str]:
    """1, -1 or 0; NaN stays NaN (onnxruntime's)."""
    b, x = ctx.b, ctx.input(0)
    zero = b.scalar(0, x)
    y = b.emit(Prim.WHERE, [b.emit(Prim.LESS, [x, zero]), b.scalar(-1, x), zero])
    y = b.emit(Prim.WHERE, [b.emit(Prim.GREATER, [x, zero]), b.scalar(1, x), y])
    if b.dtype(x).is_float:
        y = b.emit(Prim.WHERE, [b.unary(Prim.ISNAN, x), x, y])
    return [y]


@register("IsInf", since=10)
def is_inf(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    tests = [b.emit(Prim.EQUAL, [x, b.scalar(v, x)]) for v, on in ((math.inf, ctx.attr("detect_positive", 1)),
                                                                   (-math.inf, ctx.attr("detect_negative", 1))) if on]
    if not tests:
        return [b.fill(False, b.shape(x), DType.BOOL)]
    return [reduce(lambda p, q: b.emit(Prim.OR, [p, q]), tests)]


@register("Xor", since=7)
def xor(ctx: OpCtx) -> list[str]:
    """(x or y) and not (x and y)."""
    b, x, y = ctx.b, ctx.input(0), ctx.input(1)
    return [b.binary(Prim.AND, b.binary(Prim.OR, x, y), b.unary(Prim.NOT, b.binary(Prim.AND, x, y)))]


@register("Tan", since=7)
def tan(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    return [b.emit(Prim.DIV, [b.unary(Prim.SIN, x), b.unary(Prim.COS, x)])]


@register("Ceil", since=6)
def ceil(ctx: OpCtx) -> list[str]:
    """-floor(-x): exact, and ceil(-0.3) is -0.0 as in onnxruntime."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    return [b.unary(Prim.NEG, b.unary(Prim.FLOOR, b.unary(Prim.NEG, x)))]


@register("Round", since=11)
def round_(ctx: OpCtx) -> list[str]:
    """Half to even, from floor alone: r = floor(x) and d = x - r are exact in any binary float (d is x's
    fraction bits), so r + 1 above a half, r below, and at a half whichever of r, r + 1 is even. Adding
    0.5 first would not be exact (0.49999997 + 0.5 rounds up to 1 in float32). A zero result takes x's
    sign (round(-0.3) is -0.0), as onnxruntime's does."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    r = b.unary(Prim.FLOOR, x)
    d = b.emit(Prim.SUB, [x, r])
    up = b.add_scalar(r, 1.0)
    odd = b.emit(Prim.EQUAL, [b.emit(Prim.SUB, [r, b.mul_scalar(b.unary(Prim.FLOOR, b.mul_scalar(r, 0.5)), 2.0)]),
                              b.scalar(1, x)])
    half = b.emit(Prim.AND, [b.emit(Prim.EQUAL, [d, b.scalar(0.5, x)]), odd])
    y = b.emit(Prim.WHERE, [b.emit(Prim.OR, [b.emit(Prim.GREATER, [d, b.scalar(0.5, x)]), half]), up, r])
    return [b.emit(Prim.WHERE, [b.emit(Prim.EQUAL, [y, b.scalar(0, x)]), b.mul_scalar(x, 0.0), y])]


@register("Mod", since=10)
def mod(ctx: OpCtx) -> list[str]:
    """fmod=1: C's remainder (MOD), the sign of x. fmod=0 (integers only, in ONNX): Python's, the sign of y,
    so a nonzero remainder whose sign differs from y's moves by y."""
    b, x, y = ctx.b, ctx.input(0), ctx.input(1)
    fmod = int(ctx.attr("fmod", 0))
    if fmod == 0 and b.dtype(x).is_float:
        raise Unsupported(f"Mod of {b.dtype(x).value} with fmod=0 (ONNX allows fmod=0 for integers only)")
    r = b.binary(Prim.MOD, x, y)
    if fmod == 1:
        return [r]
    zero = b.scalar(0, r)
    yb = b.broadcast_to(y, b.shape(r))
    neg_pos = b.emit(Prim.AND, [b.emit(Prim.LESS, [r, zero]), b.emit(Prim.GREATER, [yb, zero])])
    pos_neg = b.emit(Prim.AND, [b.emit(Prim.GREATER, [r, zero]), b.emit(Prim.LESS, [yb, zero])])
    return [b.emit(Prim.WHERE, [b.emit(Prim.OR, [neg_pos, pos_neg]), b.emit(Prim.ADD, [r, yb]), r])]


@register("Swish", since=24)
def swish(ctx: OpCtx) -> list[str]:
    """x * sigmoid(alpha * x) (SiLU at alpha 1)."""
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    alpha = float(ctx.attr("alpha", 1.0))
    return [b.emit(Prim.MUL, [x, b.unary(Prim.SIGMOID, x if alpha == 1.0 else b.mul_scalar(x, alpha))])]


@register("Gelu", since=20)
def gelu(ctx: OpCtx) -> list[str]:
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    half_x = b.mul_scalar(x, 0.5)
    if ctx.attr("approximate", "none") == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.emit(Prim.MUL, [b.emit(Prim.MUL, [x, x]), x])
        inner = b.emit(Prim.ADD, [x, b.mul_scalar(cube, 0.044715)])
        t = b.unary(Prim.TANH, b.mul_scalar(inner, math.sqrt(2.0 / math.pi)))
    else:
        # 0.5 x (1 + erf(x / sqrt(2)))
        t = b.unary(Prim.ERF, b.mul_scalar(x, 1.0 / math.sqrt(2.0)))
    return [b.emit(Prim.MUL, [half_x, b.add_scalar(t, 1.0)])]


@register(["Identity"], since=1)
def identity(ctx: OpCtx) -> list[str]:
    return [ctx.input(0)]


@register("Dropout", since=7)
def dropout(ctx: OpCtx) -> list[str]:
    # Inference: the output is the input and the mask, if asked for, is all true.
    if ctx.opset >= 12 and ctx.has_input(2):
        mode = ctx.const(2)
        if mode is not None and bool(mode.reshape(-1)[0]):
            raise Unsupported("Dropout with training_mode=true")
    x = ctx.input(0)
    outs = [x]
    if ctx.output_used(1):
        outs.append(ctx.b.fill(True, ctx.b.shape(x), DType.BOOL))
    return outs
