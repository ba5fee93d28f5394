"""Which backend runs each kernel, and the code generator's say in legality.

The fallback chain is explicit:

1. a kernel of reshapes only is a view of its input (no launch);
2. a kernel with a linear primitive runs it through torch (cuBLAS/cuDNN on
   the GPU), with a bias add and a ReLU (or, after a matmul, a tanh GELU) inside
   the library call where it takes them, and the rest of its epilogue as one
   generated Triton kernel; or, when its schedule is a template's (chosen by
   measurement), the linear primitive and its whole epilogue run as one
   generated template kernel: a matmul under a `GemmSchedule`
   (`codegen/gemm.py`), a 2-D convolution under a `ConvSchedule`
   (`codegen/conv.py`); a kernel with two matmuls (a GEMM chain, attention)
   has only the template form, under a `ChainSchedule` (`codegen/chain.py`);
3. any other memory-intensive kernel is one generated Triton kernel;
4. an opaque primitive, or a single primitive the generator cannot handle,
   runs through torch (`runtime/torch_prims.py`).

So every single primitive is a legal kernel, and a group of several is legal
only when the generator can produce it (`TritonLegality`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import ml_dtypes
import numpy as np

from tessera.codegen.chain import chain_roots, generate_chain
from tessera.codegen.conv import generate_conv
from tessera.codegen.gelu import GELU_TANH, gelu_tanh_nodes
from tessera.codegen.gemm import generate_gemm
from tessera.codegen.kernels import (AnySchedule, ChainSchedule, ConvSchedule, GemmSchedule, KernelSource,
                                     generate)
from tessera.codegen.triton_ops import Unsupported
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Category, Prim
from tessera.ir.signature import kernel_signature
from tessera.orchestrate.candidates import StructuralLegality, transposes_matrix
from tessera.orchestrate.graphview import OGraph, bits, is_view, prologue_of  # noqa: F401 - prologue_of is used from here too


@dataclass
class KernelImpl:
    """How one plan kernel runs.

    backend: "triton" (`triton` computes everything), "linear" (`linear`
    through torch, then `triton` for the epilogue if any), "template" (`triton`
    is a GEMM or convolution template computing `linear` and its epilogue), "view" (reshapes
    only: aliases of their input, no launch), or "torch" (`prims` through
    torch; `reason` says why not Triton). `folded` are free prologue
    nodes only torch reads: they depend on constants alone, so the runtime
    computes them once.
    """

    name: str
    backend: str
    prims: list[Node]
    prologue: list[Node]
    outputs: list[str]
    triton: KernelSource | None = None
    linear: Node | None = None
    reason: str = ""
    folded: list[Node] = field(default_factory=list)
    # Linear kernels: what the library call absorbs. `bias` holds one value per output column
    # (matmul) or channel (conv), or for a matmul anything that broadcasts to its sum: a constant's
    # (flattened at load) or a tensor computed before the call. `alpha` scales a matmul's product
    # before the bias (a Gemm's alpha). `fused` are the
    # epilogue nodes the call computes (the scale and the bias add, then the nodes of `activation`: None,
    # "relu" or "gelu_tanh", cuBLASLt's RELU_BIAS and GELU_BIAS epilogues). `cut` (fp16/bf16, a property) is
    # the SLICE, the first of `fused`, that cuts a result whose channels (columns) the layout pass
    # padded back to the bias add's shape: the call adds the bias zero-padded, then cuts its result.
    bias: str | None = None
    activation: str | None = None
    fused: list[Node] = field(default_factory=list)
    alpha: float = 1.0
    # Transposes of a matmul operand (`operand_views`) the library call reads as strided views.
    views: list[Node] = field(default_factory=list)

    @property
    def nodes(self) -> list[Node]:
        return self.prologue + self.prims

    @property
    def cut(self) -> Node | None:
        """The SLICE leading `fused` (`_library_epilogue` puts one there only to cut padding back)."""
        return self.fused[0] if self.fused and self.fused[0].op == Prim.SLICE.value else None


def bias_axis(root: Node) -> int:
    """The axis of a linear result its bias varies along: a matmul's columns (last), a conv's channels."""
    return -1 if root.op == Prim.MATMUL.value else 1


def _linear_root(nodes: Sequence[Node]) -> Node | None:
    lin = [n for n in nodes if Prim(n.op).category is Category.LINEAR]
    return lin[0] if lin else None


def _epilogue(graph: Graph, nodes: Sequence[Node], root: Node) -> list[Node]:
    """The nodes computed from the linear result; the rest (free prologue of the root) stays with torch."""
    reach = set(root.outputs)
    epi = []
    for n in nodes:
        if n is not root and any(t in reach for t in n.inputs):
            reach.update(n.outputs)
            epi.append(n)
    needed: dict[str, Node] = {o: n for n in nodes for o in n.outputs}
    # Free prologue nodes the epilogue reads (bias reshapes/broadcasts) come along.
    todo = [t for n in epi for t in n.inputs]
    extra: dict[str, Node] = {}
    while todo:
        t = todo.pop()
        p = needed.get(t)
        if p is None or p is root or p in epi or p.name in extra:
            continue
        extra[p.name] = p
        todo.extend(p.inputs)
    return list(extra.values()) + epi


def implement(graph: Graph, prims: Sequence[Node], prologue: Sequence[Node], outputs: Sequence[str], name: str,
              sources: Sequence[str] = (), schedule: AnySchedule | None = None,
              precision: str = "fp32") -> KernelImpl:
    """Choose the backend of one kernel (its orchestrated `prims` and free `prologue`) and generate its code.

    Tensors are addressed in the layouts their types carry (`TensorType.layout`). A `GemmSchedule`
    makes a matmul kernel a GEMM template, a `ConvSchedule` a 2-D convolution kernel a convolution
    template (`precision`, the plan's, picks their fp32 math: tf32 or IEEE). Raises `Unsupported`
    for a group of several primitives that has no Triton form, or a template schedule for a
    kernel that has no template form.
    """
    root = _linear_root(prims)
    prims, prologue = list(prims), list(prologue)
    nodes = prologue + prims
    if any(n.op == Prim.OPAQUE.value for n in prims):
        return KernelImpl(name, "torch", prims, prologue, list(outputs), reason="opaque operator", folded=prologue)
    if not prologue and all(is_view(graph, n) for n in prims):
        # Row-major reshapes of a row-major tensor are views: no kernel, no copy. Any other
        # layout makes the reshape a copy, which the generator writes.
        return KernelImpl(name, "view", prims, prologue, list(outputs))
    if isinstance(schedule, ChainSchedule):
        first = chain_roots(prims)
        if first is None:
            raise Unsupported("a GEMM-chain schedule for a kernel without a chain of two matmuls")
        return KernelImpl(name, "template", prims, prologue, list(outputs), linear=first[1],
                          triton=generate_chain(graph, nodes, outputs, name, schedule, sources, precision))
    if linear_count(prims) > 1:
        raise Unsupported("a kernel of two linear primitives runs only as a GEMM-chain template")
    if isinstance(schedule, GemmSchedule):
        if root is None or root.op != Prim.MATMUL.value:
            raise Unsupported("a GEMM template schedule for a kernel without a matmul")
        return KernelImpl(name, "template", prims, prologue, list(outputs), linear=root,
                          triton=generate_gemm(graph, nodes, outputs, name, schedule, sources, precision))
    if isinstance(schedule, ConvSchedule):
        if root is None or root.op != Prim.CONV.value:
            raise Unsupported("a convolution template schedule for a kernel without a convolution")
        return KernelImpl(name, "template", prims, prologue, list(outputs), linear=root,
                          triton=generate_conv(graph, nodes, outputs, name, schedule, sources, precision))
    if root is not None:
        pre = operand_prologue(prims)
        if pre:
            raise Unsupported(f"{root.name}: a library call cannot compute its operands' prologue "
                              f"({', '.join(n.name for n in pre)}); a template schedule can")
        impl = KernelImpl(name, "linear", prims, prologue, list(outputs), linear=root, views=operand_views(prims))
        written = [o for n in impl.views for o in n.outputs if o in outputs]
        if written:
            raise Unsupported(f"{root.name}: a library call reads {written[0]} as a view and cannot write it")
        impl.bias, impl.fused, impl.activation, impl.alpha = _library_epilogue(graph, nodes, prologue, root, outputs)
        done = {root.name} | {n.name for n in impl.fused}
        epi = [n for n in _epilogue(graph, nodes, root) if n.name not in done]
        # Kept only by the fused add: the bias's own producers, folded once at load.
        epi = _live(epi, [o for o in outputs if not any(o in n.outputs for n in impl.fused) and o not in root.outputs])
        impl.folded = _live(prologue, [t for t in root.inputs if t] + ([impl.bias] if impl.bias else []))
        epi_out = [o for o in outputs if o not in root.outputs and not any(o in n.outputs for n in impl.fused)]
        if epi_out:
            impl.triton = generate(graph, epi, epi_out, name, schedule, sources)
        return impl
    try:
        return KernelImpl(name, "triton", prims, prologue, list(outputs),
                          triton=generate(graph, nodes, outputs, name, schedule, sources))
    except Unsupported as e:
        if len(prims) > 1:
            raise
        return KernelImpl(name, "torch", prims, prologue, list(outputs), reason=str(e), folded=prologue)


def linear_count(prims: Sequence[Node]) -> int:
    """How many linear primitives a kernel holds (two: a GEMM chain, `codegen/chain.py`)."""
    return sum(1 for n in prims if Prim(n.op).category is Category.LINEAR)


def needs_template(prims: Sequence[Node]) -> bool:
    """A kernel only a template computes: a linear primitive's operand prologue, or a GEMM chain."""
    return bool(operand_prologue(prims)) or linear_count(prims) > 1


def _live(nodes: list[Node], outputs: Sequence[str]) -> list[Node]:
    """The nodes of `nodes` that `outputs` need."""
    producer = {o: n for n in nodes for o in n.outputs}
    keep: dict[str, Node] = {}
    todo = list(outputs)
    while todo:
        n = producer.get(todo.pop())
        if n is not None and n.name not in keep:
            keep[n.name] = n
            todo.extend(n.inputs)
    return [n for n in nodes if n.name in keep]


def _library_epilogue(graph: Graph, nodes: Sequence[Node], prologue: Sequence[Node], root: Node,
                      outputs: Sequence[str]) -> tuple[str | None, list[Node], str | None, float]:
    """A bias add (and an activation after it) that the library call can absorb: (bias tensor,
    fused nodes, activation name or None, alpha). The bias is a constant (folded at load) or a tensor
    computed before the call. Before a matmul's bias add, its own node's scale by a constant
    (a Gemm's alpha) is the call's alpha.

    The bias must be a tensor that varies only along the output's column axis (matmul) or channel
    axis (conv), so it is one vector, broadcast to the output's shape or already of it. The activation is a ReLU,
    or after a matmul the tanh GELU (`codegen/gelu.py`); cuDNN convolutions take no GELU.
    """
    none: tuple[None, list[Node], None, float] = (None, [], None, 1.0)
    if not graph.types[root.outputs[0]].dtype.is_float:
        return none
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n)
    producer = {o: n for n in nodes for o in n.outputs}
    r = root.outputs[0]
    matmul = root.op == Prim.MATMUL.value
    # A result whose channels (matmul: columns) the layout pass padded is cut back by a SLICE
    # before the bias add (orchestrate/layout.py). In fp16/bf16 the call takes the bias zero-padded
    # and the cut follows it: left to the generated epilogue, the bias would be added to a result
    # already rounded to the narrow type, a second rounding that a bias nearly cancelling the sum
    # amplifies (the fuzzer's bf16 1x1 Conv, 2.2% off). A float32 result keeps its cut in the
    # epilogue, which also adds the bias: a second float32 rounding is noise, and a generated
    # kernel cuts the padded channels as it reads them, where the cut after the call is a copy.
    narrow = graph.types[r].dtype in (DType.FLOAT16, DType.BFLOAT16)
    cut = _cut_back(graph, readers, r, outputs, bias_axis(root) % graph.types[r].rank) if narrow else []
    r = cut[0].outputs[0] if cut else r
    # A matmul result may be reshaped (a view) before its bias add, if the columns stay last.
    views = cut + (_views(graph, readers, r, outputs, columns=True) if matmul else [])
    r = views[-1].outputs[0] if views else r
    scale, alpha = _alpha(graph, readers, producer, root, r, outputs) if matmul else (None, 1.0)
    r = scale.outputs[0] if scale is not None else r
    if r in outputs or len(readers.get(r, [])) != 1 or readers[r][0].op != Prim.ADD.value:
        return none
    add = readers[r][0]
    other = add.inputs[1] if add.inputs[0] == r else add.inputs[0]
    bcast = producer.get(other)
    # Broadcast to the result's shape, or already of it where every other axis is 1 (a Gemm of one
    # row: the fuzzer's bf16 case, session 41, whose generated add rounded the product first).
    src = bcast.inputs[0] if bcast is not None and bcast.op == Prim.BROADCAST.value else other
    # A bias another kernel computes (a Gemm's C given as a graph input) is read when the call runs;
    # one computed in this kernel is not a vector the call can take.
    inside = {o for n in nodes if n not in prologue and n is not bcast for o in n.outputs}
    added_shape = graph.types[r].shape
    axis = len(added_shape) - 1 if matmul else 1
    src_shape = graph.types[src].shape
    vector = _channel_vector(src_shape, added_shape, axis)
    if not matmul and not vector and bcast is None and src not in inside and narrow:
        # A conv's bias that another kernel broadcast (B given as a graph input): the call reads the
        # broadcast's one row of channels (the runtime indexes it). Rare, so the graph is searched here.
        up = next((n for n in graph.nodes if other in n.outputs), None)
        vector = up is not None and up.op == Prim.BROADCAST.value \
            and _channel_vector(graph.types[up.inputs[0]].shape, added_shape, axis)
    # A matmul's bias may also be any tensor that broadcasts to the sum (a Gemm's C of [M, N] or
    # [M, 1] given as a graph input): the call takes it expanded to the sum's rows and columns
    # (zero-padded to the padded columns where the result is cut).
    whole = matmul and len(src_shape) == len(added_shape) \
        and all(s in (1, n) for s, n in zip(src_shape, added_shape))
    if src in inside or not (vector or whole) or (scale is not None and add.source != root.source):
        return none
    fused = views + ([scale] if scale is not None else []) + [add]
    # A library call cannot round what it writes to tf32: a tensor stored rounded (Graph.tf32_rounded)
    # comes from the generated epilogue kernel.
    if any(o in graph.tf32_rounded for n in fused for o in n.outputs):
        return none
    a = add.outputs[0]
    nxt = readers.get(a, [])
    if a not in outputs and len(nxt) == 1 and nxt[0].op == Prim.MAX.value:
        mx = nxt[0]
        zero = producer.get(mx.inputs[1] if mx.inputs[0] == a else mx.inputs[0])
        if zero is not None and zero.op == Prim.FILL.value and float(zero.attrs["value"]) == 0.0:
            if mx.outputs[0] not in graph.tf32_rounded:
                return src, fused + [mx], "relu", alpha
            return src, fused, None, alpha
    if not matmul:
        return src, fused, None, alpha
    # Views of the sum may come before the GELU (GPT-2 adds in 2-D, then views it in 3-D), and
    # after it: the library result reshaped, rather than a copy kernel for the reshape alone.
    pre = _views(graph, readers, a, outputs)
    gelu = gelu_tanh_nodes(graph, nodes, prologue, pre[-1].outputs[0] if pre else a, outputs)
    if not gelu:
        return src, fused, None, alpha
    after = pre + gelu + _views(graph, readers, gelu[-1].outputs[0], outputs)
    if any(o in graph.tf32_rounded for n in after for o in n.outputs):
        return src, fused, None, alpha
    return src, fused + after, GELU_TANH, alpha


