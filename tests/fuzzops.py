"""The fuzzer's op generators for tensor ops: elementwise, compare, cast, integer, layout, gather.

Each generator takes operands from the builder's pool (or makes inputs and constants of the
shapes it needs), computes its outputs' shapes and dtypes itself, and adds ONNX nodes. Shapes
computed here are checked against the ONNX checker, ONNX shape inference and onnxruntime when the
model is built (`fuzzcheck.reference`): a disagreement is a generator bug, never blamed on tessera.
Network ops (linear, conv, normalization, reduction, pooling, resize, opaque) are in
`fuzzops_nn.py`; `fuzzgen.py` lists them all.
"""
from __future__ import annotations

import math

from fuzzspec import BF16, BOOL, FLOAT, HALF, INT64_MAX, INTS, Builder, Draw, Tensor, bcast

ONNX_TYPE = {FLOAT: 1, HALF: 10, BF16: 16, "int64": 7, "int32": 6, BOOL: 9}


# ---- elementwise --------------------------------------------------------------------------
# (continuous ones only: Sign, Shrink and ThresholdedRelu jump, and would need exact operands, as comparisons do)
_UNARY = ["Relu", "Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Erf", "Log", "Sqrt", "Reciprocal", "LeakyRelu",
          "Softplus", "HardSigmoid", "HardSwish", "Gelu", "Clip", "Identity", "Dropout", "Elu", "Selu", "Celu", "Mish",
          "Softsign"]
_MIN_OPSET = {"Gelu": 20, "HardSwish": 14, "Mish": 18}
_EXACT_UNARY = {"Relu", "Neg", "Abs", "Identity", "Dropout", "Clip"}


def unary(d: Draw, b: Builder) -> None:
    op = d.pick([o for o in _UNARY if b.opset >= _MIN_OPSET.get(o, 1)])
    x = b.float_in()
    attrs: dict = {}
    ins: list = [x]
    nan_free = x.nan_free
    if op in ("Log", "Sqrt", "Reciprocal"):
        # Mostly kept in the op's domain; raw (NaN/inf where the reference has them too) under fp32.
        if b.precision == "fp32" and d.maybe(0.15):
            nan_free = False
        else:
            ins = [b.positive(x, d.pick([0.5, 0.1, 2.0]))]
    if op == "Exp" and b.half:
        ins = [b.one("Tanh", [x], [(x.shape, FLOAT)])]  # keep e^x inside fp16's range
    if op == "LeakyRelu":
        attrs["alpha"] = d.pick([0.01, 0.2, 1.5])
    elif op in ("Elu", "Celu") and d.maybe(0.5):
        attrs["alpha"] = d.pick([0.3, 2.0])
    elif op == "HardSigmoid":
        attrs.update(alpha=d.pick([0.2, 0.5]), beta=d.pick([0.5, 0.1]))
    elif op == "Gelu" and d.maybe(0.5):
        attrs["approximate"] = "tanh"
    elif op == "Clip":
        lo, hi = d.pick([(-0.5, 1.0), (0.0, 6.0), (None, 0.25), (-1.0, None), (None, None)])
        ins = [x, "" if lo is None else b.scalar(lo), "" if hi is None else b.scalar(hi)]
        while ins[-1] == "":
            ins.pop()
    elif op == "Dropout" and d.maybe(0.3):  # with its mask output (all true): a constant condition downstream
        b.node(op, ins, [(x.shape, FLOAT), (x.shape, BOOL)], exact=x.exact, nan_free=nan_free)
        return
    b.one(op, ins, [(x.shape, FLOAT)], attrs, exact=x.exact and op in _EXACT_UNARY, nan_free=nan_free)


_BINARY = ["Add", "Mul", "Sub", "Div", "Max", "Min", "Pow", "Sum"]


