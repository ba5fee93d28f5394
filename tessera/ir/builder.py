"""`PrimBuilder`: the API fission rules use to emit primitives.

Each method appends one primitive node (or none, when the operation is an
identity, such as a reshape to the same shape) and returns the name of the
tensor it produced. Types are computed by `ir/prim_shapes.py`; a type error is
re-raised naming the ONNX node being split.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tessera.errors import ShapeError
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType, unique_name
from tessera.ir.prim_shapes import infer
from tessera.ir.prims import Prim


class PrimBuilder:
    """Appends primitives to `graph`, tagging each with `source` (ONNX node names)."""

    def __init__(self, graph: Graph, reserved: set[str] | None = None) -> None:
        """`reserved`: names to avoid besides the graph's own."""
        self.graph = graph
        self._taken: set[str] = set(graph.types) | {n.name for n in graph.nodes} | (reserved or set())
        self.source: tuple[str, ...] = ()
        self.context = ""  # "node 'x' (Op)" for error messages

    # ---- queries ------------------------------------------------------------
    def type(self, t: str) -> TensorType:
        return self.graph.types[t]

    def shape(self, t: str) -> tuple[int, ...]:
        return self.graph.types[t].shape

    def rank(self, t: str) -> int:
        return self.graph.types[t].rank

    def dtype(self, t: str) -> DType:
        return self.graph.types[t].dtype

    def value(self, t: str) -> np.ndarray | None:
        """The value of `t` if it is a constant, else None."""
        return self.graph.constants.get(t)

    def fresh(self, hint: str) -> str:
        name = unique_name(hint, self._taken)
        self._taken.add(name)
        return name

    def _hint(self, what: str) -> str:
        return f"{self.source[0]}/{what}" if self.source else what

    # ---- emitting -------------------------------------------------------------
    def const(self, value: np.ndarray, hint: str = "const", dtype: DType | None = None, wide: bool = False) -> str:
        """Add a constant tensor. bfloat16 values are stored as float32 arrays. `wide`: a float32
        coefficient of the operator's own arithmetic, kept float32 in a float16/bfloat16 plan
        (`Graph.wide_constants`)."""
        arr = np.asarray(value)
        dt = dtype or DType.from_numpy(arr.dtype)
        name = self.fresh(self._hint(hint))
        self.graph.constants[name] = np.asarray(arr.astype(dt.to_numpy(), copy=False), order="C")
        self.graph.types[name] = TensorType(tuple(int(d) for d in arr.shape), dt)
        if wide and dt is DType.FLOAT32:
            self.graph.wide_constants = self.graph.wide_constants | {name}
        return name

    def positions(self, n: int, axis: int, rank: int, hint: str = "index") -> str:
        """The int64 constant 0 .. n-1 along `axis` of a rank-`rank` shape of 1s elsewhere (ArgMax, TopK,
        Hardmax, OneHot compare values' places with it)."""
        return self.const(np.arange(n, dtype=np.int64).reshape([n if i == axis else 1 for i in range(rank)]), hint)

    def emit(self, prim: Prim, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
             out_type: TensorType | None = None, hint: str | None = None, name: str | None = None) -> str:
        """Append one primitive and return its output tensor (named `name` if given)."""
        attrs = attrs or {}
        try:
            t = out_type if out_type is not None else infer(prim, [self.type(i) for i in inputs], attrs)
        except ShapeError as e:
            raise ShapeError(f"{self.context or 'graph'}: {prim.value}: {e}") from None
        if name is None:
            name = self.fresh(self._hint(hint or prim.value))
        elif name in self._taken:
            raise ValueError(f"tensor name '{name}' is already taken")
        else:
            self._taken.add(name)
        self.graph.nodes.append(Node(name=name, op=prim.value, inputs=tuple(inputs), outputs=(name,),
                                     attrs=attrs, source=self.source))
        self.graph.types[name] = t
        return name

    # ---- elementwise --------------------------------------------------------
    def fill(self, value: float | int | bool, shape: Sequence[int], dtype: DType) -> str:
        if dtype.is_float:
            value = float(value)
        elif dtype is DType.BOOL:
            value = bool(value)
        else:
            value = int(value)
        return self.emit(Prim.FILL, [], {"value": value, "shape": tuple(shape), "dtype": dtype.value})

    def scalar(self, value: float | int | bool, like: str) -> str:
        """A FILL with `like`'s shape and dtype."""
        t = self.type(like)
        return self.fill(value, t.shape, t.dtype)

    def cast(self, x: str, dtype: DType) -> str:
        if self.dtype(x) == dtype:
            return x
        return self.emit(Prim.CAST, [x], {"dtype": dtype.value})

    def unary(self, prim: Prim, x: str) -> str:
        return self.emit(prim, [x])

    def binary(self, prim: Prim, x: str, y: str) -> str:
        """`prim(x, y)` with NumPy broadcasting made explicit."""
        shape = self.broadcast_shape(self.shape(x), self.shape(y))
        return self.emit(prim, [self.broadcast_to(x, shape), self.broadcast_to(y, shape)])

    def where(self, cond: str, x: str, y: str) -> str:
        shape = self.broadcast_shape(self.shape(cond), self.shape(x), self.shape(y))
        return self.emit(Prim.WHERE, [self.broadcast_to(t, shape) for t in (cond, x, y)])

    def add(self, x: str, y: str) -> str:
        return self.binary(Prim.ADD, x, y)

    def sub(self, x: str, y: str) -> str:
        return self.binary(Prim.SUB, x, y)

    def mul(self, x: str, y: str) -> str:
        return self.binary(Prim.MUL, x, y)

    def div(self, x: str, y: str) -> str:
        return self.binary(Prim.DIV, x, y)

    def mul_scalar(self, x: str, c: float) -> str:
        return self.emit(Prim.MUL, [x, self.scalar(c, x)])

    def add_scalar(self, x: str, c: float) -> str:
        return self.emit(Prim.ADD, [x, self.scalar(c, x)])

    # ---- reduce / broadcast ---------------------------------------------------
    def broadcast_shape(self, *shapes: Sequence[int]) -> tuple[int, ...]:
        try:
            return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
        except ValueError:
            raise ShapeError(f"{self.context or 'graph'}: shapes "
                             + ", ".join(str(list(s)) for s in shapes) + " do not broadcast") from None

    def broadcast_to(self, x: str, shape: Sequence[int]) -> str:
        """NumPy broadcast: leading 1s by RESHAPE, then one BROADCAST if any dim grows."""
        shape = tuple(shape)
        xs = self.shape(x)
        if len(xs) > len(shape):
            raise ShapeError(f"{self.context}: cannot broadcast {list(xs)} to {list(shape)}")
        x = self.reshape(x, (1,) * (len(shape) - len(xs)) + tuple(xs))
        if self.shape(x) == shape:
            return x
        return self.emit(Prim.BROADCAST, [x], {"shape": shape})

    def reduce(self, prim: Prim, x: str, axes: Sequence[int], keepdims: bool = True) -> str:
        axes = tuple(sorted({a % self.rank(x) for a in axes})) if self.rank(x) else ()
        if not axes:
            return x
        y = self.emit(prim, [x], {"axes": axes})
        if not keepdims:
            y = self.reshape(y, [d for i, d in enumerate(self.shape(x)) if i not in axes])
        return y

    # ---- layout ---------------------------------------------------------------
    def reshape(self, x: str, shape: Sequence[int]) -> str:
        shape = tuple(int(d) for d in shape)
        if self.shape(x) == shape:
            return x
        return self.emit(Prim.RESHAPE, [x], {"shape": shape})

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(len(perm))):
            return x
        return self.emit(Prim.TRANSPOSE, [x], {"perm": perm})

    def slice(self, x: str, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int]) -> str:
        if tuple(shape) == self.shape(x) and all(s == 0 for s in starts) and all(s == 1 for s in steps):
            return x
        return self.emit(Prim.SLICE, [x], {"starts": tuple(starts), "steps": tuple(steps), "shape": tuple(shape)})

    def slice_axis(self, x: str, axis: int, start: int, length: int) -> str:
        """x[..., start:start+length, ...] along one axis."""
        shape = list(self.shape(x))
        starts = [0] * len(shape)
        starts[axis] = start
        shape[axis] = length
        return self.slice(x, starts, [1] * len(shape), shape)

    def pad(self, x: str, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> str:
        if all(p == 0 for p in pads):
            return x
        return self.emit(Prim.PAD, [x], {"pads": tuple(pads), "mode": mode, "value": float(value)})

    def concat(self, xs: Sequence[str], axis: int) -> str:
        if len(xs) == 1:
            return xs[0]
        return self.emit(Prim.CONCAT, list(xs), {"axis": axis})

    def gather(self, data: str, indices: str, axis: int) -> str:
        return self.emit(Prim.GATHER, [data, indices], {"axis": axis})

    # ---- linear ---------------------------------------------------------------
    def matmul(self, a: str, b: str) -> str:
        return self.emit(Prim.MATMUL, [a, b])
