"""What the GEMM and convolution templates share: an output tile, its dot operands and its epilogue.

A template program owns one BLOCK_M x BLOCK_N tile of a product (one batch entry, or one group
of a grouped convolution, per grid row). `Tile` holds the tile's indices and masks in the
kernel's emitter, with program ids swizzled in groups of GROUP_M tile rows so that programs
running together share operand tiles in L2. `dot_operand` loads or computes one operand tile
in the dot's input type, `store_outputs` runs the epilogue from the accumulator through the
emitter (the product is a known value at the tile's indices, so it is never read back), and
`jit_function` renders one `@triton.jit` function of the template.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from math import prod
from typing import Protocol, Sequence

from tessera.codegen import index as ix
from tessera.codegen.emitter import Emitter
from tessera.codegen.index import Ix
from tessera.codegen.kernels import KernelBody, render
from tessera.codegen.rotary import put_back
from tessera.codegen.triton_ops import PDL_PARAM, PDL_PROLOGUE, STORAGE, TF32_ROUND, Unsupported, Val
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import PASS_THROUGH, Category, Prim

MIN_BLOCK = 16  # tl.dot's smallest block on every GPU Triton supports
GRID_Y_MAX = 65535  # CUDA's grid limit on the batch axis
DOT_TYPES = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TileSchedule(Protocol):
    """What a tile needs of a template's schedule."""

    @property
    def block_m(self) -> int: ...

    @property
    def block_n(self) -> int: ...

    @property
    def group_m(self) -> int: ...


@dataclass(frozen=True)
class DotMath:
    """How a template multiplies: the dot's operand type, its `input_precision` argument, and
    whether fp32 operands are rounded to tf32 first."""

    dot_type: str
    precision: str  # "" or ', input_precision="..."'
    tf32: bool

    @property
    def label(self) -> str:
        """The products' math for a kernel header."""
        return self.precision.split('"')[1] if self.precision else self.dot_type.removeprefix("tl.")


def dot_math(dtype: DType, other: DType, precision: str, what: str) -> DotMath:
    """The math of a template whose operands are `dtype` and `other` under the plan's `precision`
    (fp32 operands multiply in IEEE fp32, as the libraries do there, or tf32 where the plan says)."""
    if dtype != other or dtype not in DOT_TYPES:
        raise Unsupported(f"{what} multiplies fp32, fp16 or bf16, not {dtype.value} x {other.value}")
    prec = ""
    if dtype is DType.FLOAT32:
        prec = ', input_precision="tf32"' if precision == "tf32" else ', input_precision="ieee"'
    return DotMath(STORAGE[dtype], prec, dtype is DType.FLOAT32 and precision == "tf32")


class Tile:
    """One function of a template: the tile's indices and masks in its emitter.

    `shape` is the product's [*batch, M, N]; the batch entries (or a grouped convolution's
    groups) run along the grid's second axis.
    """

    def __init__(self, k: KernelBody, shape: tuple[int, ...], s: TileSchedule) -> None:
        self.k, self.em = k, k.em
        em = self.em
        *batch, self.m, self.n = shape
        self.nbatch = prod(batch)
        em.stack[0].avail = frozenset({"b", "m", "n"})
        em.shape_of = lambda deps: "[BLOCK_M, BLOCK_N]"
        tm, tn = cdiv(self.m, s.block_m), cdiv(self.n, s.block_n)
        # Swizzle: consecutive programs walk GROUP_M tile rows down one tile column, then the next.
        self.header = ["pid = tl.program_id(0)"]
        if s.group_m > 1 and tm > 1 and tn > 1:
            self.header += [f"group = GROUP_M * {tn}", "first_m = (pid // group) * GROUP_M",
                            f"rows = tl.minimum({tm} - first_m, GROUP_M)",
                            "pid_m = first_m + (pid % group) % rows", "pid_n = (pid % group) // rows"]
        elif tn == 1:
            self.header += ["pid_m = pid", "pid_n = 0"]
        else:
            self.header += [f"pid_m = pid // {tn}", f"pid_n = pid % {tn}"]
        if self.nbatch > 1:
            self.header.append("pid_b = tl.program_id(1)")
        self.header += ["rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
                        "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]"]
        # A size-1 extent is index 0, as the emitter's index maps write it (reshape_index drops
        # such dims); lanes past it stay masked.
        self.rm = Ix("rm", None, self.m, frozenset({"m"})) if self.m > 1 else Ix.of(0)
        self.rn = Ix("rn", None, self.n, frozenset({"n"})) if self.n > 1 else Ix.of(0)
        bdep = frozenset({"b"})
        self.batch = ix.unravel(Ix("pid_b", None, self.nbatch, bdep), batch) if self.nbatch > 1 \
            else [Ix.of(0)] * len(batch)
        self.mask: frozenset[str] = frozenset(
            ([em.cond(f"rm < {self.m}", frozenset({"m"}))] if self.m % s.block_m else [])
            + ([em.cond(f"rn < {self.n}", frozenset({"n"}))] if self.n % s.block_n else []))
        self.mmask = frozenset(c for c in self.mask if em.cond_deps[c] == {"m"})
        self.nmask = frozenset(c for c in self.mask if em.cond_deps[c] == {"n"})

    @property
    def coords(self) -> list[Ix]:
        return [*self.batch, self.rm, self.rn]

    def workspace_offset(self, split: str) -> str:
        """Where this tile's partial sums of slice `split` live in a split-K workspace."""
        base = f"({split} * {self.nbatch} + pid_b) * {self.m * self.n}" if self.nbatch > 1 \
            else f"{split} * {self.m * self.n}"
        return f"{base} + rm * {self.n} + rn"


