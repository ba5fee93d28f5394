"""The `--precision` pass: the dtype a graph computes in.

fp32 and tf32 keep float32 tensors (tf32 only changes how matrix units
multiply, which the runtime sets). fp16 and bf16 store every float32 tensor,
constant and FILL in the narrow type, but for an operator's own coefficients
(`Graph.wide_constants`) and the sums and squares it keeps to itself
(`internal_accumulations`). Generated kernels still compute in
float32 between loads and stores, and cuBLAS/cuDNN accumulate in float32, so
only the values kept in memory are rounded. Opaque operators keep float32:
they run through a fallback that may not have narrow kernels, so casts go
around them.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType
from tessera.ir.prims import PASS_THROUGH, Category, Prim

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_NARROW = {"fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}


IO_CHOICES = ("model", "precision")


def check_precision(precision: str, io: str = "model") -> None:
    """Raise ValueError for a precision or boundary choice that is not one of ours."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if io not in IO_CHOICES:
        raise ValueError(f"io must be one of {IO_CHOICES}, got {io!r}")


def convert_precision(graph: Graph, precision: str, io: str = "model") -> Graph:
    """`graph` computing in `precision` (a new graph; fp32/tf32 return it unchanged).

    `io`: the float dtypes of the graph's inputs and outputs. "model" keeps those the model declares
    (a cast after each float32 input and before each float32 output); "precision" gives them the
    narrow type too, for callers whose tensors are already float16/bfloat16 (a half-precision
    pipeline, or a benchmark against peers run with `.half()`), so no boundary cast runs."""
    check_precision(precision, io)
    to = _NARROW.get(precision)
    if to is None:
        return graph
    g = graph.clone(copy_constants=False)  # constants are replaced or added, never written

    # (an operator's own coefficients, Graph.wide_constants, stay float32: a Resize's blend weights
    # rounded to bfloat16 put a fuzz graph 7x further from onnxruntime than rounding each node did, seed 5302)
    # and so do the sums and squares an operator keeps to itself (`internal_accumulations`)
    wide = {name for name, t in graph.types.items() if t.dtype is DType.FLOAT32} \
        - graph.wide_constants - internal_accumulations(graph)
    g.types = {name: TensorType(t.shape, to) if name in wide else t for name, t in graph.types.items()}
    g.constants = {name: (_narrow_constant(v, to) if name in wide else v) for name, v in graph.constants.items()}
    nodes: list[Node] = []
    for n in graph.nodes:
        attrs = dict(n.attrs)
        if n.op in (Prim.CAST.value, Prim.FILL.value) and attrs.get("dtype") == DType.FLOAT32.value:
            attrs["dtype"] = to.value
        if n.op != Prim.OPAQUE.value:
            nodes.append(Node(n.name, n.op, n.inputs, n.outputs, attrs, n.domain, n.source))
            continue
        # Opaque: cast narrowed inputs back to float32, and its float32 outputs to the narrow type.
        # A constant input keeps its float32 value: a rounded Resize scale (1.7 -> 1.703125 in bf16)
        # moves every sample (found by the fuzzer, tests/test_fuzz.py).
        ins = []
        for t in n.inputs:
            if t in wide and t in graph.constants:
                w = f"{t}/fp32"
                g.constants[w] = graph.constants[t]
                g.types[w] = graph.types[t]
                ins.append(w)
            elif t in wide and f"{t}/{n.name}/fp32" in ins:  # the same input twice (Mean(x, x), Einsum(x, x)): one cast
                ins.append(f"{t}/{n.name}/fp32")
            elif t in wide:
                w = f"{t}/{n.name}/fp32"
                nodes.append(Node(f"{n.name}/cast_in_{len(ins)}", Prim.CAST.value, (t,), (w,),
                                  {"dtype": DType.FLOAT32.value}, source=n.source))
                g.types[w] = graph.types[t]
                ins.append(w)
            else:
                ins.append(t)
        outs, casts = [], []
        for k, t in enumerate(n.outputs):
            if t in wide:
                w = f"{t}/fp32"
                g.types[w] = graph.types[t]
                casts.append(Node(f"{n.name}/cast_out_{k}", Prim.CAST.value, (w,), (t,), {"dtype": to.value},
                                  source=n.source))
                outs.append(w)
            else:
                outs.append(t)
        nodes.append(Node(n.name, n.op, tuple(ins), tuple(outs), attrs, n.domain, n.source))
        nodes.extend(casts)
    g.nodes = nodes
    if io == "model":
        _keep_boundary_types(g, graph, wide, to)
    # Casts nothing reads (of an input the graph ignores, of an opaque op's unused output: TopK's
    # values when only its indices are used) would be kernels with no outputs.
    g.remove_dead()
    return g


