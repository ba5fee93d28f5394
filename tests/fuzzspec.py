"""The fuzzer's graph description (`GraphSpec`) and the machinery its op generators draw with.

A `GraphSpec` is plain data: graph inputs, constants, ONNX nodes and outputs, how to compile the
graph (precision, layout policy, strategy, a schedule seed), the seed of its random values, and
every tensor's shape and dtype as the generator computed them. Its repr is Python that rebuilds it
(`T`, `C`, `N` are short names for the parts), so a shrunk failure pastes into a test; `to_json`
and `from_json` save it next to a failing model.

The generators (`fuzzops.py`, `fuzzops_nn.py`) build a spec through a `Builder`: a pool of
tensors (shape, dtype, and whether its value is *exact* in the compile precision) that starts
with one graph input. A generator takes operands from the pool (most recent first, so chains
form) or makes a new graph input or constant of the shape it needs, and adds its nodes' outputs
to the pool. `Draw` wraps Hypothesis's draws so that every choice shrinks to its first option.

*Exact* tensors (graph inputs, constants, and what layout ops, Relu/Max/Min/Abs/Neg, integer
and boolean ops make of them) hold the same values in tessera's fp16/bf16 storage as in the
reference run on rounded inputs. Under fp16/bf16, discontinuous ops (comparisons, casts to
integers, Floor, ArgMax) only read exact tensors: their result on a rounded intermediate would
differ from the fp32 reference for any half-precision compiler.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from hypothesis import strategies as st

OPSETS = (13, 17, 18, 20, 21)
PRECISIONS = ("fp32", "fp16", "bf16")
LAYOUTS = ("auto", "nhwc", "nchw")
# Odd and prime sizes and size 1 first (Hypothesis shrinks towards the start of a list).
SMALL_DIMS = (1, 3, 2, 5, 7, 4, 6, 8, 11, 13, 16, 9, 17, 12)
# Just past the block and tile sizes the generated kernels use (32..2048).
BOUNDARY_DIMS = (33, 65, 129, 1025, 63, 127, 257, 31, 97, 513, 2049)
MAX_NUMEL = 1 << 13  # per tensor, normally
BIG_NUMEL = 1 << 16  # per tensor, in a graph drawn with boundary sizes
INT64_MAX = (1 << 63) - 1

FLOAT, HALF, BF16 = "float32", "float16", "bfloat16"
INTS = ("int64", "int32")
BOOL = "bool"


# ---- the spec: plain data ------------------------------------------------------------
@dataclass
class ConstSpec:
    """An initializer: literal `values`; random integers in [lo, hi) (`ints`); indices distinct
    along an axis (`distinct` = (axis, extent), for scatters); else random floats, normal * scale
    (|.| + 0.5 if positive). Random values come from the spec's seed and the constant's position."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    values: tuple | None = None
    scale: float = 1.0
    positive: bool = False
    data: bool = True  # a value the graph computes with (rounded under fp16/bf16), not a parameter (scales)
    ints: tuple[int, int] | None = None
    distinct: tuple[int, int] | None = None

    def __repr__(self) -> str:
        v = f", values={self.values!r}" if self.values is not None else ""
        extra = (f", scale={self.scale}" if self.scale != 1.0 else "") + (", positive=True" if self.positive else "") \
            + ("" if self.data else ", data=False") + (f", ints={self.ints}" if self.ints else "") \
            + (f", distinct={self.distinct}" if self.distinct else "")
        return f"C({self.name!r}, {self.shape!r}, {self.dtype!r}{v}{extra})"


@dataclass
class NodeSpec:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    family: str = "elementwise"

    def __repr__(self) -> str:
        a = f", {self.attrs!r}" if self.attrs else ""
        return f"N({self.op!r}, {self.inputs!r}, {self.outputs!r}{a}, family={self.family!r})"


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def __repr__(self) -> str:
        return f"T({self.name!r}, {self.shape!r}, {self.dtype!r})"


