"""ATen op -> ONNX operator converters for the PyTorch frontend (`frontend/fx.py`).

Each converter takes the emitter, the FX node, its arguments (tensors as `Ref`s, the rest as
Python values), and the value the op computed while tracing (shapes and dtypes come from it).
It returns the ONNX name(s) of the result, or None to keep the op whole (an ATen-domain node
run by torch). Converters only translate: the ONNX operators they emit are lowered to
primitives by the op registry (`ops/`), the same rules an ONNX model goes through.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from tessera.frontend.fx import Converter, Emitter, Ref, onnx_dtype, value_of

CONVERTERS: dict[str, Converter] = {}
INT64_MAX = 2**63 - 1


def convert(*keys: str) -> Callable[[Converter], Converter]:
    def deco(f: Converter) -> Converter:
        for k in keys:
            CONVERTERS[k] = f
        return f
    return deco


def _axis(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _axes(dims: Any, rank: int) -> list[int]:
    """A reduction's dims (None or [] for all of them, one int, or a list), normalized."""
    if dims is None or dims == []:
        return list(range(rank))
    return [_axis(d, rank) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]


def _window(args: tuple) -> tuple[list[int], list[int], list[int]]:
    """A 2-D pooling's kernel, strides (default: the kernel) and pads (ONNX's begin..end order),
    each given once for both axes or per axis."""
    two = lambda v: list(v) * 2 if len(v) == 1 else list(v)  # noqa: E731
    k = two(args[1])
    stride = two(args[2]) if len(args) > 2 and args[2] else k
    padding = two(args[3]) if len(args) > 3 else [0, 0]
    return k, stride, padding * 2


# ---- elementwise ---------------------------------------------------------------------------
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "minimum": "Min", "pow": "Pow"}
_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}
_LOGICAL = {"logical_and": "And", "logical_or": "Or", "bitwise_and": "And", "bitwise_or": "Or"}
_UNARY = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "neg": "Neg", "abs": "Abs", "erf": "Erf", "reciprocal": "Reciprocal", "isnan": "IsNaN",
          "sin": "Sin", "cos": "Cos", "tan": "Tan", "floor": "Floor", "ceil": "Ceil", "round": "Round"}