def _channel_vector(shape: Sequence[int], added: Sequence[int], axis: int) -> bool:
    """`shape` varies along `axis` alone, as much as the result it is added to."""
    return len(shape) == len(added) and shape[axis] == added[axis] \
        and all(n == 1 for d, n in enumerate(shape) if d != axis)


def _alpha(graph: Graph, readers: dict[str, list[Node]], producer: dict[str, Node], root: Node, t: str,
           outputs: Sequence[str]) -> tuple[Node | None, float]:
    """(the MUL that alone reads the product `t` and scales it by one constant value, that value), where
    the MUL is the matmul's own node's (a Gemm's alpha: `ops/linear.py`), else (None, 1.0). The value is
    the one the plan stores (a FILL's in the graph's float type), as a generated kernel would multiply by."""
    rs = readers.get(t, [])
    if t in outputs or len(rs) != 1 or rs[0].op != Prim.MUL.value or rs[0].source != root.source:
        return None, 1.0
    mul = rs[0]
    fill = producer.get(mul.inputs[1] if mul.inputs[0] == t else mul.inputs[0])
    if fill is None or fill.op != Prim.FILL.value:
        return None, 1.0
    dt = graph.types[fill.outputs[0]].dtype
    return mul, float(np.asarray(float(fill.attrs["value"])).astype(
        ml_dtypes.bfloat16 if dt is DType.BFLOAT16 else dt.to_numpy()))