def stored_rounded(graph: Graph, em: Emitter, tensor: str) -> bool:
    """Does `tensor`, as this kernel computes it, hold bits its writer rounded to tf32: a tensor the
    kernel loads from `Graph.tf32_rounded`, or views of one computed here? A value computed here
    from anything else (an operand prologue) is not rounded yet."""
    while tensor not in em.inputs:
        p = em.producer.get(tensor)
        if p is None or p.op not in PASS_THROUGH:
            return False
        tensor = p.inputs[0]
    return tensor in graph.tf32_rounded


def dot_operand(t: Tile, graph: Graph, math: DotMath, tensor: str, coords: list[Ix], mask: frozenset[str],
                zero: frozenset[str], shape: str, axes: set[str] | frozenset[str], pointer: Ix | None = None,
                layout: tuple[int, ...] | None = None) -> str:
    """An operand tile in the dot's input type (`shape`, over the loop tags `axes`).

    A tensor from memory is loaded as stored (through `pointer` when the caller has built its
    addresses, else at `coords` in its storage order: `layout` where the runtime stores this
    kernel's copy in another, `KernelSource.input_layouts`), under the conditions of `mask` that its
    address depends on; one a free prologue computes is computed at `coords`. Lanes where a
    condition of `zero` fails are zeroed (lanes past K, a convolution's padding): a masked load
    gives 0 there, but 1/0 or log(0) of a computed value would not. A value constant along an
    axis (a size-1 M, a broadcast operand) is broadcast to the full tile.
    """
    em = t.em
    ty = graph.types[tensor]
    need = frozenset(axes)
    if tensor in em.inputs:
        if pointer is None:
            off = em.index_var(ix.ravel_stored(coords, ty.shape, ty.layout if layout is None else layout))
            pointer = Ix(f"{em.inputs[tensor]} + {off.expr}", None, None, off.deps)
        m = em.mask_expr(mask, pointer.deps)
        v = em.emit(f"tl.load({pointer.expr}" + (f", mask={m}, other=0.0)" if m else ")"), pointer.deps, "a")
        deps = pointer.deps
        zero = frozenset(c for c in zero if not em.cond_deps[c] <= pointer.deps)  # K has extent 1 here
    else:
        val = em.value(tensor, coords, mask)
        if val.is_literal:
            v, deps = f"tl.full({shape}, {val.expr}, tl.float32)", need
        else:
            v, deps = val.expr, val.deps
    km = em.mask_expr(zero)
    if km:
        deps = deps | em.mask_deps(zero)
        v = em.emit(f"tl.where({km}, {v}, 0.0)", deps)
    if math.dot_type != "tl.float32" and (km or tensor not in em.inputs):
        v = em.emit(f"({v}).to({math.dot_type})", deps)
    if math.tf32:
        if tensor in em.inputs and tensor in graph.constants \
                and sum(tensor in n.inputs for n in t.k.nodes) == 1:
            # A constant only the dot reads: the runtime stores it rounded (the same bits), so the
            # loop spends no ALU work on it and the tensor cores read it exactly.
            t.k.rounded.add(tensor)
        elif stored_rounded(graph, em, tensor):
            pass  # its writer stored it rounded (Graph.tf32_rounded): wgmma reads it from shared memory
        else:
            v = em.emit(TF32_ROUND.format(x=v), deps)
    if not need <= deps:
        v = em.emit(f"tl.broadcast_to({v}, {shape})", need | deps)
    return v