def binary(d: Draw, b: Builder) -> None:
    op = d.pick(_BINARY)
    x = b.float_in()
    if op == "Sum":
        ys: list[Tensor] = []
        for _ in range(d.int(0, 2)):
            ys.append(b.operand_like(bcast(x.shape, *[y.shape for y in ys])))
        out = bcast(x.shape, *[y.shape for y in ys])
        b.one("Sum", [x, *ys], [(out, FLOAT)], exact=False, nan_free=x.nan_free and all(y.nan_free for y in ys))
        return
    y = b.operand_like(x.shape)
    if d.maybe(0.5):
        x, y = y, x
    nan_free = x.nan_free and y.nan_free
    if op == "Div":
        if d.maybe(0.9) or b.half:  # raw division (inf where y is 0) only sometimes, under fp32
            y = b.positive(y, d.pick([0.5, 1.0]))
    elif op == "Pow":
        x = b.positive(x, 0.25)
        if d.maybe(0.6):
            y = b.const((), FLOAT, [d.pick([2.0, 0.5, 3.0, -1.0, 1.5])])
        elif b.half:
            y = b.one("Tanh", [y], [(y.shape, FLOAT)])  # small exponents
    out = bcast(x.shape, y.shape)
    exact = op in ("Max", "Min") and x.exact and y.exact
    b.one(op, [x, y], [(out, FLOAT)], exact=exact, nan_free=nan_free)


# ---- comparisons, logic, Where --------------------------------------------------------------
def compare(d: Draw, b: Builder) -> None:
    op = d.pick(["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"])
    if d.maybe(0.3) and b.dtype_in(INTS) is not None:
        x = b.int_in()
        y = b.operand_like(x.shape, x.dtype)
    else:
        x = b.float_in(lambda t: t.nan_free, exact=True)
        if op == "Equal" and d.maybe(0.5):  # equal somewhere: a rearranged copy of itself
            y = b.one("Relu", [x], [(x.shape, FLOAT)], exact=x.exact)
        else:
            y = b.operand_like(x.shape, exact=True)
    b.one(op, [x, y], [(bcast(x.shape, y.shape), BOOL)], exact=True)


def logic(d: Draw, b: Builder) -> None:
    op = d.pick(["And", "Or", "Not", "Xor"])
    x = b.bool_in()
    if op == "Not":
        b.one("Not", [x], [(x.shape, BOOL)], exact=True, family="compare")
        return
    y = b.operand_like(x.shape, BOOL)
    b.one(op, [x, y], [(bcast(x.shape, y.shape), BOOL)], exact=True)


def where(d: Draw, b: Builder) -> None:
    c = b.bool_in()
    dt = d.pick([FLOAT, FLOAT, "int64", "int32"])
    x = b.operand_like(c.shape, dt)
    y = b.operand_like(bcast(c.shape, x.shape), dt)
    out = bcast(c.shape, x.shape, y.shape)
    b.one("Where", [c, x, y], [(out, dt)], exact=x.exact and y.exact, nan_free=x.nan_free and y.nan_free)


def isnan(d: Draw, b: Builder) -> None:
    x = b.float_in(exact=True)
    b.one("IsNaN", [x], [(x.shape, BOOL)], exact=True)


# ---- casts ----------------------------------------------------------------------------------
def cast(d: Draw, b: Builder) -> None:
    kind = d.pick(["half_trip", "bf16_trip", "to_int", "int_to_float", "bool_to", "to_bool", "int_to_int",
                   "half_input"])
    if kind in ("half_trip", "bf16_trip"):
        x = b.float_in()
        mid = HALF if kind == "half_trip" else BF16
        h = b.one("Cast", [x], [(x.shape, mid)], {"to": ONNX_TYPE[mid]}, pool=False)
        b.one("Cast", [h], [(x.shape, FLOAT)], {"to": 1}, exact=False, nan_free=x.nan_free)
    elif kind == "to_int":
        x = b.float_in(lambda t: t.nan_free, exact=True)
        dt = d.pick(INTS)
        b.one("Cast", [x], [(x.shape, dt)], {"to": ONNX_TYPE[dt]})
    elif kind == "int_to_float":
        x = b.int_in()
        b.one("Cast", [x], [(x.shape, FLOAT)], {"to": 1}, exact=True)
    elif kind == "bool_to":
        x = b.bool_in()
        dt = d.pick([FLOAT, "int64", "int32"])
        b.one("Cast", [x], [(x.shape, dt)], {"to": ONNX_TYPE[dt]}, exact=True)
    elif kind == "to_bool":
        x = b.float_in(lambda t: t.nan_free, exact=True)
        b.one("Cast", [x], [(x.shape, BOOL)], {"to": 9})
    elif kind == "int_to_int":
        x = b.int_in()
        dt = "int32" if x.dtype == "int64" else "int64"
        b.one("Cast", [x], [(x.shape, dt)], {"to": ONNX_TYPE[dt]})
    else:  # a float16 graph input, widened
        h = b.add_input(b.shape(d.int(1, 4)), HALF)
        b.pool.remove(h)
        b.one("Cast", [h], [(h.shape, FLOAT)], {"to": 1}, exact=True)