def _cut_back(graph: Graph, readers: dict[str, list[Node]], t: str, outputs: Sequence[str],
              axis: int) -> list[Node]:
    """[the SLICE that alone reads `t` and keeps a leading part of `axis` only], or [] where there is none
    (or `t` is a kernel output: the library call writes only the last tensor it computes)."""
    rs = readers.get(t, [])
    if t in outputs or len(rs) != 1 or rs[0].op != Prim.SLICE.value:
        return []
    a, shape, out = rs[0].attrs, graph.types[t].shape, graph.types[rs[0].outputs[0]].shape
    if any(int(v) != 0 for v in a["starts"]) or any(int(v) != 1 for v in a["steps"]) or len(out) != len(shape) \
            or any(m != n for d, (m, n) in enumerate(zip(shape, out)) if d != axis):
        return []
    return [rs[0]]


def _views(graph: Graph, readers: dict[str, list[Node]], t: str, outputs: Sequence[str],
           columns: bool = False) -> list[Node]:
    """The reshapes that alone read `t`, then each other's result, while what they read is no kernel
    output (the library call writes only the last); with `columns`, those that keep the last axis."""
    chain: list[Node] = []
    while t not in outputs and len(readers.get(t, [])) == 1 and readers[t][0].op == Prim.RESHAPE.value \
            and (not columns or graph.types[readers[t][0].outputs[0]].shape[-1:] == graph.types[t].shape[-1:]):
        chain.append(readers[t][0])
        t = chain[-1].outputs[0]
    return chain


