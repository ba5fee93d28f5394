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
          "IsNaN": Prim.ISNAN, "Not": Prim.NOT}


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


@register(["Max", "Min", "Sum"], since=8)
def variadic(ctx: OpCtx) -> list[str]:
    prim = {"Max": Prim.MAX, "Min": Prim.MIN, "Sum": Prim.ADD}[ctx.node.op]
    xs = [ctx.input(i) for i in range(len(ctx.node.inputs))]
    return [reduce(lambda acc, x: ctx.b.binary(prim, acc, x), xs)]


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


@register("Softplus", since=1)
def softplus(ctx: OpCtx) -> list[str]:
    # log(1 + e^x) written as max(x, 0) + log(1 + e^-|x|), which cannot overflow.
    b, x = ctx.b, ctx.input(0)
    float_dtype_check(ctx, x)
    pos = b.emit(Prim.MAX, [x, b.scalar(0, x)])
    tail = b.unary(Prim.LOG, b.add_scalar(b.unary(Prim.EXP, b.unary(Prim.NEG, b.unary(Prim.ABS, x))), 1.0))
    return [b.emit(Prim.ADD, [pos, tail])]


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