def store_outputs(t: Tile, graph: Graph, outputs: Sequence[str], product: str, coords: list[Ix],
                  acc: Val | None = None) -> None:
    """Every output from the accumulator (`acc`, default the variable `acc`), which holds `product`
    at `coords` (the tile's indices): each output at its own indices (a reshape of the product's),
    or, for an output of a slice of the product (`partial_outputs`), at the slice's indices of the
    tile's lanes that fall in it, with the other lanes masked off."""
    em = t.em
    tc = graph.types[product]
    em.known[(product, tuple(i.expr for i in coords))] = acc or Val("acc", tc.dtype, frozenset({"b", "m", "n"}))
    # A slice of the product, or an output past a transpose (a 1x1 convolution's NCHW result of a
    # product over pixel rows), is stored at indices mapped forward from the tile's; any other
    # output is a reshape of the product's elements.
    fwd = partial_outputs(graph, t.k.nodes, product)
    moved = {o for o in outputs if graph.types[o].numel != tc.numel or _past_transpose_or_put_back(fwd, o)}
    at = _forward_coords(t, graph, fwd, coords) if moved else {}
    for o in outputs:
        ty = graph.types[o]
        oc, conds = at[o] if o in moved else (ix.reshape_index(coords, tc.shape, ty.shape), frozenset())
        mask = t.mask | conds
        flat = em.index_var(ix.ravel_stored(oc, ty.shape, ty.layout))
        if not {"m", "n"} <= flat.deps:  # a size-1 M or N: the store still covers the tile (masked)
            deps = flat.deps | {"m", "n"}
            # (one element, M = N = 1: a literal offset, which tl.broadcast_to does not take; the fuzzer's
            # templates, session 56)
            wide = f"tl.full([BLOCK_M, BLOCK_N], {flat.expr}, tl.int32)" if flat.const is not None \
                else f"tl.broadcast_to({flat.expr}, [BLOCK_M, BLOCK_N])"
            flat = Ix(em.emit(wide, deps, "i"), None, None, deps)
        v = em.value(o, oc, mask)
        t.k.store(o, flat, v, mask, "[BLOCK_M, BLOCK_N]", frozenset({"m", "n"}))


def _past_transpose_or_put_back(fwd: dict[str, Node | None], t: str) -> bool:
    """Whether tensor `t` of `partial_outputs` is computed from the product through a transpose, or
    through a concat that puts a partial rotation back (its rest is read at the slice's shifted indices,
    which only the forward mapping registers: the 3-D RotaryEmbedding's reshape after it, session 61)."""
    while t in fwd and fwd[t] is not None:
        n = fwd[t]
        if n.op in (Prim.TRANSPOSE.value, Prim.CONCAT.value):
            return True
        t = next(i for i in n.inputs if i in fwd)
    return False


def partial_outputs(graph: Graph, nodes: Sequence[Node], product: str) -> dict[str, Node | None]:
    """The tensors a template's epilogue can write at indices mapped forward from the product's:
    the product (None), and each output of a node in `nodes` (topological order) that is an
    elementwise op whose product-derived inputs are one such tensor of its own shape, a reshape or
    transpose of one, or a unit-step slice of one (a merged QKV projection's Q, K and V), with that
    node."""
    fwd: dict[str, Node | None] = {product: None}
    for n in nodes:
        reached = [i for i in dict.fromkeys(n.inputs) if i in fwd]
        if not reached or len(n.outputs) != 1:
            continue
        out = graph.types[n.outputs[0]]
        prim = Prim(n.op)
        if prim in (Prim.RESHAPE, Prim.SLICE, Prim.TRANSPOSE) and len(reached) == 1 and n.inputs[0] in fwd:
            if prim is Prim.SLICE and any(step != 1 for step in n.attrs["steps"]):
                continue
            fwd[n.outputs[0]] = n
        elif (prim.category is Category.ELEMENTWISE and len(reached) == 1
              and graph.types[reached[0]].shape == out.shape):
            fwd[n.outputs[0]] = n
        elif prim is Prim.CONCAT and _select_source(graph, fwd, n) is not None:
            fwd[n.outputs[0]] = n
    return fwd