class TritonLegality:
    """StructuralLegality, then: a kernel of several primitives must have a Triton form.

    With `templates`, a linear kernel may compute its operands' prologue (`StructuralLegality`'s
    `prologues`); with `chains`, two matmuls joined through memory-bound primitives may share a
    kernel (a GEMM chain). Such kernels have only a template form, which the best-ranked template
    schedule must generate.

    `shared` maps a kernel's signature to its verdict across orchestrations: the rewrite search
    orchestrates hundreds of windows (a transformer's layers repeat the same kernels), and code
    generation was most of each window's price (bert_base: 22,560 kernels generated, 18 s of 44)."""

    def __init__(self, templates: bool = False, chains: bool = False,
                 shared: dict[str, str | None] | None = None) -> None:
        self.structural = StructuralLegality(prologues=templates, chains=chains)
        self.cache: dict[int, str | None] = {}
        self.shared = shared

    def check(self, og: OGraph, mask: int) -> str | None:
        if mask in self.cache:
            return self.cache[mask]
        why = self.structural.check(og, mask)
        if why is None and mask.bit_count() > 1:
            why = self._generate(og, mask)
        self.cache[mask] = why
        return why

    def _generate(self, og: OGraph, mask: int) -> str | None:
        prims = [og.nodes[i] for i in bits(mask)]
        outputs = [o for i in bits(og.consumers_outside(mask) | og.sinks(mask)) for o in og.nodes[i].outputs if o]
        pro = prologue_of(og, prims)
        if self.shared is None:
            return self._build(og, prims, pro, outputs)
        sig = kernel_signature(og.graph, prims, pro, outputs)
        if sig not in self.shared:
            self.shared[sig] = self._build(og, prims, pro, outputs)
        return self.shared[sig]

    @staticmethod
    def _build(og: OGraph, prims: list[Node], pro: list[Node], outputs: list[str]) -> str | None:
        """Why the kernel has no code (None: it has)."""
        schedule = None
        if needs_template(prims):
            from tessera.cost.schedule_model import rank_templates  # cost/ builds on codegen/

            ranked = rank_templates(og.graph, pro + prims, outputs)
            if not ranked:
                return "an operand prologue or a GEMM chain needs a template form"
            schedule = ranked[0]
        try:
            implement(og.graph, prims, pro, outputs, "legality", (), schedule)
        except Unsupported as e:
            return str(e)
        return None


