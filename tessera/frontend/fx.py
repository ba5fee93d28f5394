"""Stage `frontend` for PyTorch: an nn.Module or an FX graph -> the ONNX model the rest of tessera reads.

    module or dynamo graph --make_fx + core-ATen decompositions--> functional ATen graph
        --one converter per ATen op (frontend/aten.py)--> ONNX nodes (opset 20) + initializers

This is tessera's own translation, not `torch.onnx.export`: every ATen op becomes the ONNX
operator that the op registry (`ops/`) already splits into primitives, so an op has one
fission rule whichever frontend it came from. The ONNX model is only the container: the
artifact stores it as model.onnx, and `tessera verify` / `run --check` compare against
onnxruntime on it as for any ONNX model. An ATen op with no converter is kept whole as one node
of the `ir/aten_call.py` domain and runs through torch (opaque, like any unsupported op).

Parameters and buffers are frozen: they become initializers, so weight transforms fold at
compile time. A module whose weights change after compiling must be compiled again.

The graph is traced with the example inputs' real values (tracing_mode "real"); each node is also
run once here, which gives its shape and dtype and folds whatever depends only on constants
(position ids, masks built from constants, iotas).
"""
from __future__ import annotations

import copy
import functools
import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import onnx
import torch
import torch.fx as fx
from onnx import helper

from tessera.errors import TesseraError, UnsupportedError
from tessera.ir.aten_call import ATEN_DOMAIN, ATEN_OPSET, dumps
from tessera.ir.dtype import DType

OPSET = 20  # Gelu is an ONNX operator from 20 on
# A node computed only from constants is folded unless its value is this large and larger than
# its inputs (an expand of a weight would store the expanded copy).
FOLD_LIMIT_BYTES = 1 << 20
SMALL_CONST = 1024  # elements: constants up to this size get one initializer per distinct value
# ATen ops whose value is not a function of their inputs: never folded.
_RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "bernoulli", "native_dropout", "normal",
           "uniform", "exponential", "multinomial", "randperm"}

# ATen ops whose value depends on their tensor inputs' shapes and dtypes only.
_SHAPE_ONLY = {"full_like", "zeros_like", "ones_like", "empty_like", "new_full", "new_zeros", "new_ones",
               "new_empty", "scalar_tensor"}


class Ref:
    """A tensor value of the ATen graph: its ONNX name (None while it is a folded constant) and its
    value from the tracing run (shape, dtype and, for a constant, the value itself)."""

    __slots__ = ("name", "value", "const")

    def __init__(self, name: str | None, value: torch.Tensor, const: bool) -> None:
        self.name, self.value, self.const = name, value, const

    @property
    def dtype(self) -> torch.dtype:
        return self.value.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def rank(self) -> int:
        return self.value.dim()


def onnx_dtype(dt: torch.dtype) -> int:
    """The ONNX element type of a torch dtype tessera handles."""
    try:
        return DType(str(dt).removeprefix("torch.")).to_onnx()
    except ValueError:
        raise UnsupportedError(f"tensors of {dt} are not supported") from None