@dataclass
class GraphSpec:
    """A graph and how to compile it. `types` holds every tensor's (shape, dtype) as the generator
    computed it; `exact` the tensors whose values are exact in the compile precision."""

    opset: int
    precision: str
    layout: str
    strategy: str
    inputs: list[TensorSpec]
    consts: list[ConstSpec]
    nodes: list[NodeSpec]
    outputs: list[str]
    seed: int = 0  # random constants and input values
    schedule_seed: int = 0  # 0: every kernel's default schedule; else a random one of its space
    index_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # integer inputs: value range
    types: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    rewrites: str = "off"  # the compile's --rewrites (a spec saved before it existed ran without)
    # the compile's --max-kernel-nodes (0: its default). 1 makes every primitive a kernel of its own:
    # buffer planning across many steps, and concatenations written in place (runtime/concat_alias.py)
    kernel_nodes: int = 0

    @property
    def families(self) -> list[str]:
        return sorted({n.family for n in self.nodes})

    def to_json(self) -> dict[str, Any]:
        return {"opset": self.opset, "precision": self.precision, "layout": self.layout, "strategy": self.strategy,
                "seed": self.seed, "schedule_seed": self.schedule_seed,
                "inputs": [[t.name, list(t.shape), t.dtype] for t in self.inputs],
                "consts": [{"name": c.name, "shape": list(c.shape), "dtype": c.dtype,
                            "values": None if c.values is None else list(c.values), "scale": c.scale,
                            "positive": c.positive, "data": c.data, "ints": c.ints, "distinct": c.distinct}
                           for c in self.consts],
                "nodes": [{"op": n.op, "inputs": n.inputs, "outputs": n.outputs, "attrs": _jsonable(n.attrs),
                           "family": n.family} for n in self.nodes],
                "outputs": self.outputs,
                "index_bounds": {k: list(v) for k, v in self.index_bounds.items()},
                "types": {k: [list(s), d] for k, (s, d) in self.types.items()}, "rewrites": self.rewrites,
                "kernel_nodes": self.kernel_nodes}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> "GraphSpec":
        return GraphSpec(
            doc["opset"], doc["precision"], doc["layout"], doc["strategy"],
            [TensorSpec(n, tuple(s), d) for n, s, d in doc["inputs"]],
            [ConstSpec(c["name"], tuple(c["shape"]), c["dtype"], None if c["values"] is None else tuple(c["values"]),
                       c["scale"], c["positive"], c["data"], _pair(c.get("ints")), _pair(c.get("distinct")))
             for c in doc["consts"]],
            [NodeSpec(n["op"], n["inputs"], n["outputs"], n["attrs"], n["family"]) for n in doc["nodes"]],
            doc["outputs"], doc["seed"], doc["schedule_seed"],
            {k: tuple(v) for k, v in doc.get("index_bounds", {}).items()},
            {k: (tuple(s), d) for k, (s, d) in doc.get("types", {}).items()}, doc.get("rewrites", "off"),
            doc.get("kernel_nodes", 0))

    def __repr__(self) -> str:
        lines = [f"GraphSpec(opset={self.opset}, precision={self.precision!r}, layout={self.layout!r}, "
                 f"strategy={self.strategy!r}, seed={self.seed}, schedule_seed={self.schedule_seed},",
                 f"  inputs={self.inputs!r},", f"  consts={self.consts!r},", "  nodes=["]
        lines += [f"    {n!r}," for n in self.nodes]
        lines.append(f"  ], outputs={self.outputs!r}, index_bounds={self.index_bounds!r}, rewrites={self.rewrites!r}, "
                     f"kernel_nodes={self.kernel_nodes})")
        return "\n".join(lines)


# The short names GraphSpec's repr uses, so a printed (shrunk) spec pastes into a test.
T, C, N = TensorSpec, ConstSpec, NodeSpec


def _pair(v: Any) -> tuple[int, int] | None:
    return None if v is None else (int(v[0]), int(v[1]))


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