def operand_views(prims: Sequence[Node]) -> list[Node]:
    """The transposes of a matmul kernel's operands that swap their last two axes and feed only the
    matmul: the library call reads them as strided views (cuBLAS transposes the operand itself)."""
    root = _linear_root(prims)
    if root is None or root.op != Prim.MATMUL.value:
        return []
    readers: dict[str, int] = {}
    for n in prims:
        for t in n.inputs:
            readers[t] = readers.get(t, 0) + 1
    return [n for n in prims if transposes_matrix(n) and n.outputs[0] in root.inputs and readers[n.outputs[0]] == 1]


def operand_prologue(prims: Sequence[Node]) -> list[Node]:
    """The primitives of a linear kernel that compute its operands (before the linear primitive),
    not counting the free prologue (which `prims` does not hold) nor the operand views the library
    reads as they are (`operand_views`): only a template computes them."""
    root = _linear_root(prims)
    if root is None:
        return []
    producer = {o: n for n in prims for o in n.outputs}
    views = {n.name for n in operand_views(prims)}
    found: dict[str, Node] = {}
    todo = [t for t in root.inputs if t]
    while todo:
        n = producer.get(todo.pop())
        if n is not None and n is not root and n.name not in found:
            found[n.name] = n
            todo.extend(t for t in n.inputs if t)
    return [n for n in prims if n.name in found and n.name not in views]  # in the kernel's (topological) order