def _narrow_constant(v: np.ndarray, to: DType) -> np.ndarray:
    """A float32 constant in the narrow type. Values past float16's range (GPT-2's attention mask
    holds float32's lowest value) are clamped to its largest finite value rather than turned into
    infinities: a mask of -65504 still zeroes a softmax term, and -inf * 0 = NaN cannot arise from
    a finite constant. Constants that are infinite already stay so.

    A bfloat16 constant is held as float32 (NumPy has no bfloat16) but rounded to bfloat16's values:
    held unrounded, a one-element constant, which a kernel writes into its source, kept float32's
    precision while every larger constant was rounded on its way to the GPU (the fuzzer, session 51:
    a one-channel BatchNorm in bf16 cancelled to 1.7% off the rounded reference)."""
    if to not in (DType.FLOAT16, DType.BFLOAT16):
        return v.astype(to.to_numpy())
    # torch converts with the same round-to-nearest-even as NumPy, several times faster (GPT-2's
    # weights: 0.2 s against 1.6 s); then only the values that overflowed are clamped. bfloat16 has
    # float32's exponents, but float32's extremes (a mask's finfo(float32).min) round up past its
    # largest finite value, to infinity: clamped too (a bf16 mask of -inf made 0 * -inf = NaN).
    with warnings.catch_warnings():  # a read-only array (a weight as the frontend read it) is only read
        warnings.simplefilter("ignore", UserWarning)
        wide = torch.from_numpy(np.require(v, np.float32, "C"))
        if to is DType.BFLOAT16:
            out, top = wide.to(torch.bfloat16).to(torch.float32).numpy(), float(torch.finfo(torch.bfloat16).max)
        else:
            out, top = wide.to(torch.float16).numpy(), float(np.finfo(np.float16).max)
    over = np.isinf(out)
    if over.any():
        over &= np.isfinite(v)  # infinities and NaN stay what they are
        out = np.where(over, np.copysign(top, v).astype(out.dtype), out)
    return out


def _keep_boundary_types(g: Graph, declared: Graph, wide: set[str], to: DType) -> None:
    """Graph inputs and outputs keep the dtypes the model declares, whatever the internal
    precision: a cast after each float32 input and before each float32 output (each fuses into
    the kernel next to it), so users pass and get float32 as they would from onnxruntime."""
    rename: dict[str, str] = {}
    head: list[Node] = []
    for t in g.inputs:
        if t in wide:
            narrow = f"{t}/{to.value}"
            g.types[t], g.types[narrow] = declared.types[t], g.types[t]
            head.append(Node(f"{t}/cast_in", Prim.CAST.value, (t,), (narrow,), {"dtype": to.value}))
            rename[t] = narrow
    tail: list[Node] = []
    for t in g.outputs:
        if t in wide and t in g.constants and t not in g.inputs:
            # A constant output is returned as the model declares it; kernels read a narrow copy.
            narrow = f"{t}/{to.value}"
            g.types[t], g.types[narrow] = declared.types[t], g.types[t]
            g.constants[narrow], g.constants[t] = g.constants[t], declared.constants[t]
            rename[t] = narrow
        elif t in wide and t not in g.inputs:
            narrow = f"{t}/{to.value}"
            g.types[t], g.types[narrow] = declared.types[t], g.types[t]
            tail.append(Node(f"{t}/cast_out", Prim.CAST.value, (narrow,), (t,), {"dtype": DType.FLOAT32.value}))
            rename[t] = narrow
    if not rename:
        return
    body = [Node(n.name, n.op, tuple(rename.get(t, t) for t in n.inputs), tuple(rename.get(t, t) for t in n.outputs),
                 dict(n.attrs), n.domain, n.source) for n in g.nodes]
    # The input casts read the declared inputs; the output casts write the declared outputs.
    # Readers of an output inside the graph take the narrow value, as its producer writes it.
    g.nodes = head + body + tail


def narrow_dtype(precision: str) -> DType | None:
    """The dtype float32 tensors become under `precision` (None: they stay float32)."""
    return _NARROW.get(precision)