@dataclass
class Emitter:
    """Builds the ONNX model; converters call it (frontend/aten.py)."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    # Initializers are written straight into the model: a TensorProto built apart is copied
    # whole into each message that takes it (three copies of BERT-base's 440 MB of weights).
    model: onnx.ModelProto = field(default_factory=onnx.ModelProto)
    _count: int = 0
    current: str = ""  # the FX node being converted: names its ONNX nodes
    # Small constants by value -> their initializer: one name for one value, as the ONNX export
    # deduplicates them, so fission's primitives that read them (a scalar's reshape and broadcast)
    # are shared as in the ONNX path, not one copy per use.
    _small: dict[tuple, str] = field(default_factory=dict)

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value: Any, dtype: torch.dtype | None = None, hint: str = "c") -> str:
        """An initializer holding `value` (a tensor, an array or a Python number/list)."""
        t = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=dtype)
        if dtype is not None:
            t = t.to(dtype)
        t = t.detach().cpu().contiguous()
        key = None
        if t.numel() <= SMALL_CONST:
            key = (str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes())
            if key in self._small:
                return self._small[key]
        name = self.fresh(hint)
        if key is not None:
            self._small[key] = name
        proto = self.model.graph.initializer.add()
        proto.name = name
        proto.dims.extend(t.shape)
        if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: store the bits
            proto.data_type = onnx.TensorProto.BFLOAT16
            proto.raw_data = t.view(torch.int16).numpy().tobytes()
        else:
            a = t.numpy()
            proto.data_type = helper.np_dtype_to_tensor_dtype(a.dtype)
            proto.raw_data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()  # ONNX stores little-endian
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const([int(v) for v in values], torch.int64, "ints")

    def tensor(self, x: Any, dtype: torch.dtype) -> str:
        """`x` as an ONNX tensor of `dtype`: a Ref (cast when its dtype differs) or a Python scalar."""
        if isinstance(x, Ref):
            name = self.ref(x)
            return name if x.dtype == dtype else self.op("Cast", [name], to=onnx_dtype(dtype))
        return self.const(x, dtype)

    def ref(self, x: Ref) -> str:
        """The ONNX name of `x`, writing a folded constant as an initializer on first use."""
        if x.name is None:
            x.name = self.const(x.value, hint="folded")
        return x.name

    def op(self, op_type: str, inputs: Sequence[str], outputs: int = 1, domain: str = "", **attrs: Any) -> Any:
        """One ONNX node; its output name, or a list of `outputs` names."""
        base = self.fresh(f"{self.current or op_type}")
        outs = [f"{base}:{i}" if outputs > 1 else base for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=base, domain=domain,
                                           **{k: v for k, v in attrs.items() if v is not None}))
        return outs if outputs > 1 else outs[0]


Converter = Callable[[Emitter, fx.Node, tuple, dict, Any], Any]


@dataclass
class OnnxFromTorch:
    """The ONNX model of a traced graph and how to call it from the graph's inputs."""

    model: onnx.ModelProto
    inputs: list[int]  # the traced graph's placeholder positions that the model takes, in order
    # Per output of the traced graph: ("model", k) the model's k-th output, ("input", i) a placeholder
    # passed through, ("value", v) a constant or non-tensor value
    outputs: list[tuple[str, Any]]
    opaque: list[str] = field(default_factory=list)  # ATen ops kept whole
    tuple_out: bool = False  # the traced graph returns a tuple or list (else one value)