def _select_source(graph: Graph, fwd: dict[str, Node | None], n: Node) -> str | None:
    """The tensor of `fwd` that concat `n` puts back together beside a rotated part (`rotary.put_back`):
    n is stored at that tensor's indices. None for any other concat."""
    t = put_back(graph, {o: m for o, m in fwd.items() if m is not None}, n)
    return t if t in fwd and n.inputs[1] in fwd else None


def _forward_coords(t: Tile, graph: Graph, fwd: dict[str, Node | None],
                    coords: list[Ix]) -> dict[str, tuple[list[Ix], frozenset[str]]]:
    """Each tensor of `fwd` (`partial_outputs`) at the tile's lanes: its indices there and the
    conditions under which a lane holds one of its elements. At a slice the value is registered as
    known at the shifted indices, so the emitter reads it from the tile's product, never from memory."""
    em = t.em
    at: dict[str, tuple[list[Ix], frozenset[str]]] = {}
    for out, n in fwd.items():
        if n is None:  # the product
            at[out] = (list(coords), frozenset())
            continue
        src = next(i for i in n.inputs if i in at)
        c, conds = at[src]
        ins, outs = graph.types[src].shape, graph.types[out].shape
        if n.op == Prim.RESHAPE.value:
            at[out] = (ix.reshape_index(c, ins, outs), conds)
        elif n.op == Prim.TRANSPOSE.value:  # out[j] = in[perm[j]]: the same element, its indices permuted
            at[out] = ([c[p] for p in n.attrs["perm"]], conds)
        elif n.op == Prim.SLICE.value:
            shifted: list[Ix] = []
            for i, start, n_in, n_out in zip(c, n.attrs["starts"], ins, outs):
                if n_out == n_in:
                    shifted.append(i)
                    continue
                test = f"({i.expr} >= {start}) & ({i.expr} < {start + n_out})" if start else f"{i.expr} < {n_out}"
                conds = conds | {em.cond(test, i.deps)}
                shifted.append(Ix(ix.add_const(i, -start).expr, None, None, i.deps))
            em.known[(out, tuple(i.expr for i in shifted))] = em.value(src, c, t.mask | conds)
            at[out] = (shifted, conds)
        elif n.op == Prim.CONCAT.value:  # a partial rotation put back: at its source's, the rest's slice's input
            at[out] = at[fwd[n.inputs[1]].inputs[0]]
        else:
            at[out] = (c, conds)
    return at