# ---- integer arithmetic ------------------------------------------------------------------------
def integer(d: Draw, b: Builder) -> None:
    op = d.pick(["Add", "Mul", "Sub", "Max", "Min", "Div", "Neg", "Abs", "ReduceSum", "ReduceMax", "Mod"])
    x = b.int_in()
    if op in ("Neg", "Abs"):
        b.one(op, [x], [(x.shape, x.dtype)])
        return
    if op in ("ReduceSum", "ReduceMax"):
        reduce_node(d, b, op, x)
        return
    y = b.operand_like(x.shape, x.dtype)
    attrs = {}
    if op in ("Div", "Mod"):  # no division by zero (onnxruntime's integer Mod of zero fails)
        y = b.one("Abs", [y], [(y.shape, y.dtype)])
        y = b.one("Add", [y, b.const((), y.dtype, [1])], [(y.shape, y.dtype)])
    if op == "Mod":  # both remainders (fmod=0: the divisor's sign, 1: the dividend's), divisors of both signs
        if d.maybe(0.5):
            y = b.one("Neg", [y], [(y.shape, y.dtype)])
        attrs = {"fmod": d.pick([0, 1])}
    b.one(op, [x, y], [(bcast(x.shape, y.shape), x.dtype)], attrs)


def reduce_node(d: Draw, b: Builder, op: str, x: Tensor) -> None:
    r = x.rank
    axes = sorted(set(d.int(0, r - 1) for _ in range(d.int(1, r)))) if r and d.maybe(0.85) else []
    keep = d.maybe(0.6) or not axes and d.maybe(0.5)
    noop = False
    attrs: dict = {}
    if not keep:
        attrs["keepdims"] = 0
    written = [a - r if d.maybe(0.3) else a for a in axes]
    ins: list = [x]
    input_axes = b.opset >= 18 or (op == "ReduceSum" and b.opset >= 13)
    if input_axes:
        if axes:
            ins.append(b.ints(written))
        elif d.maybe(0.2):
            noop = True
            attrs["noop_with_empty_axes"] = 1
    elif axes:
        attrs["axes"] = written
    red = set(range(r)) if not axes and not noop else set(axes)
    out = tuple((1 if i in red else s) for i, s in enumerate(x.shape) if keep or i not in red)
    exact = op in ("ReduceMax", "ReduceMin") and x.exact
    b.one(op, ins, [(out, x.dtype)], attrs, exact=exact, nan_free=x.nan_free)


# ---- layout -------------------------------------------------------------------------------
def any_tensor(b: Builder, rank_min: int = 1) -> Tensor:
    """Any tensor of a storable dtype with rank >= rank_min (floats mostly)."""
    t = b.pick(lambda t: t.dtype != BF16 and t.dtype != HALF and t.rank >= rank_min and (t.dtype == FLOAT or
                                                                                          b.d.maybe(0.4)))
    if t is None:
        t = b.add_input(b.shape(max(rank_min, b.d.int(rank_min, 4))))
    return t


def transpose(d: Draw, b: Builder) -> None:
    x = any_tensor(b, 2)
    perm = d.perm(x.rank)
    attrs = {"perm": perm} if d.maybe(0.9) else {}
    if not attrs:
        perm = list(range(x.rank))[::-1]
    b.one("Transpose", [x], [(tuple(x.shape[p] for p in perm), x.dtype)], attrs, exact=x.exact,
          nan_free=x.nan_free)


