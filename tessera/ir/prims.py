"""The primitive set: the contract between fission and every later stage.

A primitive graph is a graph whose every node's `op` is a `Prim`. Each member's
comment defines its semantics exactly; the reference interpreter
(`ir/interp.py`) implements those comments and nothing more.

Normal forms that hold for every primitive node:
- Shapes are static. Elementwise operands have exactly the output's shape:
  broadcasting is never implied, it is a BROADCAST node.
- Every primitive has one output.
- Axes in attributes are non-negative and sorted.
"""
from __future__ import annotations

import enum


class Category(enum.Enum):
    """Korch's four primitive categories, plus the fallback."""

    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"  # reductions and broadcasts
    LAYOUT = "layout"
    LINEAR = "linear"
    OPAQUE = "opaque"


class Prim(str, enum.Enum):
    """Tensor-algebra primitives. Values are lower case, never an ONNX op type."""

    # ---- elementwise: out[i] = f(x[i], y[i], ...) --------------------------
    FILL = "fill"  # no inputs; attrs value, shape, dtype: every element equals value
    CAST = "cast"  # attrs dtype: the value converted to the output dtype (ONNX Cast rules)
    NEG = "neg"  # -x
    ABS = "abs"  # |x|
    EXP = "exp"  # e**x
    LOG = "log"  # natural log
    SQRT = "sqrt"  # square root
    RECIPROCAL = "reciprocal"  # 1/x
    TANH = "tanh"  # hyperbolic tangent
    ERF = "erf"  # Gauss error function
    SIGMOID = "sigmoid"  # 1/(1+e**-x)
    SIN = "sin"  # sine (radians)
    COS = "cos"  # cosine (radians)
    FLOOR = "floor"  # largest integer <= x, floats only (Ceil and Round are built from it)
    ISNAN = "isnan"  # bool: x is NaN
    NOT = "not"  # bool: logical not
    ADD = "add"  # x + y
    SUB = "sub"  # x - y
    MUL = "mul"  # x * y
    DIV = "div"  # x / y; integer operands truncate toward zero (ONNX Div)
    POW = "pow"  # x ** y
    MOD = "mod"  # x - trunc(x / y) * y, exactly: C's fmod, the sign of x (ONNX Mod with fmod=1)
    MAX = "max"  # max(x, y); NaN if either is NaN
    MIN = "min"  # min(x, y); NaN if either is NaN
    EQUAL = "equal"  # bool: x == y
    GREATER = "greater"  # bool: x > y
    LESS = "less"  # bool: x < y
    AND = "and"  # bool: x and y
    OR = "or"  # bool: x or y
    WHERE = "where"  # inputs (cond, x, y): x[i] if cond[i] else y[i]

    # ---- reduce / broadcast ------------------------------------------------
    # Reductions keep rank: the output has size 1 on every axis in attrs axes.
    REDUCE_SUM = "reduce_sum"  # sum over axes
    REDUCE_MAX = "reduce_max"  # max over axes; NaN if any element is NaN
    REDUCE_MIN = "reduce_min"  # min over axes; NaN if any element is NaN
    # attrs shape: same rank as the input; each input dim is 1 or equals the
    # output dim; a size-1 dim is repeated. The only way operands get broadcast.
    BROADCAST = "broadcast"
    # Windowed reduction over the trailing len(kernel) dims (pooling).
    # attrs kind ("sum"|"max"), kernel, strides, dilations, pads (begins then
    # ends). out[..., o] = reduce over k of x[..., o*stride + k*dilation - pad_begin];
    # positions outside the input are skipped (they add 0 / never win a max);
    # a window wholly outside gives 0 (sum) or the dtype's lowest value (max).
    WINDOW_REDUCE = "window_reduce"

    # ---- layout: every output element is a copy of one input element ------
    TRANSPOSE = "transpose"  # attrs perm: out.shape[i] = x.shape[perm[i]] (numpy.transpose)
    RESHAPE = "reshape"  # attrs shape: same elements in row-major order
    # attrs starts, steps (one per dim; steps may be negative):
    # out[i] = x[starts + i*steps] elementwise over dims; the output type gives the extent.
    SLICE = "slice"
    # attrs pads (begins then ends, all >= 0), mode ("constant"|"reflect"|"edge"),
    # value (for constant): numpy.pad semantics.
    PAD = "pad"
    CONCAT = "concat"  # attrs axis: inputs joined along axis (variadic)
    # inputs (data, indices), attrs axis: out = numpy.take(data, indices, axis)
    # with negative indices counting from the end (ONNX Gather).
    GATHER = "gather"
    # inputs (data, indices), attrs axis: out[i] = data[i with i[axis] replaced by
    # indices[i]] (ONNX GatherElements); negative indices count from the end;
    # indices may be smaller than data off the axis.
    GATHER_ELEMENTS = "gather_elements"

    # ---- linear ------------------------------------------------------------
    # [..., m, k] @ [..., k, n] -> [..., m, n]; batch dims identical (no implied broadcast).
    MATMUL = "matmul"
    # inputs (x [N, C, *spatial], w [O, C/group, *kernel]); attrs strides, pads
    # (begins then ends), dilations, group. ONNX Conv without bias.
    CONV = "conv"
    # inputs (x [N, C, *spatial], w [C, O/group, *kernel]); attrs strides, pads,
    # dilations, group, output_padding. ONNX ConvTranspose without bias.
    CONV_TRANSPOSE = "conv_transpose"

    # ---- opaque ------------------------------------------------------------
    # An ONNX operator that fission does not split: attrs op_type, domain,
    # opset, onnx_attrs (its ONNX attributes as Python values). Runs through a
    # fallback (onnxruntime). The only primitive that may have several outputs.
    OPAQUE = "opaque"

    @property
    def category(self) -> Category:
        return CATEGORY_OF[self.value]


