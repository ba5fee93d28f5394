"""Constant tables with a closed form in their position.

A Resize becomes gathers and products with constant tables indexed by the output position: source
indices and blend weights (`ops/resize.py`). For a whole-number scale those tables repeat: a 2x bilinear
upsampling's lower index is (x - 1) // 2 and its weights alternate 0.25 and 0.75, except at the edges,
where the source coordinate is clamped. A kernel that computes such a value from its position instead
of loading it saves a load per element: segformer_b0's W pass ran 4.75 us with its tables computed and
8.66 with them loaded, each at its best schedule (H200, fp16, `scripts/gather_probe.py`, session 44).

`periodic_table` finds the form value[i] = phase[i % period] + step * (i // period) over all positions
but at most MAX_EDGE at each end, which are kept as they are. Integer tables may step; float tables
only repeat, so that every value is exactly one of the table's own (no rounding of a product).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from tessera.ir.dtype import DType

if TYPE_CHECKING:
    from tessera.ir.graph import Graph

MAX_PERIOD = 4  # longer periods would cost more selects than the load they replace
MAX_EDGE = 2  # positions at each end taken as they are (the clamped source coordinates)
MIN_LENGTH = 8

Number = Union[int, float]


@dataclass(frozen=True)
class PeriodicTable:
    """value[i] = phase[i % period] + step * (i // period), except the first len(head) and the last
    len(tail) positions, which hold head and tail."""

    length: int
    period: int
    phase: tuple[Number, ...]
    step: int
    head: tuple[Number, ...]
    tail: tuple[Number, ...]

    def values(self) -> np.ndarray:
        """The table this form describes (float64 or int64)."""
        i = np.arange(self.length)
        out = np.asarray(self.phase)[i % self.period] + self.step * (i // self.period)
        out[:len(self.head)] = self.head
        if self.tail:
            out[self.length - len(self.tail):] = self.tail
        return out

    def describe(self) -> str:
        """A short stable text of the form (kernel signatures include it: the source bakes it in)."""
        return f"periodic{self.period}{list(self.phase)}+{self.step}h{list(self.head)}t{list(self.tail)}"


def periodic_table(values: np.ndarray) -> PeriodicTable | None:
    """The closed form of a 1-D table (see the module docstring), with the fewest exceptions and the
    shortest period; None when it has none, or it is too short to be worth one."""
    v = np.asarray(values).reshape(-1)
    n = v.size
    if n < MIN_LENGTH:
        return None
    ints = v.dtype.kind in "iu"
    if ints:
        v = v.astype(np.int64)
        if np.abs(v).max() >= 2**31:
            return None
    elif v.dtype in (np.float16, np.float32):
        if not np.isfinite(v).all() or np.unique(v).size > MAX_PERIOD + 2 * MAX_EDGE:
            return None
    else:
        return None
    pos = np.arange(n)
    for cost in range(1, MAX_PERIOD + 2 * MAX_EDGE + 1):
        for period in range(1, min(MAX_PERIOD, cost) + 1):
            for first in range(min(MAX_EDGE, cost - period) + 1):
                last = cost - period - first
                if last > MAX_EDGE or n - first - last < 2 * period + 2:
                    continue
                form = _fit(v, pos, period, first, last, ints)
                if form is not None:
                    return form
    return None


def _fit(v: np.ndarray, pos: np.ndarray, period: int, first: int, last: int, ints: bool) -> PeriodicTable | None:
    n = v.size
    lo, hi = first, n - last
    step = int(v[lo + period] - v[lo]) if ints else 0
    phase = np.empty(period, dtype=v.dtype)
    for j in range(lo, lo + period):
        phase[j % period] = v[j] - step * (j // period)
    inner = pos[lo:hi]
    if not np.array_equal(phase[inner % period] + step * (inner // period), v[lo:hi]):
        return None
    as_py = (lambda a: tuple(int(x) for x in a)) if ints else (lambda a: tuple(float(x) for x in a))
    return PeriodicTable(n, period, as_py(phase), step, as_py(v[:first]), as_py(v[hi:]))


_FORMS: dict[int, tuple[np.ndarray, PeriodicTable | None]] = {}  # id(constant) -> (constant, its form)


def table_form(graph: "Graph", tensor: str) -> PeriodicTable | None:
    """The closed form of a constant of one non-unit dim, integer or float16/float32 (None for
    anything else), which generated kernels compute instead of loading. Cached by constant array."""
    c = graph.constants.get(tensor)
    if c is None or tensor in graph.tf32_rounded:
        return None
    t = graph.types[tensor]
    if sum(d != 1 for d in t.shape) != 1 or t.dtype not in (DType.INT64, DType.INT32, DType.FLOAT16, DType.FLOAT32):
        return None
    hit = _FORMS.get(id(c))
    if hit is not None and hit[0] is c:
        return hit[1]
    if len(_FORMS) > 4096:  # constants of compiles long gone
        _FORMS.clear()
    form = periodic_table(c)
    _FORMS[id(c)] = (c, form)
    return form
