"""The operator registry: one fission rule per ONNX operator and opset range.

An op-family file (`ops/elementwise.py`, `ops/normalization.py`, ...) keeps
everything about its operators together: how the ONNX attributes and constant
inputs of each opset version are read, and the fission rule that lowers the
operator to primitives. The fission rule is also the operator's shape rule:
the frontend runs it on a scratch graph to learn the output types, so shapes
and semantics cannot drift apart.

Registration is a dispatch table keyed by (domain, op type); each entry lists
the opset versions where the operator's signature changed (`since`).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tessera.errors import MalformedModelError, ShapeError, node_ref
from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.graph import Node


AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


class Unsupported(Exception):
    """Raised by a fission rule for a case it does not lower; the node becomes opaque."""


class OpCtx:
    """What a fission rule sees: the operator node, its opset, and the builder.

    `node.inputs` are already names in the primitive graph ("" when omitted).
    """

    def __init__(self, b: PrimBuilder, node: Node, opset: int) -> None:
        self.b = b
        self.node = node
        self.opset = opset

    @property
    def ref(self) -> str:
        return node_ref(self.node.name, self.node.op)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def attr_ints(self, name: str, n: int | None = None, default: int = 0) -> list[int] | None:
        """An int-list attribute. With `n` (one value per spatial axis, say) its
        length is checked, and a missing attribute is `[default] * n`."""
        v = self.attr(name)
        if v is None:
            return None if n is None else [default] * n
        out = [int(x) for x in np.asarray(v).reshape(-1)]
        if n is not None and len(out) != n:
            raise self.fail(f"attribute {name} has {len(out)} values, expected {n}")
        return out

    def auto_pad(self) -> str:
        """The auto_pad attribute of Conv, ConvTranspose and pooling, checked."""
        mode = str(self.attr("auto_pad", "NOTSET"))
        if mode not in AUTO_PADS:
            raise self.fail(f"auto_pad '{mode}' is not one of {', '.join(AUTO_PADS)}")
        return mode

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] != ""

    def input(self, i: int) -> str:
        if not self.has_input(i):
            raise MalformedModelError(f"{self.ref}: input {i} is required but missing")
        return self.node.inputs[i]

    def optional(self, i: int) -> str | None:
        return self.node.inputs[i] if self.has_input(i) else None

    def const(self, i: int, default: np.ndarray | None = None) -> np.ndarray | None:
        """The value of input i, which must be a constant when present."""
        if not self.has_input(i):
            return default
        v = self.b.value(self.node.inputs[i])
        if v is None:
            raise Unsupported(f"input {i} ('{self.node.inputs[i]}') must be a constant")
        return v

    def ints(self, i: int, default: Sequence[int] | None = None) -> list[int] | None:
        v = self.const(i)
        return default if v is None else [int(x) for x in np.asarray(v).reshape(-1)]

    def axis(self, a: int, rank: int) -> int:
        """Normalize a possibly negative axis, checking its range."""
        if not -rank <= a < max(rank, 1):
            raise ShapeError(f"{self.ref}: axis {a} is out of range for rank {rank}")
        return a % rank if rank else 0

    def fail(self, msg: str) -> ShapeError:
        return ShapeError(f"{self.ref}: {msg}")

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def output_used(self, i: int) -> bool:
        return i < len(self.node.outputs) and self.node.outputs[i] != ""


FissionRule = Callable[[OpCtx], Sequence[str]]


@dataclass(frozen=True)
class OpDef:
    op_type: str
    since: int
    rule: FissionRule
    domain: str = ""


_TABLE: dict[tuple[str, str], list[OpDef]] = {}


def register(op_types: str | Sequence[str], since: int = 1, domain: str = "") -> Callable[[FissionRule], FissionRule]:
    """Decorator: `rule` lowers `op_types` from opset `since` until the next registered version."""
    names = [op_types] if isinstance(op_types, str) else list(op_types)

    def deco(rule: FissionRule) -> FissionRule:
        for name in names:
            entries = _TABLE.setdefault((domain, name), [])
            if any(e.since == since for e in entries):
                raise ValueError(f"{name} since {since} registered twice")
            entries.append(OpDef(name, since, rule, domain))
            entries.sort(key=lambda e: e.since)
        return rule

    return deco


def lookup(op_type: str, domain: str, opset: int) -> OpDef | None:
    """The rule for `op_type` at `opset`, or None if it has none."""
    entries = _TABLE.get((domain or "", op_type))
    if not entries:
        return None
    i = bisect.bisect_right([e.since for e in entries], opset) - 1
    return entries[i] if i >= 0 else None


def lower_node(b: PrimBuilder, node: Node, opset: int) -> list[str]:
    """Apply `node`'s fission rule through `b` and return its output tensors (one
    per non-empty node output, in order); raise Unsupported if it has none."""
    opdef = lookup(node.op, node.domain, opset)
    if opdef is None:
        dom = f"{node.domain}." if node.domain else ""
        raise Unsupported(f"no fission rule for {dom}{node.op} at opset {opset}")
    b.source = (node.name,)
    b.context = node_ref(node.name, node.op)
    outs = list(opdef.rule(OpCtx(b, node, opset)))
    if len(outs) < sum(1 for o in node.outputs if o):
        raise Unsupported(f"the rule produces {len(outs)} of {len(node.outputs)} outputs")
    return outs


def supported_ops() -> list[str]:
    return sorted(name for (_, name) in _TABLE)


def float_dtype_check(ctx: OpCtx, x: str) -> DType:
    """The dtype of x, which must be a float type for this operator."""
    dt = ctx.b.dtype(x)
    if not dt.is_float:
        raise Unsupported(f"{ctx.node.op} on {dt.value} is not supported")
    return dt