UNARY = frozenset({
    Prim.CAST, Prim.NEG, Prim.ABS, Prim.EXP, Prim.LOG, Prim.SQRT, Prim.RECIPROCAL,
    Prim.TANH, Prim.ERF, Prim.SIGMOID, Prim.SIN, Prim.COS, Prim.FLOOR, Prim.ISNAN, Prim.NOT,
})
BINARY = frozenset({
    Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.POW, Prim.MOD, Prim.MAX, Prim.MIN,
    Prim.EQUAL, Prim.GREATER, Prim.LESS, Prim.AND, Prim.OR,
})
COMPARISONS = frozenset({Prim.EQUAL, Prim.GREATER, Prim.LESS, Prim.ISNAN})
REDUCTIONS = frozenset({Prim.REDUCE_SUM, Prim.REDUCE_MAX, Prim.REDUCE_MIN})

# Each primitive's category by op name: `Prim(op)` builds an enum member each call, and candidate
# enumeration asks about the same few names millions of times (planning GPT-2: 1.9 million lookups).
CATEGORY_OF: dict[str, Category] = {}
for _p in Prim:
    if _p in UNARY or _p in BINARY or _p in (Prim.FILL, Prim.WHERE):
        CATEGORY_OF[_p.value] = Category.ELEMENTWISE
    elif _p in REDUCTIONS or _p in (Prim.BROADCAST, Prim.WINDOW_REDUCE):
        CATEGORY_OF[_p.value] = Category.REDUCE
    elif _p in (Prim.MATMUL, Prim.CONV, Prim.CONV_TRANSPOSE):
        CATEGORY_OF[_p.value] = Category.LINEAR
    elif _p is Prim.OPAQUE:
        CATEGORY_OF[_p.value] = Category.OPAQUE
    else:
        CATEGORY_OF[_p.value] = Category.LAYOUT


# Primitives whose output holds some of their first input's values unchanged (a view of rounded
# bits is rounded bits: Graph.tf32_rounded), by op name.
PASS_THROUGH = frozenset({Prim.RESHAPE.value, Prim.TRANSPOSE.value, Prim.SLICE.value, Prim.BROADCAST.value})
