"""Index expressions for generated kernels.

An `Ix` is one integer coordinate as Triton source, with what is known about
it: a constant value, an exclusive upper bound, and which loop variables it
depends on. Layout primitives become maps from output coordinates to input
coordinates built from these; the simplifications below (drop `% n` when the
value is already below n, `// n` when it is below n, `* 1`, `+ 0`) keep the
generated source short and avoid the integer divisions a GPU pays for.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import Sequence


@dataclass(frozen=True)
class Ix:
    expr: str
    const: int | None = None
    hi: int | None = None  # known: 0 <= value < hi (None: unknown, may be negative)
    deps: frozenset[str] = frozenset()
    # Provenance, so a reshape undone by another reshape gives back the same
    # coordinates: `origin` (flat, stride, n) says value == (flat // stride) % n;
    # `parts` says value == ravel of these (coordinate, extent) pairs.
    origin: "tuple[Ix, int, int] | None" = field(default=None, compare=False)
    parts: "tuple[tuple[Ix, int], ...] | None" = field(default=None, compare=False)

    @staticmethod
    def of(k: int) -> "Ix":
        return Ix(str(k), k, k + 1 if k >= 0 else None)

    def __str__(self) -> str:
        return self.expr


def _paren(e: str) -> str:
    return e if e.replace("_", "").isalnum() else f"({e})"


def add(a: Ix, b: Ix) -> Ix:
    if a.const is not None and b.const is not None:
        return Ix.of(a.const + b.const)
    if b.const == 0:
        return a
    if a.const == 0:
        return b
    hi = a.hi + b.hi - 1 if a.hi is not None and b.hi is not None else None
    return Ix(f"{a.expr} + {_paren(b.expr)}", None, hi, a.deps | b.deps)


def add_const(a: Ix, k: int) -> Ix:
    if k == 0:
        return a
    if a.const is not None:
        return Ix.of(a.const + k)
    hi = a.hi + k if a.hi is not None and k > 0 else None
    return Ix(f"{a.expr} + {k}" if k > 0 else f"{a.expr} - {-k}", None, hi, a.deps)


def mul(a: Ix, k: int) -> Ix:
    if k == 0:
        return Ix.of(0)
    if k == 1:
        return a
    if a.const is not None:
        return Ix.of(a.const * k)
    hi = (a.hi - 1) * k + 1 if a.hi is not None and k > 0 else None
    return Ix(f"{_paren(a.expr)} * {k}", None, hi, a.deps)


def floordiv(a: Ix, k: int) -> Ix:
    """Only for non-negative a (index arithmetic), where C and Python division agree."""
    if k == 1:
        return a
    if a.const is not None:
        return Ix.of(a.const // k)
    if a.hi is not None and a.hi <= k:
        return Ix.of(0)
    hi = (a.hi - 1) // k + 1 if a.hi is not None else None
    return Ix(f"{_paren(a.expr)} // {k}", None, hi, a.deps)


def mod(a: Ix, k: int) -> Ix:
    if k == 1:
        return Ix.of(0)
    if a.const is not None:
        return Ix.of(a.const % k)
    if a.hi is not None and a.hi <= k:
        return a
    return Ix(f"{_paren(a.expr)} % {k}", None, k, a.deps)


def _unsplit(dims: list[tuple[Ix, int]]) -> Ix | None:
    """ravel(unravel(flat)) == flat // stride % extent: recognise coordinates cut from one flat index."""
    if not dims or dims[-1][0].origin is None:
        return None
    flat, s0, _ = dims[-1][0].origin  # type: ignore[misc]
    stride = s0
    for i, n in reversed(dims):
        o = i.origin
        if o is None or o[0].expr != flat.expr or o[1] != stride or o[2] != n:
            return None
        stride *= n
    return mod(floordiv(flat, s0), stride // s0)


def ravel(index: Sequence[Ix], shape: Sequence[int]) -> Ix:
    """Row-major flat offset of `index` in a contiguous tensor of `shape`."""
    dims = [(i, n) for i, n in zip(index, shape) if n != 1]
    same = _unsplit(dims)
    if same is not None:
        return same
    parts = tuple(dims)
    # A trailing run of coordinates cut from one flat index is that index again (a transpose
    # that keeps the last dims together): fewer divisions, and Triton sees its contiguity.
    for start in range(1, len(dims) - 1):
        run = _unsplit(dims[start:])
        if run is not None:
            dims = dims[:start] + [(run, prod(n for _, n in dims[start:]))]
            break
    out = Ix.of(0)
    stride = 1
    for i, n in reversed(dims):
        out = add(mul(i, stride), out)
        stride *= n
    if out.const is None:
        out = Ix(out.expr, None, prod(shape), out.deps, parts=parts)
    return out


def unravel(flat: Ix, shape: Sequence[int]) -> list[Ix]:
    """Coordinates of row-major offset `flat` (0 <= flat < prod(shape))."""
    sizes = [n for n in shape if n != 1]
    if flat.parts is not None and [n for _, n in flat.parts] == sizes:
        it = iter(flat.parts)
        return [Ix.of(0) if n == 1 else next(it)[0] for n in shape]
    out: list[Ix] = []
    stride = prod(shape)
    for n in shape:
        stride //= n
        if n == 1:
            out.append(Ix.of(0))
            continue
        c = mod(floordiv(flat, stride), n)
        out.append(c if c.const is not None else replace(c, origin=(flat, stride, n)))
    return out


def reshape_index(index: Sequence[Ix], out_shape: Sequence[int], in_shape: Sequence[int]) -> list[Ix]:
    """Input coordinates of a row-major reshape, keeping dims that pass through unchanged.

    Dims are matched in groups of equal product, so a reshape that splits or
    merges a few dims touches only those; size-1 dims carry no index.
    """
    o = [(d, n) for d, n in enumerate(out_shape) if n != 1]
    i = [(d, n) for d, n in enumerate(in_shape) if n != 1]
    res = [Ix.of(0)] * len(in_shape)
    a = b = 0
    while a < len(o) or b < len(i):
        ga, gb = [o[a]], [i[b]]
        a, b = a + 1, b + 1
        pa, pb = ga[0][1], gb[0][1]
        while pa != pb:
            if pa < pb:
                ga.append(o[a])
                pa *= o[a][1]
                a += 1
            else:
                gb.append(i[b])
                pb *= i[b][1]
                b += 1
        if len(ga) == 1 and len(gb) == 1:
            res[gb[0][0]] = index[ga[0][0]]
            continue
        flat = ravel([index[d] for d, _ in ga], [n for _, n in ga])
        for (d, _), ix in zip(gb, unravel(flat, [n for _, n in gb])):
            res[d] = ix
    return res


def ravel_stored(index: Sequence[Ix], shape: Sequence[int], layout: Sequence[int] = ()) -> Ix:
    """Flat offset of logical `index` in memory that stores `shape` in the dim order `layout`
    (row-major when empty): the coordinates are permuted into storage order, then raveled."""
    if not layout:
        return ravel(index, shape)
    return ravel([index[d] for d in layout], [shape[d] for d in layout])


def unravel_stored(flat: Ix, shape: Sequence[int], layout: Sequence[int] = ()) -> list[Ix]:
    """Logical coordinates of storage offset `flat` (the inverse of `ravel_stored`)."""
    if not layout:
        return unravel(flat, shape)
    stored = unravel(flat, [shape[d] for d in layout])
    out: list[Ix] = [Ix.of(0)] * len(shape)
    for pos, d in enumerate(layout):
        out[d] = stored[pos]
    return out