def _factor(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def reshape(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    kind = d.pick(["reshape", "flatten", "unsqueeze", "squeeze", "shape_of"])
    if kind == "flatten":
        a = d.int(-x.rank, x.rank)
        k = a + x.rank if a < 0 else a
        out = (math.prod(x.shape[:k]), math.prod(x.shape[k:]))
        b.one("Flatten", [x], [(out, x.dtype)], {"axis": a}, exact=x.exact, nan_free=x.nan_free)
        return
    if kind == "unsqueeze":
        n = d.int(1, 2)
        pos = sorted(set(d.int(0, x.rank + n - 1) for _ in range(n)))
        rank = x.rank + len(pos)
        pos = [p for p in pos if p < rank]
        rank = x.rank + len(pos)
        it = iter(x.shape)
        out = tuple(1 if i in pos else next(it) for i in range(rank))
        axes = [p - rank if d.maybe(0.3) else p for p in pos]
        b.one("Unsqueeze", [x, b.ints(axes)], [(out, x.dtype)], exact=x.exact, nan_free=x.nan_free)
        return
    if kind == "squeeze" and 1 in x.shape:
        ones = [i for i, s in enumerate(x.shape) if s == 1]
        axes = [a - x.rank if d.maybe(0.3) else a for a in ones if d.maybe(0.7)]
        ins = [x] + ([b.ints(axes)] if axes else [])
        drop = {a % x.rank for a in axes} if axes else set(ones)
        out = tuple(s for i, s in enumerate(x.shape) if i not in drop)
        b.one("Squeeze", ins, [(out, x.dtype)], exact=x.exact, nan_free=x.nan_free)
        return
    # Reshape to a random factorization, written with -1 and 0 sometimes.
    fs = _factor(x.numel)
    order = d.perm(len(fs)) if fs else []
    fs = [fs[i] for i in order]
    rank = d.int(1, 4)
    dims = [1] * rank
    for f in fs:
        dims[d.int(0, rank - 1)] *= f
    target = list(dims)
    if d.maybe(0.3):
        target[d.int(0, rank - 1)] = -1
    for i in range(min(rank, x.rank)):
        if target[i] == x.shape[i] and d.maybe(0.2):
            target[i] = 0
    if kind == "shape_of" and x.rank >= 2:
        # The shape from Shape(x) arithmetic, folded by the frontend: [x.shape[0], -1].
        s = b.one("Shape", [x], [((x.rank,), "int64")], family="layout", pool=False)
        first = b.one("Slice", [s, b.ints([0]), b.ints([1])], [((1,), "int64")], pool=False)
        shp = b.one("Concat", [first, b.ints([-1])], [((2,), "int64")], {"axis": 0}, pool=False)
        out = (x.shape[0], x.numel // x.shape[0])
        b.one("Reshape", [x, shp], [(out, x.dtype)], exact=x.exact, nan_free=x.nan_free)
        return
    b.one("Reshape", [x, b.ints(target)], [(tuple(dims), x.dtype)], exact=x.exact, nan_free=x.nan_free)


def concat(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    a = d.int(0, x.rank - 1)
    parts = [x]
    for _ in range(d.int(1, 2)):
        def ok(t: Tensor, a: int = a) -> bool:
            return t.dtype == x.dtype and t.rank == x.rank and all(
                s == u for i, (s, u) in enumerate(zip(t.shape, x.shape)) if i != a)
        y = b.pick(ok)
        if y is None or d.maybe(0.4):
            shp = list(x.shape)
            shp[a] = b.dim(1, max(1, b.cap // max(1, x.numel // x.shape[a]) // 2))
            y = b.const(shp, FLOAT) if x.dtype == FLOAT and d.maybe(0.4) else \
                b.add_input(shp, x.dtype, bounds=(-6, 6) if x.dtype in INTS else None)
        parts.append(y)
    if d.maybe(0.5):
        parts = parts[::-1]
    out = list(x.shape)
    out[a] = sum(p.shape[a] for p in parts)
    axis = a - x.rank if d.maybe(0.3) else a
    b.one("Concat", parts, [(tuple(out), x.dtype)], {"axis": axis}, exact=all(p.exact for p in parts),
          nan_free=all(p.nan_free for p in parts))


def split(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    cands = [i for i, s in enumerate(x.shape) if s >= 2]
    if not cands:
        return concat(d, b)
    a = d.pick(cands)
    dim = x.shape[a]
    n = d.int(2, min(3, dim))
    attrs = {"axis": a}
    ins: list = [x]
    if b.opset >= 18 and d.maybe(0.4):
        attrs["num_outputs"] = n
        chunk = -(-dim // n)
        sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        if sizes[-1] <= 0:
            sizes = None
    elif dim % n == 0 and d.maybe(0.5):
        sizes = [dim // n] * n
        if b.opset >= 18:  # an even split needs num_outputs from opset 18 on
            attrs["num_outputs"] = n
    else:
        cuts = sorted(set(d.int(1, dim - 1) for _ in range(n - 1)))
        sizes = [c1 - c0 for c0, c1 in zip([0] + cuts, cuts + [dim])]
        ins.append(b.ints(sizes))
    if sizes is None:
        return
    outs = []
    for s in sizes:
        shp = list(x.shape)
        shp[a] = s
        outs.append((tuple(shp), x.dtype))
    b.node("Split", ins, outs, attrs, exact=x.exact, nan_free=x.nan_free)


def slice_(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    axes = sorted(set(d.int(0, x.rank - 1) for _ in range(d.int(1, x.rank))))
    starts, ends, steps, out = [], [], [], list(x.shape)
    for a in axes:
        n = x.shape[a]
        k = d.pick([1, 2, -1, 3, -2])
        s = d.int(-n, n - 1)
        if k > 0:
            e = d.pick([n, INT64_MAX, d.int(-n, n), -1])
        else:
            e = d.pick([-INT64_MAX, d.int(-n - 1, n - 1), -1])
        length = _slice_len(n, s, e, k)
        if length <= 0:
            s, e, k = 0, n, 1
            length = n
        starts.append(s)
        ends.append(e)
        steps.append(k)
        out[a] = length
    ins = [x, b.ints(starts), b.ints(ends)]
    if axes != list(range(len(axes))) or any(k != 1 for k in steps) or d.maybe(0.5):
        ins.append(b.ints([a - x.rank if d.maybe(0.3) else a for a in axes]))
        if any(k != 1 for k in steps) or d.maybe(0.5):
            ins.append(b.ints(steps))
    b.one("Slice", ins, [(tuple(out), x.dtype)], exact=x.exact, nan_free=x.nan_free)


def _slice_len(n: int, s: int, e: int, k: int) -> int:
    """ONNX Slice's extent on one axis."""
    s = s + n if s < 0 else s
    e = e + n if e < 0 else e
    if k > 0:
        s, e = min(max(s, 0), n), min(max(e, 0), n)
        return max(0, -(-(e - s) // k))
    s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
    return max(0, -(-(s - e) // -k))


def pad(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    mode = d.pick(["constant", "reflect", "edge"])
    axes = list(range(x.rank))
    use_axes = b.opset >= 18 and d.maybe(0.4)
    if use_axes:
        axes = sorted(set(d.int(0, x.rank - 1) for _ in range(d.int(1, x.rank))))
    begins, ends, out = [], [], list(x.shape)
    for a in axes:
        n = x.shape[a]
        lo, hi = d.pick([0, 1, 2, 3, -1]), d.pick([0, 1, 2, 3, -1])
        lo, hi = max(lo, -(n - 1)), max(hi, -(n - 1))
        if lo < 0 and hi < 0 and n + lo + hi < 1:
            hi = 0
        kept = n + min(lo, 0) + min(hi, 0)
        if mode == "reflect":
            lo, hi = min(lo, kept - 1), min(hi, kept - 1)
        if mode == "edge" and kept < 1:
            lo = hi = 0
        begins.append(lo)
        ends.append(hi)
        out[a] = n + lo + hi
    if min(out) < 1 or math.prod(out) > 2 * b.cap:
        return
    ins: list = [x, b.ints(begins + ends)]
    if mode == "constant" and x.dtype == FLOAT and d.maybe(0.5):
        ins.append(b.scalar(d.pick([0.5, -1.25, 2.0])))
    if use_axes:
        if len(ins) == 2:
            ins.append("")
        ins.append(b.ints(axes))
    b.one("Pad", ins, [(tuple(out), x.dtype)], {"mode": mode}, exact=x.exact, nan_free=x.nan_free)


def expand(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    kind = d.pick(["expand", "tile"])
    budget = max(1, b.cap // max(1, x.numel))
    if kind == "tile":
        reps = [d.pick([1, 2, 3]) if budget > 3 else 1 for _ in x.shape]
        out = tuple(s * r for s, r in zip(x.shape, reps))
        b.one("Tile", [x, b.ints(reps)], [(out, x.dtype)], exact=x.exact, nan_free=x.nan_free)
        return
    target = []
    for s in x.shape:
        if s == 1 and d.maybe(0.6):
            target.append(b.dim(2, max(2, budget)))
        else:
            target.append(d.pick([s, 1]) if s > 1 else 1)
    if d.maybe(0.3):
        target = [b.dim(1, max(1, budget // max(1, math.prod(target) // max(1, x.numel))))] + target
    out = bcast(x.shape, target)
    if math.prod(out) > 2 * b.cap:
        return
    b.one("Expand", [x, b.ints(target)], [(out, x.dtype)], exact=x.exact, nan_free=x.nan_free)


def space_depth(d: Draw, b: Builder) -> None:
    bs = d.pick([2, 3])
    if d.maybe(0.5):
        x = b.pick(lambda t: t.rank == 4 and t.shape[2] % bs == 0 and t.shape[3] % bs == 0 and t.dtype == FLOAT)
        if x is None:
            x = b.add_input((d.pick([1, 2]), d.pick([1, 3, 2]), bs * d.int(1, 4), bs * d.int(1, 4)))
        n, c, h, w = x.shape
        b.one("SpaceToDepth", [x], [((n, c * bs * bs, h // bs, w // bs), x.dtype)], {"blocksize": bs}, exact=x.exact,
              nan_free=x.nan_free)
    else:
        x = b.pick(lambda t: t.rank == 4 and t.shape[1] % (bs * bs) == 0 and t.dtype == FLOAT)
        if x is None:
            x = b.add_input((d.pick([1, 2]), bs * bs * d.pick([1, 2, 3]), d.int(1, 5), d.int(1, 5)))
        n, c, h, w = x.shape
        attrs = {"blocksize": bs, "mode": d.pick(["DCR", "CRD"])}
        b.one("DepthToSpace", [x], [((n, c // (bs * bs), h * bs, w * bs), x.dtype)], attrs, exact=x.exact,
              nan_free=x.nan_free)


# ---- gather / scatter --------------------------------------------------------------------
def _index_values(d: Draw, n: int, count: int) -> list[int]:
    kind = d.pick(["random", "progression", "repeat", "reverse"])
    if kind == "progression" and n > 1:
        step = d.pick([1, 2, 3])
        start = d.int(0, n - 1)
        vals = [start + i * step for i in range(count) if start + i * step < n] or [start]
    elif kind == "repeat":
        vals = [v for v in range(n) for _ in range(2)][:count] or [0]
    elif kind == "reverse":
        vals = list(range(n - 1, -1, -1))[:count]
    else:
        vals = [d.int(-n, n - 1) for _ in range(count)]
    return vals


def gather(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    a = d.int(0, x.rank - 1)
    n = x.shape[a]
    kind = d.pick(["const", "input", "scalar"])
    if kind == "scalar":
        idx = b.const((), "int64", [d.int(-n, n - 1)], data=False)
        ishape: tuple[int, ...] = ()
    elif kind == "const":
        vals = _index_values(d, n, d.int(1, 6))
        ishape = (len(vals),)
        if len(vals) % 2 == 0 and d.maybe(0.3):
            ishape = (2, len(vals) // 2)
        idx = b.const(ishape, "int64", vals, data=False)
    else:
        ishape = b.shape(d.int(1, 2))
        ishape = tuple(min(s, 16) for s in ishape)
        idx = b.add_input(ishape, d.pick(["int64", "int32"]), bounds=(-n, n))
        b.pool.remove(idx)
    out = x.shape[:a] + ishape + x.shape[a + 1:]
    if math.prod(out) > 2 * b.cap:
        return
    axis = a - x.rank if d.maybe(0.3) else a
    b.one("Gather", [x, idx], [(out, x.dtype)], {"axis": axis}, exact=x.exact, nan_free=x.nan_free)


def gather_elements(d: Draw, b: Builder) -> None:
    x = any_tensor(b)
    a = d.int(0, x.rank - 1)
    ishape = tuple(d.int(1, s) if i != a else d.int(1, min(8, 2 * s)) for i, s in enumerate(x.shape))
    if d.maybe(0.5):
        idx = b.add_input(ishape, "int64", bounds=(-x.shape[a], x.shape[a]))
        b.pool.remove(idx)
    else:
        n = x.shape[a]
        idx = b.const(ishape, "int64", data=False, ints=(-n, n))
    b.one("GatherElements", [x, idx], [(ishape, x.dtype)], {"axis": a}, exact=x.exact, nan_free=x.nan_free)


def gather_nd(d: Draw, b: Builder) -> None:
    """GatherND: tuples of k indices into the axes past `batch_dims`, from an input or a constant. One
    range serves every column, the smallest of the k axes' (a column's own range would need one bound
    per column)."""
    x = any_tensor(b)
    bd = d.int(0, min(1, x.rank - 1))
    k = d.int(1, x.rank - bd)
    m = min(x.shape[bd:bd + k])
    lead = tuple(d.int(1, 4) for _ in range(d.int(0, 2)))
    ishape = x.shape[:bd] + lead + (k,)
    out = x.shape[:bd] + lead + x.shape[bd + k:]
    if math.prod(out) > 2 * b.cap:
        return
    if d.maybe(0.5):
        idx = b.add_input(ishape, "int64", bounds=(-m, m))
        b.pool.remove(idx)
    else:
        idx = b.const(ishape, "int64", data=False, ints=(-m, m))
    b.one("GatherND", [x, idx], [(out, x.dtype)], {"batch_dims": bd} if bd else {}, exact=x.exact,
          nan_free=x.nan_free)


def scatter(d: Draw, b: Builder) -> None:
    """ScatterElements / ScatterND with constant indices (lowered since session 51: a CONCAT for a box
    written once, else a GATHER of the updates and a WHERE), sometimes with a reduction, whose
    duplicate indices accumulate."""
    x = any_tensor(b)
    reductions = ["add", "mul"] + (["max", "min"] if b.opset >= 18 else []) if b.opset >= 16 else []
    red = d.pick(reductions) if reductions and x.dtype != "bool" and d.maybe(0.3) else "none"
    attrs = {} if red == "none" else {"reduction": red}
    if d.maybe(0.5):
        a = d.int(0, x.rank - 1)
        k = d.int(1, x.shape[a])
        ushape = tuple(k if i == a else s for i, s in enumerate(x.shape))
        if red == "none":  # indices distinct along the axis (duplicates make the result order-dependent)
            idx = b.const(ushape, "int64", data=False, distinct=(a, x.shape[a]))
        else:
            idx = b.const(ushape, "int64", data=False, ints=(-x.shape[a], x.shape[a]))
        upd = b.const(ushape, FLOAT) if x.dtype == FLOAT else b.add_input(ushape, x.dtype, bounds=(-6, 6))
        b.one("ScatterElements", [x, idx, upd], [(x.shape, x.dtype)], {"axis": a, **attrs}, exact=x.exact,
              family="gather")
    else:
        n = x.shape[0]
        k = d.int(1, n)
        start = d.int(0, n - 1)
        rows = [(start + 2 * i) % n for i in range(k)]
        if len(set(rows)) != k and red == "none":
            rows = list(range(k))
        idx = b.const((k, 1), "int64", rows, data=False)
        ushape = (k,) + x.shape[1:]
        upd = b.const(ushape, FLOAT) if x.dtype == FLOAT else b.add_input(ushape, x.dtype, bounds=(-6, 6))
        b.one("ScatterND", [x, idx, upd], [(x.shape, x.dtype)], attrs, exact=x.exact, family="gather")