def sum_slices(t: Tile, pid: str, split: int, elements: int, tiles: int) -> int:
    """After a split walk (program `pid` of `split` per tile computed its slice's partial `acc`):
    store the partial, count it in, and open the block where the tile's last program sums the
    slices in order as `tot` (the same bits whichever program comes last); the caller emits the
    epilogue in that block and closes it (`t.em.pop()`). `elements`: the product's elements over
    all batch entries; `tiles`: output tiles over all batch entries. Returns the workspace's
    float32 elements: the partials, then one arrival counter per tile, zero between launches (the
    runtime allocates it zeroed; the last program resets its counter). One launch, where a
    separate summing kernel would cost another."""
    em = t.em
    m = em.mask_expr(t.mask)
    parts = split * elements
    em.stmt(f"tl.store(ws + {t.workspace_offset(pid)}, acc" + (f", mask={m})" if m else ")"))
    # Every thread's partial is written before the counter moves (the atomic orders it for the GPU).
    em.stmt("tl.debug_barrier()")
    counter = f"ws + {parts} + " + (f"pid_b * {tiles // t.nbatch} + pid" if t.nbatch > 1 else "pid")
    em.stmt(f"arrived = tl.atomic_add({counter}, 1.0)")
    em.push(f"if arrived == {split - 1}:", "fix")
    em.stmt(f"tl.store({counter}, 0.0)")
    em.stmt("tot = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
    em.push(f"for split in tl.static_range({split}):", "split")  # unrolled: the loads in flight together
    # .cg: read at L2, where the other programs' partials are (never a stale line of this SM's L1)
    em.stmt(f"tot += tl.load(ws + {t.workspace_offset('split')}" + (f", mask={m}, other=0.0" if m else "")
            + ', cache_modifier=".cg")')
    em.pop()
    return parts + tiles


def check_outputs(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], product: str, what: str,
                  form: str, reached: Sequence[str] = ()) -> None:
    """A template writes each product element at most once per output: every output is the product
    or computed from it (an operand's prologue value is read at K indices, never stored at the
    tile's), and has the product's size, or is a slice of it that `partial_outputs` can map.
    `reached`: the tensors the tile holds, where more than `product` (`gemm.column_slices`)."""
    c = graph.types[product].numel
    reach = {product, *reached}
    for n in nodes:  # topological order
        if any(t in reach for t in n.inputs):
            reach.update(n.outputs)
    partial: dict[str, Node | None] | None = None
    for o in outputs:
        if o not in reach:
            raise Unsupported(f"output {o} is not computed from the {what}: a {form} template stores only "
                              f"the product and its epilogue")
        if graph.types[o].numel != c:
            partial = partial_outputs(graph, nodes, product) if partial is None else partial
            if o not in partial:
                raise Unsupported(f"output {o} has {graph.types[o].numel} elements, the {what} {c}: "
                                  f"a {form} epilogue writes one value per product element, or a slice of them")


def jit_function(fn: str, params: str, t: Tile, consts: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """One @triton.jit function: the tile's header (and `extra` lines after it), then its body;
    `consts` are its constexpr parameters."""
    body: list[str] = []
    render(t.em.stack[0], "    ", body)
    return ["@triton.jit", f"def {fn}({params}, {', '.join(f'{c}: tl.constexpr' for c in consts)}, {PDL_PARAM}):"] + \
        [f"    {h}" for h in [*PDL_PROLOGUE, *t.header, *extra]] + body


def _stored_note(k: KernelBody, t: str) -> str:
    """How the runtime stores a constant argument for this kernel, where not as the graph does."""
    notes = ([f"stored in dim order {''.join(map(str, k.layouts[t]))}"] if t in k.layouts else []) \
        + (["rounded to tf32"] if t in k.rounded else [])
    return f" ({', '.join(notes)} once, at load)" if notes else ""


def describe(graph: Graph, nodes: Sequence[Node], root: Node, k: KernelBody, sources: Sequence[str],
             workspace: int = 0) -> list[str]:
    """Header lines shared by templates: the epilogue and prologue primitives, the ONNX nodes,
    and the arguments."""
    reach = {root.outputs[0]}
    for n in nodes:
        if n is not root and any(t in reach for t in n.inputs):
            reach.update(n.outputs)
    epi = [n for n in nodes if n is not root and any(t in reach for t in n.inputs)]
    pro = [n for n in nodes if n is not root and n not in epi]
    doc = textwrap.wrap("epilogue: " + (", ".join(f"{n.name} ({n.op})" for n in epi) or "none"), 100,
                        initial_indent="# ", subsequent_indent="#   ")
    if pro:
        doc += textwrap.wrap("operand/epilogue prologue: " + ", ".join(f"{n.name} ({n.op})" for n in pro), 100,
                             initial_indent="# ", subsequent_indent="#   ")
    if sources:
        doc += textwrap.wrap("ONNX nodes: " + ", ".join(sources), 100, initial_indent="# ",
                             subsequent_indent="#   ")
    doc += [f"# in{i}: {t} {graph.types[t]}" + _stored_note(k, t) for i, t in enumerate(k.inputs)]
    if workspace:
        doc.append(f"# ws: float32[{workspace}] split-K partial sums")
    doc += [f"# {arg}: {t} {graph.types[t]}" for t, arg in k.out_args.items()]
    return doc