# ---- drawing ------------------------------------------------------------------------------
class Draw:
    """Hypothesis draws with the fuzzer's conventions: every choice shrinks to its first/smallest option."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        self._draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.int(0, len(seq) - 1)]

    def maybe(self, p: float) -> bool:
        """True with probability about p; shrinks to False."""
        return self.int(0, 99) >= 100 - round(100 * p)

    def perm(self, n: int) -> list[int]:
        return list(self._draw(st.permutations(list(range(n)))))


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    exact: bool = True  # same value in fp16/bf16 storage as in the reference on rounded inputs
    nan_free: bool = True
    const: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype == FLOAT


class Builder:
    """The pool of tensors and the spec under construction."""

    def __init__(self, d: Draw, opset: int, precision: str, big: bool) -> None:
        self.d = d
        self.opset = opset
        self.precision = precision
        self.big = big
        self.inputs: list[TensorSpec] = []
        self.consts: list[ConstSpec] = []
        self.nodes: list[NodeSpec] = []
        self.pool: list[Tensor] = []
        self.consumed: set[str] = set()
        self.index_bounds: dict[str, tuple[int, int]] = {}
        self.types: dict[str, tuple[tuple[int, ...], str]] = {}  # every tensor, pooled or not
        self.family = "elementwise"
        self._n = 0

    @property
    def half(self) -> bool:
        return self.precision in ("fp16", "bf16")

    @property
    def cap(self) -> int:
        return BIG_NUMEL if self.big else MAX_NUMEL

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    # -- sizes --
    def dim(self, lo: int = 1, budget: int | None = None) -> int:
        budget = budget or self.cap
        if self.big and self.d.maybe(0.2):
            choices = [x for x in BOUNDARY_DIMS if lo <= x <= budget]
            if choices:
                return self.d.pick(choices)
        choices = [x for x in SMALL_DIMS if lo <= x <= budget] or [max(lo, 1)]
        return self.d.pick(choices)

    def shape(self, rank: int, lo: int = 1) -> tuple[int, ...]:
        out: list[int] = []
        for i in range(rank):
            budget = max(1, self.cap // max(1, math.prod(out)) // (lo ** (rank - i - 1)))
            out.append(self.dim(lo, max(lo, budget)))
        return tuple(out)

    # -- tensors --
    def add_input(self, shape: Sequence[int], dtype: str = FLOAT, bounds: tuple[int, int] | None = None) -> Tensor:
        name = self.fresh("in")
        self.inputs.append(TensorSpec(name, tuple(shape), dtype))
        self.types[name] = (tuple(shape), dtype)
        if bounds is not None:
            self.index_bounds[name] = bounds
        t = Tensor(name, tuple(shape), dtype)
        self.pool.append(t)
        return t

    def const(self, shape: Sequence[int], dtype: str = FLOAT, values: Sequence[Any] | None = None,
              scale: float = 1.0, positive: bool = False, data: bool = True, pool: bool = False,
              ints: tuple[int, int] | None = None, distinct: tuple[int, int] | None = None) -> Tensor:
        name = self.fresh("c")
        vals = None if values is None else tuple(values)
        self.consts.append(ConstSpec(name, tuple(shape), dtype, vals, scale, positive, data, ints, distinct))
        t = Tensor(name, tuple(shape), dtype, const=True)
        if pool:
            self.pool.append(t)
        return t

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (shapes, axes, pads, starts): a name for a node input."""
        return self.const((len(values),), "int64", [int(v) for v in values], data=False).name

    def scalar(self, value: float, dtype: str = FLOAT) -> str:
        return self.const((), dtype, [value]).name

    def node(self, op: str, inputs: Sequence[str | Tensor], outs: Sequence[tuple[Sequence[int], str]],
             attrs: dict[str, Any] | None = None, exact: bool = False, nan_free: bool = True,
             family: str | None = None, pool: bool = True) -> list[Tensor]:
        names = [i.name if isinstance(i, Tensor) else i for i in inputs]
        self.consumed.update(n for n in names if n)
        outputs = [Tensor(self.fresh("t"), tuple(s), dt, exact or dt in (BOOL,) + INTS, nan_free) for s, dt in outs]
        self.types.update((t.name, (t.shape, t.dtype)) for t in outputs)
        self.nodes.append(NodeSpec(op, names, [t.name for t in outputs], dict(attrs or {}), family or self.family))
        if pool:
            self.pool.extend(outputs)
        return outputs

    def one(self, *a: Any, **k: Any) -> Tensor:
        return self.node(*a, **k)[0]

    # -- operands --
    def pick(self, pred: Callable[[Tensor], bool], make: Callable[[], Tensor] | None = None) -> Tensor | None:
        """A pool tensor that satisfies pred (most recent first), or a new one from `make`."""
        cands = [t for t in reversed(self.pool) if pred(t)]
        if make is not None and (not cands or self.d.maybe(0.15)):
            return make()
        if not cands:
            return None
        return cands[self.d.int(0, len(cands) - 1)] if len(cands) > 1 else cands[0]

    def float_in(self, pred: Callable[[Tensor], bool] = lambda t: True, rank: int | None = None,
                 exact: bool = False) -> Tensor:
        """A float32 operand (exact ones only when `exact` and the precision is half)."""
        need_exact = exact and self.half

        def ok(t: Tensor) -> bool:
            return t.is_float and t.rank >= 1 and pred(t) and (t.exact or not need_exact) and \
                (rank is None or t.rank == rank)

        def make() -> Tensor:
            return self.add_input(self.shape(rank if rank is not None else self.d.int(1, 4)))

        t = self.pick(ok, make)
        assert t is not None
        return t

    def dtype_in(self, dtypes: Sequence[str], pred: Callable[[Tensor], bool] = lambda t: True) -> Tensor | None:
        return self.pick(lambda t: t.dtype in dtypes and pred(t))

    def bool_in(self, pred: Callable[[Tensor], bool] = lambda t: True) -> Tensor:
        t = self.dtype_in([BOOL], pred)
        if t is None:
            x = self.float_in(exact=True)
            t = self.one("Greater", [x, self.scalar(0.0)], [(x.shape, BOOL)], exact=True, family="compare")
        return t

    def int_in(self) -> Tensor:
        t = self.dtype_in(INTS)
        if t is None:
            dt = self.d.pick(INTS)
            t = self.add_input(self.shape(self.d.int(1, 3)), dt, bounds=(-6, 6))
        return t

    def partner(self, shape: tuple[int, ...], allow_grow: bool = True) -> tuple[int, ...]:
        """A shape that broadcasts with `shape`: leading dims dropped or added, some dims 1,
        and (bidirectionally) a size-1 dim of `shape` given a size."""
        s = list(shape[self.d.int(0, len(shape)):]) if shape and self.d.maybe(0.4) else list(shape)
        for i in range(len(s)):
            if self.d.maybe(0.3):
                s[i] = 1
            elif allow_grow and s[i] == 1 and self.d.maybe(0.3):
                s[i] = self.dim(2, max(2, self.cap // max(1, math.prod(shape))))
        if allow_grow and len(shape) <= len(s) < 4 and self.d.maybe(0.15):
            s = [self.dim(1, max(1, self.cap // max(1, math.prod(shape))))] + s
        return tuple(s)

    def operand_like(self, shape: tuple[int, ...], dtype: str = FLOAT, exact: bool = False,
                     allow_grow: bool = True) -> Tensor:
        """A second operand that broadcasts with `shape`: from the pool, a new input or a constant."""
        def ok(t: Tensor) -> bool:
            if t.dtype != dtype or (exact and self.half and not t.exact):
                return False
            try:
                out = bcast(shape, t.shape)
            except ValueError:
                return False
            # Growing within the graph's size cap: a pool tensor [513, 127, 1, 1] beside [513, 127] made a
            # Where of 4.2e9 elements, and the run was killed for memory (session 49, seed 4902, --big).
            return out == tuple(shape) or (allow_grow and math.prod(out) <= self.cap)

        def make() -> Tensor:
            s = self.partner(shape, allow_grow)
            if dtype == FLOAT and self.d.maybe(0.5):
                return self.const(s, dtype)
            if dtype in INTS:
                return self.add_input(s, dtype, bounds=(-6, 6))
            if dtype == BOOL:
                return self.add_input(s, BOOL)
            return self.add_input(s, dtype)

        t = self.pick(ok, make)
        assert t is not None
        return t

    # -- guards: keep values in an op's domain, so the reference is well defined --
    def positive(self, x: Tensor, offset: float = 0.5) -> Tensor:
        """|x| + offset."""
        a = self.one("Abs", [x], [(x.shape, x.dtype)], exact=x.exact, family=self.family)
        return self.one("Add", [a, self.scalar(offset, x.dtype)], [(x.shape, x.dtype)], family=self.family)


def bcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    r = max(len(s) for s in shapes)
    out = []
    for i in range(r):
        dims = {s[len(s) - r + i] for s in shapes if len(s) - r + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError("shapes do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)