def _binary(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    op = str(node.target).split(".")[1]
    a, b = args[0], args[1]
    if op == "div" and kwargs.get("rounding_mode") is not None:
        return None
    if op == "pow" and not out.dtype.is_floating_point:
        return None
    dt = out.dtype
    alpha = kwargs.get("alpha", 1)
    if op in ("add", "sub") and alpha != 1:
        b = em.op("Mul", [em.tensor(b, dt), em.tensor(alpha, dt)])
        return em.op(_BINARY[op], [em.tensor(a, dt), b])
    if op == "pow" and not isinstance(b, Ref):  # the exponent keeps its own type in ONNX Pow
        return em.op("Pow", [em.tensor(a, dt), em.const(float(b), dt)])
    return em.op(_BINARY[op], [em.tensor(a, dt), em.tensor(b, dt)])


for _op in _BINARY:
    convert(f"aten.{_op}.Tensor", f"aten.{_op}.Scalar", f"aten.{_op}.default", f"aten.{_op}.Tensor_Scalar",
            f"aten.{_op}.Tensor_Tensor", f"aten.{_op}.Tensor_mode")(_binary)


@convert("aten.fmod.Tensor", "aten.fmod.Scalar", "aten.remainder.Tensor", "aten.remainder.Scalar")
def _mod(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    """fmod is C's remainder (ONNX Mod fmod=1); remainder is Python's, which ONNX has for integers only
    (fmod=0): a float remainder stays an ATen call."""
    fmod = int(str(node.target).split(".")[1] == "fmod")
    if out.dtype == torch.bool or (not fmod and out.dtype.is_floating_point):
        return None
    return em.op("Mod", [em.tensor(args[0], out.dtype), em.tensor(args[1], out.dtype)], fmod=fmod)


@convert("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    dt, alpha = out.dtype, kwargs.get("alpha", 1)
    x = em.tensor(args[0], dt)
    if alpha != 1:
        x = em.op("Mul", [x, em.tensor(alpha, dt)])
    return em.op("Sub", [em.tensor(args[1], dt), x])


def _compare(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    op = str(node.target).split(".")[1]
    a, b = args[0], args[1]
    dt = torch.result_type(value_of(a), value_of(b))
    x, y = em.tensor(a, dt), em.tensor(b, dt)
    if op == "ne":
        return em.op("Not", [em.op("Equal", [x, y])])
    return em.op(_COMPARE[op], [x, y])


for _op in [*_COMPARE, "ne"]:
    convert(f"aten.{_op}.Tensor", f"aten.{_op}.Scalar")(_compare)


@convert(*[f"aten.{op}.default" for op in _LOGICAL] + [f"aten.{op}.Tensor" for op in _LOGICAL])
def _logical(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    if out.dtype != torch.bool:
        return None
    op = _LOGICAL[str(node.target).split(".")[1]]
    return em.op(op, [em.tensor(args[0], torch.bool), em.tensor(args[1], torch.bool)])


@convert("aten.logical_not.default", "aten.bitwise_not.default")
def _not(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    if out.dtype != torch.bool:
        return None
    return em.op("Not", [em.tensor(args[0], torch.bool)])


def _unary(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    op = str(node.target).split(".")[1]
    x = args[0]
    if op != "isnan" and not out.dtype.is_floating_point and op not in ("neg", "abs", "relu"):
        return None
    return em.op(_UNARY[op], [em.ref(x)])


for _op in _UNARY:
    convert(f"aten.{_op}.default")(_unary)


@convert("aten.rsqrt.default")
def _rsqrt(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    return em.op("Reciprocal", [em.op("Sqrt", [em.ref(args[0])])])


@convert("aten.gelu.default")
def _gelu(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    return em.op("Gelu", [em.ref(args[0])], approximate=kwargs.get("approximate", "none"))


@convert("aten.leaky_relu.default")
def _leaky(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    slope = args[1] if len(args) > 1 else 0.01
    return em.op("LeakyRelu", [em.ref(args[0])], alpha=float(slope))


@convert("aten.clamp.default", "aten.hardtanh.default", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    op = str(node.target).split(".")[1]
    dt = out.dtype
    x = em.tensor(args[0], dt)
    if op == "hardtanh":
        lo, hi = (list(args[1:]) + [-1.0, 1.0][len(args) - 1:])[:2]
    elif op == "clamp_min":
        lo, hi = args[1], None
    elif op == "clamp_max":
        lo, hi = None, args[1]
    else:
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
    if isinstance(lo, Ref) or isinstance(hi, Ref):
        return None
    return em.op("Clip", [x, "" if lo is None else em.const(lo, dt), "" if hi is None else em.const(hi, dt)])


@convert("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    dt = out.dtype
    return em.op("Where", [em.tensor(args[0], torch.bool), em.tensor(args[1], dt), em.tensor(args[2], dt)])


@convert("aten._to_copy.default", "aten.clone.default", "aten.alias.default", "aten.detach.default",
         "aten.detach_copy.default", "aten.lift_fresh_copy.default", "aten.alias_copy.default",
         "aten.contiguous.default")
def _copy(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    if out.dtype != x.dtype:
        return em.op("Cast", [em.ref(x)], to=onnx_dtype(out.dtype))
    return em.op("Identity", [em.ref(x)])


# ---- layout --------------------------------------------------------------------------------
@convert("aten.view.default", "aten.view_copy.default", "aten._unsafe_view.default", "aten.reshape.default",
         "aten.unsqueeze.default", "aten.unsqueeze_copy.default", "aten.squeeze.dim", "aten.squeeze.dims",
         "aten.squeeze.default", "aten.squeeze_copy.dim", "aten.squeeze_copy.dims", "aten.squeeze_copy.default",
         "aten._reshape_alias.default", "aten.flatten.using_ints")
def _reshape(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    if tuple(out.shape) == x.shape:
        return em.op("Identity", [em.ref(x)])
    return em.op("Reshape", [em.ref(x), em.ints(out.shape)])


@convert("aten.permute.default", "aten.permute_copy.default")
def _permute(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    return em.op("Transpose", [em.ref(x)], perm=[_axis(d, x.rank) for d in args[1]])


@convert("aten.transpose.int", "aten.transpose_copy.int")
def _transpose(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    perm = list(range(x.rank))
    a, b = _axis(args[1], x.rank), _axis(args[2], x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return em.op("Transpose", [em.ref(x)], perm=perm)


@convert("aten.expand.default", "aten.expand_copy.default")
def _expand(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    return em.op("Expand", [em.ref(args[0]), em.ints(out.shape)])


@convert("aten.repeat.default")
def _repeat(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, reps = args[0], list(args[1])
    name = em.ref(x)
    if len(reps) > x.rank:  # leading new axes
        name = em.op("Reshape", [name, em.ints([1] * (len(reps) - x.rank) + list(x.shape))])
    return em.op("Tile", [name, em.ints(reps)])


@convert("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    dim = _axis(args[1] if len(args) > 1 else 0, x.rank)
    start = args[2] if len(args) > 2 and args[2] is not None else 0
    end = args[3] if len(args) > 3 and args[3] is not None else INT64_MAX
    step = args[4] if len(args) > 4 else 1
    if tuple(out.shape) == x.shape:
        return em.op("Identity", [em.ref(x)])
    return em.op("Slice", [em.ref(x), em.ints([start]), em.ints([min(end, INT64_MAX)]), em.ints([dim]),
                           em.ints([step])])


@convert("aten.select.int", "aten.select_copy.int")
def _select(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, dim, i = args
    return em.op("Gather", [em.ref(x), em.const(int(i), torch.int64)], axis=_axis(dim, x.rank))


@convert("aten.cat.default")
def _cat(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    parts = [t for t in args[0] if isinstance(t, Ref) and t.value.numel() > 0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return em.op("Concat", [em.tensor(t, out.dtype) for t in parts], axis=_axis(dim, out.dim()))


@convert("aten.split.Tensor", "aten.split_copy.Tensor", "aten.split_with_sizes.default",
         "aten.split_with_sizes_copy.default")
def _split(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    dim = _axis(args[2] if len(args) > 2 else kwargs.get("dim", 0), x.rank)
    sizes = [o.shape[dim] for o in out]
    if len(sizes) == 1:
        return [em.op("Identity", [em.ref(x)])]
    return em.op("Split", [em.ref(x), em.ints(sizes)], outputs=len(sizes), axis=dim)


@convert("aten.constant_pad_nd.default")
def _pad(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    begins, ends = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):  # torch lists (begin, end) pairs from the last axis back
        begins[x.rank - 1 - i], ends[x.rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if any(p < 0 for p in begins + ends):
        return None
    return em.op("Pad", [em.ref(x), em.ints(begins + ends), em.const(value, out.dtype)], mode="constant")


@convert("aten.embedding.default")
def _embedding(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    return em.op("Gather", [em.ref(args[0]), em.ref(args[1])], axis=0)


@convert("aten.index.Tensor")
def _index(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    """x[i0, i1, ...]: one index tensor is a Gather; several constant ones over the leading axes are
    one Gather over those axes flattened (the flat index computed here). Masks and other advanced
    indexing are kept whole."""
    x, idx = args[0], list(args[1])
    used = [i for i, t in enumerate(idx) if t is not None]
    if not used or any(not isinstance(idx[i], Ref) or idx[i].dtype == torch.bool for i in used):
        return None
    if len(used) == 1:
        return em.op("Gather", [em.ref(x), em.ref(idx[used[0]])], axis=used[0])
    k = len(used)
    if used != list(range(k)) or not all(idx[i].const for i in used):
        return None
    flat = torch.zeros((), dtype=torch.int64)
    for i in used:  # row-major over the leading k axes, negative indices wrapped
        flat = flat * x.shape[i] + idx[i].value.to(torch.int64) % x.shape[i]
    lead = 1
    for d in x.shape[:k]:
        lead *= d
    rows = em.op("Reshape", [em.ref(x), em.ints([lead, *x.shape[k:]])])
    return em.op("Gather", [rows, em.const(flat)], axis=0)


@convert("aten.cumsum.default")
def _cumsum(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, dim = args[0], args[1]
    if x.rank == 0:
        return None
    return em.op("CumSum", [em.tensor(x, out.dtype), em.ints([_axis(dim, x.rank)])])


@convert("aten.gather.default")
def _gather(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, dim, index = args[0], args[1], args[2]
    if tuple(index.shape) != tuple(out.shape) or any(i > s for i, s in zip(index.shape, x.shape)):
        return None
    return em.op("GatherElements", [em.ref(x), em.ref(index)], axis=_axis(dim, x.rank))


@convert("aten.topk.default")
def _topk(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    """torch.topk(x, k, dim, largest, sorted) is ONNX TopK with k as an input (a MoE router's top experts)."""
    x, k = args[0], int(args[1])
    dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
    sort = args[4] if len(args) > 4 else kwargs.get("sorted", True)
    return em.op("TopK", [em.ref(x), em.ints([k])], outputs=2, axis=_axis(dim, x.rank), largest=int(largest),
                 sorted=int(sort))


# ---- reductions ----------------------------------------------------------------------------
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax", "amin": "ReduceMin"}


def _reduce(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    op = str(node.target).split(".")[1]
    x = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    axes = _axes(dims, x.rank)
    if not out.dtype.is_floating_point or x.rank == 0:
        return None
    src = em.tensor(x, out.dtype)
    return em.op(_REDUCE[op], [src, em.ints(axes)], keepdims=int(bool(keep)))


for _op in _REDUCE:
    convert(f"aten.{_op}.dim_IntList", f"aten.{_op}.dim", f"aten.{_op}.default")(_reduce)


@convert("aten.any.dim", "aten.any.dims", "aten.any.default")
def _any(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    if x.rank == 0:
        return None
    dims = args[1] if len(args) > 1 else None
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    axes = _axes(dims, x.rank)
    f = em.op("Cast", [em.ref(x)], to=onnx_dtype(torch.float32))
    m = em.op("ReduceMax", [f, em.ints(axes)], keepdims=int(bool(keep)))
    return em.op("Cast", [m], to=onnx_dtype(torch.bool))


# ---- neural-network operators --------------------------------------------------------------
def _zero_bias(b: Any) -> bool:
    """A frozen bias of zeros. The ONNX export writes an addmm with one as a Gemm without C
    (transformers initializes biases to zero, so the zoo's random-weight GPT-2 exports its Conv1D
    layers so), while it keeps the Add of F.linear's; the bridge does the same, so the backend gets
    the export's primitives. Weights are frozen at compile time, so this is exact."""
    return isinstance(b, Ref) and b.const and not bool(b.value.any())


@convert("aten.addmm.default")
def _addmm(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    bias, a, b = args[:3]
    dt = out.dtype
    c = [] if _zero_bias(bias) else [em.tensor(bias, dt)]
    return em.op("Gemm", [em.tensor(a, dt), em.tensor(b, dt), *c],
                 alpha=float(kwargs.get("alpha", 1.0)), beta=float(kwargs.get("beta", 1.0)))


@convert("tessera.linear.default")
def _linear(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    """F.linear as the ONNX export writes it: on a 2-D input a Gemm (what fold_bn folds a
    BatchNorm1d into), else MatMul by the transposed weight, then Add of the bias."""
    x, w = args[:2]
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    dt = out.dtype
    if w.const:  # a frozen weight: transposed once, into the initializer
        wt = em.const(w.value.t(), dt, hint="weight_t")
    else:
        wt = em.op("Transpose", [em.tensor(w, dt)], perm=[1, 0])
    if x.rank == 2 and w.rank == 2:
        return em.op("Gemm", [em.tensor(x, dt), wt] + ([] if b is None else [em.tensor(b, dt)]))
    y = em.op("MatMul", [em.tensor(x, dt), wt])
    return y if b is None else em.op("Add", [y, em.tensor(b, dt)])


@convert("aten.mm.default", "aten.bmm.default", "aten.matmul.default", "tessera.matmul.default")
def _matmul(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    return em.op("MatMul", [em.tensor(args[0], out.dtype), em.tensor(args[1], out.dtype)])


@convert("aten.convolution.default")
def _conv(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args
    n = x.rank - 2
    if n < 1:
        return None
    ins = [em.ref(x), em.ref(w)] + ([em.ref(b)] if isinstance(b, Ref) else [])
    pads = list(padding) * 2 if len(padding) == n else None
    if pads is None:
        return None
    common = dict(strides=list(stride), pads=pads, dilations=list(dilation), group=int(groups),
                  kernel_shape=list(w.shape[2:]))
    if transposed:
        return em.op("ConvTranspose", ins, output_padding=list(output_padding), **common)
    return em.op("Conv", ins, **common)


@convert("aten.native_layer_norm.default")
def _layer_norm(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, shape, w, b, eps = args
    dt = x.dtype
    k = len(shape)
    scale = em.ref(w) if isinstance(w, Ref) else em.const(torch.ones(shape, dtype=dt))
    bias = em.ref(b) if isinstance(b, Ref) else em.const(torch.zeros(shape, dtype=dt))
    return em.op("LayerNormalization", [em.ref(x), scale, bias], outputs=3, axis=-k, epsilon=float(eps))


def _batch_norm(em: Emitter, x: Ref, w: Any, b: Any, mean: Any, var: Any, eps: float) -> list[str]:
    c = x.shape[1]
    dt = x.dtype
    scale = em.ref(w) if isinstance(w, Ref) else em.const(torch.ones(c, dtype=dt))
    bias = em.ref(b) if isinstance(b, Ref) else em.const(torch.zeros(c, dtype=dt))
    y = em.op("BatchNormalization", [em.ref(x), scale, bias, em.ref(mean), em.ref(var)], epsilon=float(eps))
    return [y, "", ""]  # the saved statistics of training are not inference values


@convert("aten.native_batch_norm.default")
def _native_batch_norm(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, w, b, mean, var, training, _momentum, eps = args
    if training or not isinstance(mean, Ref) or not isinstance(var, Ref) or _stats_used(node):
        return None
    return _batch_norm(em, x, w, b, mean, var, eps)


@convert("aten._native_batch_norm_legit_no_training.default")
def _bn_no_training(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, w, b, mean, var, _momentum, eps = args
    if _stats_used(node):
        return None
    return _batch_norm(em, x, w, b, mean, var, eps)


def _stats_used(node: fx.Node) -> bool:
    """Does anything read an output past the first (batch norm's saved statistics, max pool's indices)?"""
    return any(u.args[1] != 0 and u.users for u in node.users)


@convert("aten._softmax.default", "aten._log_softmax.default")
def _softmax(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x, dim = args[0], args[1]
    op = "LogSoftmax" if "log" in str(node.target) else "Softmax"
    return em.op(op, [em.tensor(x, out.dtype)], axis=_axis(dim, x.rank))


@convert("aten.max_pool2d_with_indices.default")
def _max_pool(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    if _stats_used(node):  # the indices are read
        return None
    k, stride, pads = _window(args)
    dilation = list(args[4]) if len(args) > 4 else [1, 1]
    ceil = int(bool(args[5])) if len(args) > 5 else 0
    y = em.op("MaxPool", [em.ref(args[0])], kernel_shape=k, strides=stride, pads=pads,
              dilations=dilation * 2 if len(dilation) == 1 else dilation, ceil_mode=ceil)
    return [y, ""]


@convert("aten.avg_pool2d.default")
def _avg_pool(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    k, stride, pads = _window(args)
    ceil = int(bool(args[4])) if len(args) > 4 else 0
    include = int(bool(args[5])) if len(args) > 5 else 1
    if len(args) > 6 and args[6] is not None:  # divisor_override
        return None
    return em.op("AveragePool", [em.ref(args[0])], kernel_shape=k, strides=stride, pads=pads, ceil_mode=ceil,
                 count_include_pad=include)


@convert("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    h, w = x.shape[-2:]
    oh, ow = out.shape[-2:]
    if (oh, ow) == (1, 1):
        return em.op("GlobalAveragePool", [em.ref(x)])
    if h % oh or w % ow:
        return None
    k = [h // oh, w // ow]
    return em.op("AveragePool", [em.ref(x)], kernel_shape=k, strides=k)


@convert("aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec", "aten.upsample_nearest2d.default",
         "aten.upsample_bilinear2d.default")
def _upsample(em: Emitter, node: fx.Node, args: tuple, kwargs: dict, out: Any) -> Any:
    x = args[0]
    bilinear = "bilinear" in str(node.target)
    align = bool(args[2]) if bilinear and len(args) > 2 else False
    coord = "align_corners" if align else ("half_pixel" if bilinear else "asymmetric")
    return em.op("Resize", [em.ref(x), "", "", em.ints(out.shape)], mode="linear" if bilinear else "nearest",
                 coordinate_transformation_mode=coord, nearest_mode="floor")