def aten_graph(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> fx.GraphModule:
    """`fn` traced to functional core ATen with the example inputs' real values."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.func import functionalize

    with torch.no_grad(), _OwnAttention():
        return make_fx(functionalize(fn, remove="mutations_and_views"),
                       decomposition_table=_decompositions(), tracing_mode="real")(*example_inputs)


@functools.cache
def _decompositions() -> dict[Any, Callable[..., Any]]:
    """torch's core-ATen decomposition table, built once (0.15 s a build; every graph is traced)."""
    from torch._decomp import core_aten_decompositions

    return core_aten_decompositions()


def fold_static(gm: fx.GraphModule, args: Sequence[Any], static: set[int]) -> fx.GraphModule:
    """A copy of dynamo graph `gm` with every node that reads only static placeholders (positions
    `static`: symbolic sizes, module scalars such as eps or dropout p that dynamic=True lifts into
    0-d tensors) computed from `args` and put in as a constant. make_fx traces with real tensors,
    and a `.item()` of a traced tensor stops it; at one bucket these values are fixed."""
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    run = fx.Interpreter(gm)  # runs one node at a time from its env
    env = run.env
    known: set[fx.Node] = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        env[n] = args[i]
        if i in static:
            known.add(n)
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output") or not all(a in known for a in n.all_input_nodes):
            continue
        with torch.no_grad():
            env[n] = run.run_node(n)
        known.add(n)
    count = 0
    for n in list(gm.graph.nodes):
        if n not in known or n.op in ("placeholder", "get_attr"):
            continue
        users = [u for u in n.users if u not in known]
        if not users:
            continue
        v = env[n]
        if isinstance(v, torch.Tensor):
            attr = f"_tessera_static_{count}"
            count += 1
            gm.register_buffer(attr, v)
            with gm.graph.inserting_before(users[0]):
                const = gm.graph.get_attr(attr)
            n.replace_all_uses_with(const, delete_user_cb=lambda u: u not in known)
        elif isinstance(v, (int, float, bool, torch.dtype, torch.device)) or v is None:
            for u in users:
                u.args, u.kwargs = fx.node.map_arg((u.args, u.kwargs), lambda x: v if x is n else x)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


class _OwnAttention(torch.overrides.TorchFunctionMode):
    """Calls of F.scaled_dot_product_attention traced as `_attention`, and of F.linear as one
    `tessera::linear` node. Both are decomposed inside the dispatcher, before a decomposition table
    is consulted: a linear layer on a 3-D input would reach the bridge as a flattening view, an
    addmm and a view back, which fission splits into other primitives than the ONNX export's
    MatMul and Add. The same primitives give the backend's plan the ONNX path's kernel signatures,
    so one tuning database serves both and the solver sees the same choices."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.nn.functional.scaled_dot_product_attention:
            return _attention(*args, **(kwargs or {}))
        if func is torch.nn.functional.linear:
            return _traced_ops().linear(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


@functools.cache
def _traced_ops() -> Any:
    """torch.ops.tessera: F.linear and torch.matmul as one traced node each (registered on first use)."""

    @torch.library.custom_op("tessera::linear", mutates_args=())
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.nn.functional.linear(x, weight, bias)

    @torch.library.custom_op("tessera::matmul", mutates_args=())
    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)

    linear.register_fake(lambda x, weight, bias=None: x.new_empty((*x.shape[:-1], weight.shape[0])))
    matmul.register_fake(lambda a, b: torch.matmul(a, b))  # on fake tensors: the shape, no data
    return torch.ops.tessera


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """SDPA as products and a softmax in the inputs' dtype, as an ONNX export writes it. torch's own
    forms do not fit: on a GPU it dispatches to cuDNN's or flash's kernel (one opaque call), and its
    math form computes half inputs in float32 (casts around every product, so no chain forms).
    tessera's kernels accumulate in float32 anyway. Rows a boolean mask hides entirely give 0, as
    torch's safe softmax does."""
    if dropout_p:
        raise TesseraError("scaled_dot_product_attention with dropout is training; tessera compiles inference")
    n, s = q.shape[-2], k.shape[-2]
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    # The scale before the product, as the ONNX export writes it: its square root on q and on k's
    # transpose (a chain kernel scales its operand tiles as it loads them, not every score tile).
    # The products as one traced node each (`tessera::matmul`): torch.matmul would reach the bridge
    # as 3-D bmm between reshapes, where the ONNX export has 4-D MatMul nodes.
    matmul = _traced_ops().matmul
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if factor > 0:
        w = matmul(q * math.sqrt(factor), k.transpose(-2, -1) * math.sqrt(factor))
    else:  # a zero or negative scale (legal, if odd) has no real root: all of it on q
        w = matmul(q * factor, k.transpose(-2, -1))
    hidden = None
    if is_causal:
        hidden = ~torch.ones(n, s, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        hidden = ~attn_mask if hidden is None else hidden | ~attn_mask
    elif attn_mask is not None:
        w = w + attn_mask
    if hidden is not None:  # as an additive bias: computed from the mask alone, so a constant mask folds
        w = w + torch.zeros((), dtype=w.dtype, device=w.device).masked_fill(hidden, float("-inf"))
    p = torch.softmax(w, -1)
    if attn_mask is not None:
        p = torch.where(torch.isnan(p), torch.zeros((), dtype=p.dtype, device=p.device), p)
    return matmul(p, v)


def to_onnx(gm: fx.GraphModule, example_inputs: Sequence[Any], frozen: set[int], name: str,
            input_names: Sequence[str] | None = None) -> OnnxFromTorch:
    """The ONNX model of ATen graph `gm` (from `aten_graph`). Placeholders at `frozen` positions
    are constants (parameters, buffers); the others are the model's inputs, named by
    `input_names` (default input_0, ...)."""
    from tessera.frontend.aten import CONVERTERS

    em = Emitter()
    env: dict[fx.Node, Any] = {}
    graph_inputs: list[onnx.ValueInfoProto] = []
    taken: list[int] = []
    opaque: list[str] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise TesseraError(f"the graph takes {len(placeholders)} inputs, {len(example_inputs)} example inputs given")
    for i, (ph, x) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(x, torch.Tensor):
            env[ph] = x  # a Python value dynamo specialized on
        elif i in frozen:
            env[ph] = Ref(None, x.detach(), True)
        else:
            nm = (list(input_names)[len(taken)] if input_names else f"input_{len(taken)}")
            env[ph] = Ref(nm, x.detach(), False)
            taken.append(i)
            graph_inputs.append(helper.make_tensor_value_info(nm, onnx_dtype(x.dtype), list(x.shape)))
    result: Any = None
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                env[node] = Ref(None, _attr(gm, node.target), True)
            elif node.op == "call_function":
                env[node] = _call(em, node, env, opaque, CONVERTERS)
            elif node.op == "output":
                result = fx.node.map_arg(node.args[0], lambda a: env[a])
            else:
                raise UnsupportedError(f"{name}: FX node {node.name} ({node.op}) is not supported")
    flat = list(result) if isinstance(result, (list, tuple)) else [result]
    outputs: list[tuple[str, Any]] = []
    graph_outputs: list[onnx.ValueInfoProto] = []
    written: dict[str, int] = {}
    for v in flat:
        if isinstance(v, Ref) and not v.const and v.name not in {g.name for g in graph_inputs}:
            if v.name not in written:
                written[v.name] = len(graph_outputs)
                graph_outputs.append(helper.make_tensor_value_info(v.name, onnx_dtype(v.dtype), list(v.shape)))
            outputs.append(("model", written[v.name]))
        elif isinstance(v, Ref) and not v.const:
            outputs.append(("input", taken[[g.name for g in graph_inputs].index(v.name)]))
        else:
            outputs.append(("value", v.value if isinstance(v, Ref) else v))
    if not graph_outputs:
        raise UnsupportedError(f"{name}: the graph computes nothing from its inputs (every output is a constant "
                               "or an input)")
    model = em.model  # filled in place: helper.make_graph and make_model would copy the weights twice
    model.graph.name = name
    model.graph.node.extend(em.nodes)
    model.graph.input.extend(graph_inputs)
    model.graph.output.extend(graph_outputs)
    model.opset_import.extend([helper.make_opsetid("", OPSET)]
                              + ([helper.make_opsetid(ATEN_DOMAIN, ATEN_OPSET)] if opaque else []))
    model.producer_name = "tessera.frontend.fx"
    model.ir_version = 10  # what onnxruntime reads
    return OnnxFromTorch(model, taken, outputs, sorted(set(opaque)), isinstance(result, (list, tuple)))


def _attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    v: Any = gm
    for part in target.split("."):
        v = getattr(v, part)
    return v.detach() if isinstance(v, torch.Tensor) else v


def value_of(x: Any) -> Any:
    """A converter argument's traced value (a Ref's tensor, or the Python value itself)."""
    return x.value if isinstance(x, Ref) else x


def _call(em: Emitter, node: fx.Node, env: dict[fx.Node, Any], opaque: list[str],
          converters: dict[str, Converter]) -> Any:
    """Run `node` once for its value; fold it or convert it."""
    args = fx.node.map_arg(node.args, lambda a: env[a])
    kwargs = fx.node.map_arg(node.kwargs, lambda a: env[a])
    target = node.target
    if target is operator.getitem:  # one output of a multi-output op
        seq, i = args
        return seq[i]
    out = target(*_tree(args, value_of), **_tree(kwargs, value_of))
    key = str(target)
    refs = [a for a in _flatten((args, kwargs)) if isinstance(a, Ref)]
    packet = key.split(".")[1] if key.startswith("aten.") else key
    if packet in _SHAPE_ONLY:  # full_like(x, v) and the like read only x's shape
        refs = []
    if all(r.const for r in refs) and packet not in _RANDOM and _foldable(out, refs):
        return _tree(out, lambda v: Ref(None, v, True) if isinstance(v, torch.Tensor) else v)
    em.current = node.name
    conv = converters.get(key)
    names = None
    if conv is not None:
        names = conv(em, node, args, kwargs, out)
    if names is None:  # no converter, or the converter declines this case: the ATen call, whole
        names = _aten_node(em, key, args, kwargs, out)
        opaque.append(key)
    if isinstance(out, (tuple, list)):
        names = names if isinstance(names, (list, tuple)) else [names]
        return [Ref(n, v, False) if isinstance(v, torch.Tensor) and n else None for n, v in zip(names, out)]
    return Ref(names, out, False)


def _foldable(out: Any, refs: list[Ref]) -> bool:
    size = sum(v.numel() * v.element_size() for v in _flatten(out) if isinstance(v, torch.Tensor))
    largest = max((r.value.numel() * r.value.element_size() for r in refs), default=0)
    return size <= FOLD_LIMIT_BYTES or size <= largest


def _aten_node(em: Emitter, key: str, args: tuple, kwargs: dict, out: Any) -> Any:
    """The ATen call as one node of the ATen domain (ir/aten_call.py)."""
    if not key.startswith("aten."):
        raise UnsupportedError(f"{em.current}: {key} is not an ATen operator; tessera cannot run it")
    tensors: list[Ref] = []

    def index(x: Any) -> int | None:
        if not isinstance(x, Ref):
            return None
        tensors.append(x)
        return len(tensors) - 1

    call = dumps(list(args), dict(kwargs), index)
    values = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise UnsupportedError(f"{em.current}: {key} returns non-tensor values; tessera cannot keep it as one call")
    # What it computed, for type inference: a meta kernel may differ, or be missing (cuDNN attention).
    types = json.dumps([[list(v.shape), str(v.dtype).removeprefix("torch.")] for v in values])
    return em.op(key, [em.ref(t) for t in tensors], outputs=len(values), domain=ATEN_DOMAIN, call=call,
                 out_types=types)


def _tree(x: Any, f: Callable[[Any], Any]) -> Any:
    if isinstance(x, (list, tuple)):
        return type(x)(_tree(v, f) for v in x)
    if isinstance(x, dict):
        return {k: _tree(v, f) for k, v in x.items()}
    return f(x)


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flatten(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flatten(v)]
    return [x]