def mark_tf32_operands(graph: Graph, precision: str) -> Graph:
    """In a tf32 plan, the float32 activations that only matrix products read (directly or through
    reshapes, transposes, slices and broadcasts), with those views: `Graph.tf32_rounded`.

    A GEMM or convolution template rounds each operand to tf32 before its product. Rounding an
    activation in the K loop made wgmma read it from registers, not shared memory: 1.2-2.5 µs per
    GEMM at BERT's and GPT-2's layers on the H100 (session 29, `scripts/tf32_operand_probe.py`).
    Where every reader rounds anyway, the writer stores the rounded bits instead
    (`KernelBody.store`) and the templates read them as they are (`tile.dot_operand`): the same
    values, rounded once. Only tensors a generated kernel writes qualify (an elementwise or
    reduction producer), never a graph input or output, a constant, or what a library or opaque
    call writes; `codegen/select.py` keeps cuBLASLt's and cuDNN's epilogues from writing one.
    Deterministic in the graph, so an artifact's rebuild repeats it (`runtime/artifact.py`)."""
    if precision != "tf32":
        return graph
    readers = graph.consumers()
    producers = graph.producers()
    ends = set(graph.outputs) | set(graph.inputs) | set(graph.constants)

    def views_if_only_products(t: str) -> list[str] | None:
        """t and its pass-through views, if every reader of them is a matrix product; else None."""
        out, todo = [t], [t]
        while todo:
            u = todo.pop()
            if not readers.get(u):
                return None
            for n in readers[u]:
                if Prim(n.op).category is Category.LINEAR:
                    continue
                if n.op not in PASS_THROUGH or n.inputs[0] != u or n.outputs[0] in ends:
                    return None
                out.append(n.outputs[0])
                todo.append(n.outputs[0])
        return out

    marked: set[str] = set()
    for t, p in producers.items():
        if (t in ends or graph.types[t].dtype is not DType.FLOAT32 or not p.inputs
                or Prim(p.op).category not in (Category.ELEMENTWISE, Category.REDUCE) or p.op in PASS_THROUGH):
            continue
        views = views_if_only_products(t)
        if views is not None:
            marked.update(views)
    if not marked:
        return graph
    g = graph.clone(copy_constants=False)
    g.tf32_rounded = frozenset(marked)
    return g


def internal_accumulations(graph: Graph) -> set[str]:
    """Sums and squares that one ONNX operator's primitives pass among themselves: written by a
    REDUCE_SUM, a summing WINDOW_REDUCE, a product of a tensor with itself or an add of such tensors
    (LRN sums its window of squares with adds of slices), read only by elementwise,
    reducing or layout primitives of the same operator (a matmul takes one operand type: the rewrite
    search makes a sum of squares a product with ones), and not a graph output nor moved into one;
    with the copies of them that the operator's layout primitives make (views, an LRN's pad and
    slices). They stay float32 in a narrow plan. A plan that stores one between two kernels would
    otherwise round it, and a sum can pass the narrow type's range where the operator's result does
    not: ReduceLogSum over 67,600 values stored a float16 infinity before its log (fuzz seed 5401),
    where onnxruntime's result is 11.29. Fused, nothing changes (kernels compute in float32);
    stored, a reduced tensor is small."""
    readers = graph.consumers()
    outputs, found = set(graph.outputs), set()

    def kept(t: str, source: tuple[str, ...]) -> set[str] | None:
        """`t` and the layout primitives' copies of it that its operator reads, if the operator alone
        reads them and none is a graph output (a view that is the operator's result, ReduceSum's
        reshape without keepdims, makes the sum the result, which rounds)."""
        rs = readers.get(t)
        if not rs or t in outputs:
            return None
        out = {t}
        for r in rs:
            kind = Prim(r.op).category
            if r.source != source or kind not in (Category.LAYOUT, Category.ELEMENTWISE, Category.REDUCE):
                return None  # a matmul (the rewrite search's sum of squares as x @ ones) takes one operand type
            if kind is Category.LAYOUT:  # moves the values (a view, a pad): follow them
                more = kept(r.outputs[0], source)
                if more is None:
                    return None
                out |= more
        return out

    for n in graph.nodes:  # in order: an add's operands are found before it
        summed = n.op == Prim.REDUCE_SUM.value or (n.op == Prim.WINDOW_REDUCE.value and n.attrs.get("kind") == "sum")
        square = n.op == Prim.MUL.value and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1]
        # an add of the operator's own sums or squares sums them too (LRN adds its window's slices)
        added = n.op == Prim.ADD.value and all(i in found for i in n.inputs)
        if n.source and (summed or square or added):
            found |= kept(n.outputs[0], n.source) or set()
    return found
