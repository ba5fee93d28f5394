"""Value-at-index code emission for one generated kernel.

`Emitter.value(tensor, index, mask)` returns a Triton variable holding
`tensor[index]` for every lane of the block. A tensor the kernel computes is
never materialized: its producer is emitted at that index, so a layout
primitive is only a change of index (transpose permutes coordinates, slice
scales and shifts them, reshape re-groups them, broadcast zeroes them) and a
pad, concat or gather is a masked load. A tensor from outside the kernel is a
`tl.load`.

Statements live in nested scopes (the kernel body, reduction loops, pooling
window loops). Every statement is placed in the outermost scope whose loop
variables it uses, so a value that does not change along a loop is computed
once before it. Identical expressions are emitted once (CSE per scope).

Masks are sets of condition variables. A load keeps only the conditions on the
loop variables its offset uses: a condition on other variables cannot make
that offset go out of bounds.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from tessera.codegen import index as ix
from tessera.codegen.index import Ix
from tessera.codegen.rotary import HalvesSwap, halves_swap, pairs_swap
from tessera.codegen.triton_ops import COMPUTE, Unsupported, Val, elementwise, fold_literal, literal
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import BINARY, REDUCTIONS, UNARY, Prim
from tessera.ir.tables import PeriodicTable, table_form

Mask = frozenset[str]


@dataclass
class Scope:
    avail: frozenset[str]  # loop tags whose variables are defined here
    header: str = ""  # "for ...:" of a nested block; "" for the kernel body
    lines: list["str | Scope"] = field(default_factory=list)
    cache: dict[str, str] = field(default_factory=dict)
    # Where new lines go while a nested scope of this one is being filled: just before that scope
    # (None: appended). It is the nested scope's position, not always the last line: a loop hoisted
    # out of the one being filled (`Emitter.hoisted`) goes before it.
    insert_at: int | None = None
    parent_open: bool = False  # the enclosing scope was itself inserting before a nested one


class Emitter:
    """Emits the statements that compute tensors of one kernel at symbolic indices."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], inputs: dict[str, str]) -> None:
        self.graph = graph
        self.producer = {o: n for n in nodes for o in n.outputs}
        self.inputs = inputs  # tensor read from memory -> pointer argument name
        self.stack: list[Scope] = [Scope(frozenset())]
        self.cond_deps: dict[str, frozenset[str]] = {}
        self.var_deps: dict[str, frozenset[str]] = {}
        self.counter = 0
        self.values: dict[tuple[str, tuple[str, ...], Mask], Val] = {}
        # Reduction results by (tensor, index exprs), registered by the kernel driver.
        self.rows: dict[tuple[str, tuple[str, ...]], Val] = {}
        # Values the kernel driver computed itself, by (tensor, index exprs): a GEMM template's
        # accumulator is the matmul result at the tile's indices, so its epilogue reads no memory.
        self.known: dict[tuple[str, tuple[str, ...]], Val] = {}
        self.on_reduce: Callable[[Node, Sequence[Ix], Mask], Val] | None = None
        # Tensors the kernel driver computes its own way at any index (a GEMM template's operand
        # with its row factor deferred to the accumulator).
        self.intercepts: dict[str, Callable[[Sequence[Ix], Mask], Val]] = {}
        # A concat that swaps the halves of an axis (rotate_half) read from registers instead of at other
        # indices: the kernel driver's swap of x at `index`, or None (`codegen/rotary.py`).
        self.swap: Callable[[HalvesSwap, tuple[Ix, ...], Mask], Val | None] | None = None
        # The block shape of a value depending on some loop tags (the kernel driver sets it).
        self.shape_of: Callable[[frozenset[str]], str] = lambda deps: "[XBLOCK]"

    # ---- statements ------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _home(self, deps: frozenset[str]) -> int:
        for i, s in enumerate(self.stack):
            if deps <= s.avail:
                return i
        raise AssertionError(f"no scope defines {sorted(deps)}")

    def _place(self, level: int, line: "str | Scope") -> None:
        s = self.stack[level]
        if s.insert_at is not None:
            s.lines.insert(s.insert_at, line)
            s.insert_at += 1
        else:
            s.lines.append(line)

    def emit(self, expr: str, deps: frozenset[str], prefix: str = "t") -> str:
        """A variable holding `expr`, defined in the outermost scope that has its loop variables."""
        for s in self.stack:
            if expr in s.cache:
                return s.cache[expr]
        level = self._home(deps)
        name = self.fresh(prefix)
        self._place(level, f"{name} = {expr}")
        self.stack[level].cache[expr] = name
        self.var_deps[name] = deps
        return name

    def stmt(self, line: str, level: int | None = None) -> None:
        """A statement at a given scope (default: the innermost), e.g. an accumulator update."""
        self._place(len(self.stack) - 1 if level is None else level, line)

    def push(self, header: str, tag: str) -> None:
        parent = self.stack[-1]
        block = Scope(parent.avail | {tag}, header, parent_open=parent.insert_at is not None)
        if parent.insert_at is None:
            parent.lines.append(block)
            parent.insert_at = len(parent.lines) - 1
        else:
            parent.lines.insert(parent.insert_at, block)  # the new block is now the one being filled
        self.stack.append(block)

    def pop(self) -> None:
        block = self.stack.pop()
        parent = self.stack[-1]
        # Back to filling the scope that the block was placed before, or to appending.
        parent.insert_at = parent.insert_at + 1 if block.parent_open else None

    @contextmanager
    def hoisted(self, level: int) -> Iterator[None]:
        """Emit as if scope `level` were the innermost: a loop pushed meanwhile goes there, before
        the nested scope being filled (a GEMM template's per-row statistic, computed in a loop of its
        own before the K loop that reads it). Scopes inside `level` are out of reach until the end."""
        saved = self.stack
        self.stack = saved[:level + 1]
        try:
            yield
        finally:
            self.stack = saved

    def index_var(self, i: Ix) -> Ix:
        """Name a compound index expression so later uses share it."""
        if i.const is not None or i.expr.replace("_", "").isalnum():
            return i
        return Ix(self.emit(i.expr, i.deps, "i"), None, i.hi, i.deps, i.origin, i.parts)

    def cond(self, expr: str, deps: frozenset[str]) -> str:
        name = self.emit(expr, deps, "m")
        self.cond_deps[name] = deps
        return name

    def mask_expr(self, mask: Mask, deps: frozenset[str] | None = None) -> str | None:
        kept = sorted(m for m in mask if deps is None or self.cond_deps[m] <= deps)
        return " & ".join(kept) if kept else None

    def mask_deps(self, mask: Mask) -> frozenset[str]:
        return frozenset().union(*(self.cond_deps[m] for m in mask))

    # ---- values ----------------------------------------------------------------------
    def value(self, tensor: str, index: Sequence[Ix], mask: Mask) -> Val:
        index = tuple(index)
        if tensor in self.intercepts:
            return self.intercepts[tensor](index, mask)
        exprs = tuple(i.expr for i in index)
        if (tensor, exprs) in self.known:
            return self.known[(tensor, exprs)]
        key = (tensor, exprs, mask)
        if key not in self.values:
            self.values[key] = self._compute(tensor, index, mask)
        return self.values[key]

    def load(self, tensor: str, index: Sequence[Ix], mask: Mask) -> Val:
        t = self.graph.types[tensor]
        off = self.index_var(ix.ravel_stored(index, t.shape, t.layout))
        deps = off.deps
        m = self.mask_expr(mask, deps)
        args = f"{self.inputs[tensor]} + {off.expr}" + (f", mask={m}, other=0" if m else "")
        conv = f".to({COMPUTE[t.dtype]})" if COMPUTE[t.dtype] != f"tl.{t.dtype.value}" else ""
        return Val(self.emit(f"tl.load({args}){conv}", deps, "v"), t.dtype, deps)

    def closed_table(self, tensor: str, form: PeriodicTable, index: Sequence[Ix]) -> Val:
        """The constant `tensor`, whose one non-unit dim holds `form`, at `index`: selects on the
        position's remainder plus a step per period, the edges picked by position; no load."""
        t = self.graph.types[tensor]
        i = index[next(d for d, n in enumerate(t.shape) if n != 1)]

        def lit(v: int | float) -> str:
            return literal(v, t.dtype).expr

        if i.const is not None:  # one element: the constant's own value
            return literal(self.graph.constants[tensor].reshape(-1)[i.const].item(), t.dtype)
        edges = list(enumerate(form.head)) + [(form.length - len(form.tail) + k, v) for k, v in enumerate(form.tail)]
        if form.period == 1 and not form.step and not edges:  # every element alike
            return literal(form.phase[0], t.dtype)
        i = self.index_var(i)
        p = form.period
        if p > 1:
            r = self.emit(f"{i.expr} % {p}", i.deps, "i")
            expr = lit(form.phase[-1])
            for k in range(p - 2, -1, -1):
                expr = f"tl.where({r} == {k}, {lit(form.phase[k])}, {expr})"
        else:
            expr = lit(form.phase[0])
        if form.step:
            whole = f"({i.expr} // {p})" if p > 1 else i.expr
            expr = f"{expr} + {whole}" if form.step == 1 else f"{expr} + {form.step} * {whole}"
        for at, v in edges:
            expr = f"tl.where({i.expr} == {at}, {lit(v)}, {expr})"
        return Val(self.emit(expr, i.deps, "v"), t.dtype, i.deps)

    def _compute(self, tensor: str, index: tuple[Ix, ...], mask: Mask) -> Val:
        node = self.producer.get(tensor)
        if node is None:
            if tensor not in self.inputs:
                raise Unsupported(f"tensor {tensor} is neither computed nor read by the kernel")
            one = self.graph.scalar_constant(tensor)
            if one is not None:  # written into the source: no load, and x**3.0 becomes two products
                return literal(one, self.graph.types[tensor].dtype)
            form = table_form(self.graph, tensor)
            if form is not None:  # a Resize's index or weight table: computed from the position
                return self.closed_table(tensor, form, index)
            return self.load(tensor, index, mask)
        prim = Prim(node.op)
        out = self.graph.types[tensor]
        if prim is Prim.FILL:
            return literal(node.attrs["value"], out.dtype)
        if prim in UNARY or prim in BINARY or prim is Prim.WHERE:
            return self._elementwise(node, prim, index, mask)
        if prim in REDUCTIONS:
            hit = self.rows.get((tensor, tuple(i.expr for i in index)))
            if hit is not None:
                return hit
            if self.on_reduce is None:
                raise Unsupported(f"{node.name}: a reduction read at another index than its own row")
            return self.on_reduce(node, index, mask)
        if prim is Prim.WINDOW_REDUCE:
            return self._window(node, index, mask)
        mapper = _LAYOUT.get(prim)
        if mapper is None:
            raise Unsupported(f"{node.name}: {prim.value} cannot be generated in Triton")
        return mapper(self, node, index, mask)

    def _elementwise(self, node: Node, prim: Prim, index: tuple[Ix, ...], mask: Mask) -> Val:
        args = [self.value(t, index, mask) for t in node.inputs]
        out = self.graph.types[node.outputs[0]].dtype
        folded = fold_literal(prim, args, out)
        if folded is not None:
            return folded
        if prim is Prim.WHERE and args[0].is_literal:
            # A constant condition (a FILL: Dropout's mask) picks one operand; written as
            # tl.where(1, ...) it is an int32 condition, which Triton deprecates (found by the fuzzer).
            return args[1] if args[0].literal else args[2]
        if all(a.is_literal for a in args):  # give Triton a tensor to work on
            # 0-d, like every value of no index (deps): stores and 2-D blocks broadcast it by
            # splatting. tl.full([1], ...) was rank 1, and a row kernel's tl.broadcast_to(v,
            # [XBLOCK, 1]) of it failed (a 1x1 input's BatchNorm, found by the fuzzer).
            a0 = args[0]
            args[0] = Val(f"tl.full([], {a0.expr}, {COMPUTE[a0.dtype]})", a0.dtype)
        deps = frozenset().union(*(a.deps for a in args))
        expr = elementwise(prim, args, out, node.attrs, lambda e, d: self.emit(e, d))
        return Val(self.emit(expr, deps), out, deps)

    # ---- pooling -----------------------------------------------------------------------
    def _window(self, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
        a = node.attrs
        x = node.inputs[0]
        xs = self.graph.types[x].shape
        out = self.graph.types[node.outputs[0]]
        k = len(a["kernel"])
        lead = len(xs) - k
        is_max = a["kind"] == "max"
        ident = '-float("inf")' if is_max else "0.0"
        if not out.dtype.is_float:
            raise Unsupported("integer pooling")
        # The accumulator lives in the current scope: the window loops run there.
        base = self.stack[-1].avail
        acc = self.fresh("acc")
        self.stmt(f"{acc} = tl.full({self.shape_of(base)}, {ident}, {COMPUTE[out.dtype]})")
        conds: set[str] = set()
        coords = list(index[:lead])
        depth = 0
        for d in range(k):
            tag = self.fresh("w")
            self.push(f"for {tag} in range({a['kernel'][d]}):", tag)
            depth += 1
            kd = Ix(tag, None, a["kernel"][d], frozenset({tag}))
            pos = ix.add_const(ix.add(ix.mul(index[lead + d], a["strides"][d]), ix.mul(kd, a["dilations"][d])),
                               -a["pads"][d])
            pos = self.index_var(pos)
            n = xs[lead + d]
            last = (out.shape[lead + d] - 1) * a["strides"][d] + (a["kernel"][d] - 1) * a["dilations"][d] - a["pads"][d]
            checks = ([f"({pos.expr} >= 0)"] if a["pads"][d] else []) + ([f"({pos.expr} < {n})"] if last >= n else [])
            if checks:
                conds.add(self.cond(" & ".join(checks), pos.deps))
            coords.append(Ix(pos.expr, None, None, pos.deps))
        inner = mask | frozenset(conds)
        v = self.value(x, coords, inner)
        valid = self.mask_expr(frozenset(conds))
        term = f"tl.where({valid}, {v.expr}, {ident})" if valid else v.expr
        if is_max:
            self.stmt(f"{acc} = tl.maximum({acc}, {term}, propagate_nan=tl.PropagateNan.ALL)")
        else:
            self.stmt(f"{acc} = {acc} + {term}")
        for _ in range(depth):
            self.pop()
        self.var_deps[acc] = base
        return Val(acc, out.dtype, base)


# ---- layout primitives: output index -> input index ----------------------------------------
def _transpose(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    perm = node.attrs["perm"]
    src = [Ix.of(0)] * len(perm)
    for i, p in enumerate(perm):
        src[p] = index[i]
    return em.value(node.inputs[0], src, mask)


def _swapped(em: Emitter, find: Callable[[Graph, dict[str, Node], Node], HalvesSwap | None], node: Node,
             index: tuple[Ix, ...], mask: Mask) -> Val | None:
    """`node` read from the kernel's registers where it swaps its tensor's elements (`codegen/rotary.py`:
    `find` recognises the form) and the kernel driver holds every lane's partner (`Emitter.swap`): each
    lane's partner with the sign of its run's first or second part. None where it does not."""
    sw = find(em.graph, em.producer, node) if em.swap is not None else None
    v = em.swap(sw, index, mask) if sw is not None else None
    if v is None:
        return None
    first, second = (em.emit(f"-{v.expr}", v.deps) if sgn < 0 else v.expr for sgn in sw.signs)
    if first == second:
        return Val(first, v.dtype, v.deps)
    pos = index[sw.axis]  # halves: d < s; pairs: d even
    c = em.cond(f"({pos.expr}) % 2 == 0" if sw.pairs else f"{pos.expr} < {sw.half}", pos.deps)
    deps = v.deps | pos.deps
    return Val(em.emit(f"tl.where({c}, {first}, {second})", deps), v.dtype, deps)


def _reshape(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    swapped = _swapped(em, pairs_swap, node, index, mask)  # rotate_every_two, sign * x[d ± 1]
    if swapped is not None:
        return swapped
    out = em.graph.types[node.outputs[0]].shape
    ins = em.graph.types[node.inputs[0]].shape
    return em.value(node.inputs[0], ix.reshape_index(index, out, ins), mask)


def _broadcast(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    ins = em.graph.types[node.inputs[0]].shape
    out = em.graph.types[node.outputs[0]].shape
    src = [Ix.of(0) if n == 1 and m != 1 else i for i, n, m in zip(index, ins, out)]
    return em.value(node.inputs[0], src, mask)


def _slice(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    src = []
    for i, start, step in zip(index, node.attrs["starts"], node.attrs["steps"]):
        if step > 0 or i.const is not None:
            src.append(ix.add_const(ix.mul(i, step), start))
        else:  # counting down from start: stays in [0, start]
            src.append(Ix(f"{start} - {ix._paren(ix.mul(i, -step).expr)}", None, start + 1, i.deps))
    return em.value(node.inputs[0], src, mask)


def _pad(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    x = node.inputs[0]
    shape = em.graph.types[x].shape
    r = len(shape)
    pads = node.attrs["pads"]
    mode = node.attrs["mode"]
    src: list[Ix] = []
    conds: list[str] = []
    for d, (i, n) in enumerate(zip(index, shape)):
        lo, hi_pad = pads[d], pads[d + r]
        if not lo and not hi_pad:
            src.append(i)
            continue
        j = em.index_var(ix.add_const(Ix(i.expr, None, None, i.deps), -lo))
        if mode == "constant":
            checks = ([f"({j.expr} >= 0)"] if lo else []) + ([f"({j.expr} < {n})"] if hi_pad else [])
            conds.append(em.cond(" & ".join(checks), j.deps))
            src.append(Ix(j.expr, None, None, j.deps))
        elif mode == "edge":
            src.append(em.index_var(Ix(f"tl.minimum(tl.maximum({j.expr}, 0), {n - 1})", None, n, j.deps)))
        elif mode == "reflect":
            if lo >= n or hi_pad >= n:
                raise Unsupported(f"{node.name}: reflect padding wider than the input")
            refl = f"tl.where({j.expr} < 0, -{j.expr}, tl.where({j.expr} >= {n}, {2 * (n - 1)} - {j.expr}, {j.expr}))"
            src.append(em.index_var(Ix(refl, None, n, j.deps)))
        else:
            raise Unsupported(f"{node.name}: pad mode {mode!r}")
    if not conds:
        return em.value(x, src, mask)
    v = em.value(x, src, mask | frozenset(conds))
    fill = literal(node.attrs.get("value", 0), em.graph.types[x].dtype)
    valid = em.mask_expr(frozenset(conds))
    deps = v.deps | em.mask_deps(frozenset(conds))
    return Val(em.emit(f"tl.where({valid}, {v.expr}, {fill.expr})", deps), v.dtype, deps)


def _concat(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    swapped = _swapped(em, halves_swap, node, index, mask)  # rotate_half, sign(d) * x[d ± s]
    if swapped is not None:
        return swapped
    axis = node.attrs["axis"]
    pos = index[axis]
    parts: list[tuple[str | None, Val]] = []
    start = 0
    for t in node.inputs:
        n = em.graph.types[t].shape[axis]
        if n == 0:
            continue
        end = start + n
        checks = ([f"({pos.expr} >= {start})"] if start else []) + ([f"({pos.expr} < {end})"] if pos.hi is None or end < pos.hi else [])
        c = em.cond(" & ".join(checks), pos.deps) if checks else None
        sub = list(index)
        shifted = ix.add_const(Ix(pos.expr, None, None, pos.deps), -start)
        sub[axis] = Ix(shifted.expr, shifted.const, None, shifted.deps) if start else pos
        parts.append((c, em.value(t, sub, mask | ({c} if c else frozenset()))))
        start = end
    # Nested where from the last part outwards; the first part needs no test.
    _, acc = parts[-1]
    expr = acc.expr
    deps = acc.deps
    for c, v in reversed(parts[:-1]):
        expr = f"tl.where({c}, {v.expr}, {expr})" if c else v.expr
        deps |= v.deps | (em.cond_deps[c] if c else frozenset())
    dtype = parts[0][1].dtype
    return Val(em.emit(expr, deps), dtype, deps)


def _wrapped(em: Emitter, idx: Val, extent: int) -> Ix:
    j = em.emit(f"tl.where({idx.expr} < 0, {idx.expr} + {extent}, {idx.expr})", idx.deps, "i")
    return Ix(j, None, extent, idx.deps)


def _gather(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    data, indices = node.inputs
    axis = node.attrs["axis"]
    q = em.graph.types[indices].rank
    extent = em.graph.types[data].shape[axis]
    idx = em.value(indices, index[axis:axis + q], mask)
    # Constant indices that are all non-negative need no wrap (ONNX requires them below the extent).
    table = em.graph.constants.get(indices)
    j = Ix(idx.expr, None, extent, idx.deps) if table is not None and (table >= 0).all() and not idx.is_literal \
        else _wrapped(em, idx, extent)
    return em.value(data, list(index[:axis]) + [j] + list(index[axis + q:]), mask)


def _gather_elements(em: Emitter, node: Node, index: tuple[Ix, ...], mask: Mask) -> Val:
    data, indices = node.inputs
    axis = node.attrs["axis"]
    extent = em.graph.types[data].shape[axis]
    j = _wrapped(em, em.value(indices, index, mask), extent)
    src = list(index)
    src[axis] = j
    return em.value(data, src, mask)


_LAYOUT: dict[Prim, Callable[[Emitter, Node, tuple[Ix, ...], Mask], Val]] = {
    Prim.TRANSPOSE: _transpose, Prim.RESHAPE: _reshape, Prim.BROADCAST: _broadcast, Prim.SLICE: _slice,
    Prim.PAD: _pad, Prim.CONCAT: _concat, Prim.GATHER: _gather, Prim.GATHER_ELEMENTS: _gather_elements,
}
