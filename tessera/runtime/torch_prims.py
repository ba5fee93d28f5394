"""Every primitive as torch tensor operations, on whatever device its inputs live.

`run_node` follows `ir/prims.py` exactly and agrees with the NumPy reference
interpreter (`ir/interp.py`): same integer rounding, NaN propagation, padding
rules and dtypes. Differences that remain are rounding only: bfloat16 tensors
are real bfloat16 here (the interpreter holds them in float32), and float16 /
bfloat16 sums accumulate in float32 as the interpreter's do.

OPAQUE nodes go through the interpreter's onnxruntime path on the CPU.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tessera.errors import MalformedModelError, ShapeError, UnsupportedError, node_ref
from tessera.ir import aten_call
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ir.interp_opaque import run_opaque
from tessera.ir.prims import Prim

TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.FLOAT32: torch.float32, DType.FLOAT16: torch.float16, DType.BFLOAT16: torch.bfloat16,
    DType.FLOAT64: torch.float64, DType.INT64: torch.int64, DType.INT32: torch.int32,
    DType.INT8: torch.int8, DType.UINT8: torch.uint8, DType.BOOL: torch.bool,
}
DTYPES_OF: dict[torch.dtype, DType] = {v: k for k, v in TORCH_DTYPES.items()}

Kernel = Callable[[Node, Sequence[torch.Tensor], TensorType, torch.device], torch.Tensor]


def run_node(node: Node, args: Sequence[torch.Tensor], out_types: Sequence[TensorType], *,
             device: torch.device | str | None = None,
             opsets: Mapping[str, int] | None = None) -> list[torch.Tensor]:
    """The outputs of primitive `node` on `args`, one per (non-empty) output,
    each with exactly its declared shape and dtype.

    `device` places outputs of nodes without inputs (FILL, some OPAQUE); it
    defaults to the first argument's device, else the CPU. `opsets` are the
    graph's (an OPAQUE node of a custom domain needs that domain's version).
    """
    try:
        prim = Prim(node.op)
    except ValueError:
        raise MalformedModelError(f"{node_ref(node.name, node.op)} is not a primitive") from None
    dev = torch.device(device) if device is not None else (args[0].device if args else torch.device("cpu"))
    if prim is Prim.OPAQUE:
        outs = _opaque(node, args, out_types, dev, opsets)
    else:
        outs = [_KERNELS[prim](node, args, out_types[0], dev)]
    if len(outs) != len(out_types):
        raise ShapeError(f"{node_ref(node.name, node.op)}: computed {len(outs)} outputs, "
                         f"the graph declares {len(out_types)}")
    return [_conform(node, y, t) for y, t in zip(outs, out_types)]


def _conform(node: Node, y: torch.Tensor, t: TensorType) -> torch.Tensor:
    want = TORCH_DTYPES[t.dtype]
    if y.dtype != want:
        y = y.to(want)
    if tuple(y.shape) != t.shape:
        raise ShapeError(f"{node_ref(node.name, node.op)}: computed shape {list(y.shape)}, "
                         f"the graph declares {list(t.shape)}")
    return y


def _acc(dt: torch.dtype) -> torch.dtype | None:
    """Accumulator of sums: 16-bit floats accumulate in float32, like the interpreter."""
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else None


def _lowest(dt: torch.dtype) -> float | int | bool:
    if dt.is_floating_point:
        return float("-inf")
    if dt is torch.bool:
        return False
    return int(torch.iinfo(dt).min)


def _torch_pads(pads: Sequence[int], n: int) -> list[int]:
    """ONNX pads (begins then ends) of the trailing n dims -> F.pad order (last dim first)."""
    out: list[int] = []
    for i in reversed(range(n)):
        out += [int(pads[i]), int(pads[i + n])]
    return out


# ---- elementwise -------------------------------------------------------------------
def _fill(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return torch.full(t.shape, node.attrs["value"], dtype=TORCH_DTYPES[t.dtype], device=dev)


def _cast(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    (x,) = args
    to = TORCH_DTYPES[DType(node.attrs["dtype"])]
    if to is torch.bool:
        return x != 0  # ONNX: nonzero (and NaN) is true
    if x.is_floating_point() and not to.is_floating_point:
        # Float -> int truncates toward zero (torch's conversion does); narrow
        # types go through int64 so out-of-range values wrap as NumPy's do.
        return x.to(torch.int64).to(to) if to in (torch.int8, torch.uint8) else x.to(to)
    return x.to(to)


def _div(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point():
        return torch.div(x, y)
    # ONNX integer Div truncates toward zero. Division by zero is undefined in
    # ONNX; torch would raise on the CPU, NumPy (the reference) gives 0.
    zero = y == 0
    return torch.div(x, y.masked_fill(zero, 1), rounding_mode="trunc").masked_fill(zero, 0)


def _pow(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point() or x.dtype is torch.bool:
        return torch.pow(x, y)
    # x ** -k for integers truncates to 0 unless |x| == 1 (as the interpreter says).
    neg = y < 0
    out = torch.pow(x, y.masked_fill(neg, 0))
    one = torch.ones_like(out)
    tiny = torch.where(x == 1, one, torch.where(x == -1, torch.where(y % 2 == 0, one, -one), 0 * one))
    return torch.where(neg, tiny, out)


_UNARY: dict[Prim, Callable[[torch.Tensor], torch.Tensor]] = {
    Prim.NEG: torch.neg, Prim.ABS: torch.abs, Prim.EXP: torch.exp, Prim.LOG: torch.log, Prim.SQRT: torch.sqrt,
    Prim.RECIPROCAL: torch.reciprocal, Prim.TANH: torch.tanh, Prim.ERF: torch.erf,
    Prim.SIGMOID: torch.sigmoid, Prim.SIN: torch.sin, Prim.COS: torch.cos, Prim.FLOOR: torch.floor,
    Prim.ISNAN: torch.isnan, Prim.NOT: torch.logical_not,
}
_BINARY: dict[Prim, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    Prim.ADD: torch.add, Prim.SUB: torch.sub, Prim.MUL: torch.mul, Prim.DIV: _div, Prim.POW: _pow,
    Prim.MOD: torch.fmod, Prim.MAX: torch.maximum, Prim.MIN: torch.minimum,  # both propagate NaN
    Prim.EQUAL: torch.eq, Prim.GREATER: torch.gt, Prim.LESS: torch.lt,
    Prim.AND: torch.logical_and, Prim.OR: torch.logical_or,
}


def _unary(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return _UNARY[node.prim](args[0])


def _binary(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return _BINARY[node.prim](args[0], args[1])


def _where(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return torch.where(args[0], args[1], args[2])


# ---- reduce / broadcast --------------------------------------------------------------
def _reduce(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    x = args[0]
    axes = tuple(node.attrs["axes"])
    if not axes:  # torch reads dim=() as "every dim"
        return x
    if node.prim is Prim.REDUCE_SUM:
        return torch.sum(x, dim=axes, keepdim=True, dtype=_acc(x.dtype))
    fn = torch.amax if node.prim is Prim.REDUCE_MAX else torch.amin  # both propagate NaN
    return fn(x, dim=axes, keepdim=True)


def _broadcast(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return args[0].expand(tuple(node.attrs["shape"]))  # a view


def _window_reduce(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    # Pad with the reduction's identity (skipping a padded position is the same
    # as adding 0 / offering the lowest value to a max), then view the windows
    # with unfold: exact for every dtype, unlike avg_pool * volume.
    a = node.attrs
    x = args[0]
    kernel, strides, dils, pads = a["kernel"], a["strides"], a["dilations"], a["pads"]
    n, r = len(kernel), x.dim()
    kind = a["kind"]
    if kind not in ("sum", "max"):
        raise MalformedModelError(f"{node_ref(node.name, node.op)}: window_reduce kind {kind!r}")
    if any(pads):
        x = F.pad(x, _torch_pads(pads, n), value=0 if kind == "sum" else _lowest(x.dtype))
    for i in range(n):
        span = dils[i] * (kernel[i] - 1) + 1
        x = x.unfold(r - n + i, span, strides[i])  # [..., out_i, ..., span_i]
        if dils[i] > 1:
            x = x[..., :: dils[i]]
    window = tuple(range(r, r + n))
    if kind == "sum":
        return x.sum(dim=window, dtype=_acc(x.dtype))
    return x.amax(dim=window)


# ---- layout ------------------------------------------------------------------------
def _transpose(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return args[0].permute(tuple(node.attrs["perm"]))


def _reshape(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return args[0].reshape(tuple(node.attrs["shape"]))


def _slice(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    # torch has no negative-step views: slice the same elements forward, then flip.
    index: list[slice] = []
    flips: list[int] = []
    for d, (start, step, n) in enumerate(zip(node.attrs["starts"], node.attrs["steps"], node.attrs["shape"])):
        if n == 0:
            index.append(slice(0, 0))
        elif step > 0:
            index.append(slice(start, start + (n - 1) * step + 1, step))
        else:
            last = start + (n - 1) * step
            index.append(slice(last, start + 1, -step))
            flips.append(d)
    y = args[0][tuple(index)]
    return y.flip(flips) if flips else y


def _pad(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    x = args[0]
    p = node.attrs["pads"]
    r = x.dim()
    mode = node.attrs["mode"]
    if mode == "constant":
        v: Any = node.attrs.get("value", 0)
        v = bool(v) if x.dtype is torch.bool else (float(v) if x.is_floating_point() else int(v))
        return F.pad(x, _torch_pads(p, r), value=v)
    if mode not in ("reflect", "edge"):
        raise MalformedModelError(f"{node_ref(node.name, node.op)}: pad mode {mode!r}")
    # F.pad reflects/replicates only some ranks and dims; an index per padded dim
    # works for every rank and dtype (pads are < the dim for reflect: prim_shapes).
    for d in range(r):
        b, e = int(p[d]), int(p[d + r])
        if b == 0 and e == 0:
            continue
        size = x.shape[d]
        i = torch.arange(-b, size + e, device=x.device)
        if mode == "reflect":
            i = i.abs()
            i = torch.where(i >= size, 2 * (size - 1) - i, i)
        else:
            i = i.clamp(0, size - 1)
        x = x.index_select(d, i)
    return x


def _concat(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    return torch.cat(list(args), dim=node.attrs["axis"])


def _wrap(idx: torch.Tensor, extent: int) -> torch.Tensor:
    """Negative indices count from the end (ONNX Gather/GatherElements)."""
    idx = idx.to(torch.int64)
    return torch.where(idx < 0, idx + extent, idx)


def _gather(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    data, idx = args
    axis = node.attrs["axis"]
    flat = data.index_select(axis, _wrap(idx, data.shape[axis]).reshape(-1))
    return flat.reshape(data.shape[:axis] + idx.shape + data.shape[axis + 1:])


def _gather_elements(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    data, idx = args
    axis = node.attrs["axis"]
    # torch.gather, like ONNX, lets the indices be smaller than the data off the axis.
    return torch.gather(data, axis, _wrap(idx, data.shape[axis]))


# ---- linear ------------------------------------------------------------------------
def _matmul(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device) -> torch.Tensor:
    a, b = args
    if a.is_floating_point():
        return torch.matmul(a, b)
    # CUDA has no integer GEMM: a broadcast product summed over k is exact (and wraps like NumPy).
    return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(dim=-2)


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """`y` through the activation a linear kernel absorbed (`KernelImpl.activation`), in place where it can."""
    if activation is None:
        return y
    if activation == "relu":
        return torch.relu_(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    raise ValueError(f"unknown library epilogue activation {activation!r}")


def _sums_wide(a: torch.Tensor, round_once: bool) -> bool:
    """Whether a library call on `a` adds a whole bias matrix (beta * C) in float32 and rounds once.

    cuBLAS on CUDA rounds a float16/bfloat16 product to its type before it adds C, for most shapes:
    a C that nearly cancels the product was 1e-2 to 2.4e-2 off on the H200 (session 47's
    rounding_probe.py; 512x24x24 and 4096x64x256; 6x24x5 was not). Its bias-vector epilogue adds
    before it rounds. Where the bias is the product's own ONNX node's (`round_once`: a Gemm's C, which
    onnxruntime adds before it rounds) such a call writes float32 (torch's out_dtype) instead. An Add
    node after a MatMul (BERT's attention mask) keeps the narrow call: onnxruntime rounds the product
    there too."""
    return round_once and a.is_cuda and a.dtype in (torch.float16, torch.bfloat16)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str | None,
           alpha: float = 1.0, round_once: bool = False) -> torch.Tensor:
    """bias + alpha * (a @ b), then the activation, in cuBLASLt's epilogue where torch offers it:
    RELU_BIAS always, GELU_BIAS (the tanh GELU) on CUDA. On the CPU `use_gelu` computes the erf GELU,
    and on ROCm it is not documented as tanh: there the tanh GELU follows the addmm. A whole bias
    matrix of a narrow CUDA call is summed in float32, then rounded once (`_sums_wide`)."""
    if bias.dim() == 2 and _sums_wide(a, round_once):
        y = torch.addmm(bias.float(), a, b, alpha=alpha, out_dtype=torch.float32)
        return _activate(y, activation).to(a.dtype)
    if activation == "relu":
        return torch._addmm_activation(bias, a, b, alpha=alpha)
    if activation == "gelu_tanh" and a.is_cuda and torch.version.hip is None:
        return torch._addmm_activation(bias, a, b, alpha=alpha, use_gelu=True)
    return _activate(torch.addmm(bias, a, b, alpha=alpha), activation)


def run_linear_fused(node: Node, args: Sequence[torch.Tensor], out: TensorType, bias: torch.Tensor,
                     activation: str | None, alpha: float = 1.0, round_once: bool = False) -> torch.Tensor:
    """A linear primitive with a bias vector, or a matmul with a whole bias matrix of the product's rows and
    columns (and an activation: None, "relu" or "gelu_tanh"; a matmul's product scaled by `alpha`
    first) computed by the library call itself.

    matmul: cuBLAS(Lt) addmm with the bias (and activation) epilogue when the right operand is
    one matrix for every row, else baddbmm over the broadcast batch (then the activation); conv: the
    bias argument of the convolution; a transposed conv adds (and activates) afterwards. `round_once`:
    the bias is the product's own ONNX node's, to be added before the product rounds (`_sums_wide`).
    """
    prim = Prim(node.op)
    if prim is Prim.MATMUL:
        a, b = args
        if b.dim() == 2 or b.shape[:-2].numel() == 1:  # one right operand for every row: one 2-D GEMM
            a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2], b.shape[-1])
            y = _addmm(bias, a2, b2, activation, alpha, round_once)
            return _conform(node, y.reshape(out.shape), out)
        (m, k), n = a.shape[-2:], b.shape[-1]
        # batched: baddbmm, which adds the bias before the product rounds (on CUDA in float32: cuBLAS rounds
        # first even for a vector, `_sums_wide`). Batches that broadcast are expanded first, as torch.matmul
        # would copy them too.
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3, b3 = a.expand(*batch, m, k).reshape(-1, m, k), b.expand(*batch, k, n).reshape(-1, k, n)
        c = bias.reshape(-1, m, n) if bias.dim() == 2 else bias  # a whole bias comes as [rows, columns]
        y = torch.baddbmm(c.float(), a3, b3, alpha=alpha, out_dtype=torch.float32) if _sums_wide(a3, round_once) \
            else torch.baddbmm(c, a3, b3, alpha=alpha)
        y = y.reshape(out.shape)
    elif prim is Prim.CONV:
        y = _conv(node, args, out, args[0].device, bias)
    else:
        y = _conv_transpose(node, args, out, args[0].device, bias)
    return _conform(node, _activate(y, activation), out)


def pointwise_conv_as_gemm(node: Node, args: Sequence[torch.Tensor], bias: torch.Tensor | None = None,
                           activation: str | None = None) -> torch.Tensor | None:
    """A 1x1 convolution (stride 1, no padding, one group) on channels-last data is one GEMM over the
    storage: [N*H*W, C] @ [C, O], leading dimension C, with the bias and activation in cuBLASLt's
    epilogue.
    cuDNN's NHWC path for such small convolutions costs more (setup kernels beside the GEMM), and
    its NCHW path is a GEMM of leading dimension H*W, which only unaligned kernels take. Returns the
    result channels-last, or None where this does not apply."""
    x, w = args[0], args[1]
    a = node.attrs
    if node.op != Prim.CONV.value or x.dim() != 4 or tuple(w.shape[2:]) != (1, 1) or a.get("group", 1) != 1 \
            or any(int(v) != 1 for v in a["strides"]) or any(int(v) != 0 for v in a["pads"]) \
            or not x.is_contiguous(memory_format=torch.channels_last) or x.shape[1] < 2:
        return None
    n, c, h, wd = x.shape
    o = w.shape[0]
    x2 = x.permute(0, 2, 3, 1).reshape(n * h * wd, c)  # a view of the NHWC storage
    w2 = w.reshape(o, c).t()
    y2 = _activate(x2 @ w2, activation) if bias is None else _addmm(bias, x2, w2, activation)
    return y2.view(n, h, wd, o).permute(0, 3, 1, 2)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _spatial_rank(node: Node, x: torch.Tensor) -> int:
    n = x.dim() - 2
    if n not in _CONV:
        raise UnsupportedError(f"{node_ref(node.name, node.op)}: torch convolves 1 to 3 spatial dims, not {n}")
    return n


def _conv(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    x, w = args
    a = node.attrs
    n = _spatial_rank(node, x)
    pads = [int(v) for v in a["pads"]]
    padding: Sequence[int] = pads[:n]
    if pads[:n] != pads[n:]:  # torch pads symmetrically: pad asymmetric pads explicitly
        x = F.pad(x, _torch_pads(pads, n))
        padding = [0] * n
    return _convolve(n, x, w, bias, tuple(a["strides"]), padding, tuple(a["dilations"]), a["group"])


def _convolve(n: int, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, strides: tuple,
              padding: Sequence[int], dilations: tuple, groups: int) -> torch.Tensor:
    """torch's convolution, around CPU defects of its bfloat16 convolutions (torch 2.13, oneDNN): a
    depthwise one with two filters a channel and strides (1, 2) on channels-last data of a few columns
    (32-117% off, the CPU fuzzer in session 48), and one whose output is a single column at stride 2
    ([2, 1, 8, 5] by [4, 1, 3, 5] filters: 115% off, row-major too; session 56, seed 5605). On the CPU
    a bfloat16 convolution runs in float32, rounded once at the end, as the GPU's accumulates (its
    result keeps the input's memory format). The CPU runs tests; CUDA is left as it is."""
    return _cpu_bf16_in_fp32(_CONV[n], x, w, bias, strides, tuple(padding), dilations, groups)


def _cpu_bf16_in_fp32(conv: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor,
                      bias: torch.Tensor | None, *args: Any) -> torch.Tensor:
    """`conv(x, w, bias, *args)`, in float32 and rounded once where it is a bfloat16 call on the CPU
    (`_convolve`'s defects); as it is elsewhere."""
    if x.device.type != "cpu" or x.dtype != torch.bfloat16:
        return conv(x, w, bias, *args)
    return conv(x.float(), w.float(), None if bias is None else bias.float(), *args).to(torch.bfloat16)


def _conv_transpose(node: Node, args: Sequence[torch.Tensor], t: TensorType, dev: torch.device,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    # The full output (pads 0) is cropped by pb at the start and pe at the end;
    # output_padding extends it at the end with positions no input reaches (0).
    # torch crops symmetrically and refuses output_padding >= max(stride, dilation):
    # let it do min(pb, pe) and the output_padding it takes, crop/extend the rest.
    # A `bias` (one value per output channel) goes into the call, which adds it before it rounds
    # its fp16/bf16 result; added afterwards, the sum would be rounded twice.
    x, w = args
    a = node.attrs
    n = _spatial_rank(node, x)
    s, d, p, op = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    takes = [op[i] < max(s[i], d[i]) for i in range(n)]
    # Where torch cannot take the output_padding, it must crop nothing at the end
    # either: the zeros we append have to follow the full output's last position.
    sym = [min(p[i], p[i + n]) if takes[i] else 0 for i in range(n)]
    top = [op[i] if takes[i] else 0 for i in range(n)]
    fix = [(sym[i] - p[i], (op[i] - top[i]) - (p[i + n] - sym[i])) for i in range(n)]
    extends = any(v > 0 for f in fix for v in f)  # positions no input reaches hold the bias alone
    y = _cpu_bf16_in_fp32(_CONV_T[n], x, w, None if extends else bias, tuple(s), tuple(sym), tuple(top), a["group"],
                          tuple(d))
    if any(v for f in fix for v in f):
        y = F.pad(y, [v for f in reversed(fix) for v in f])  # negative pads crop
    if extends and bias is not None:
        y = y + bias.reshape([1, -1] + [1] * n)
    return y


# ---- opaque ------------------------------------------------------------------------
def _opaque(node: Node, args: Sequence[torch.Tensor], out_types: Sequence[TensorType], dev: torch.device,
            opsets: Mapping[str, int] | None) -> list[torch.Tensor]:
    if node.attrs.get("domain") == aten_call.ATEN_DOMAIN:  # torch itself, on the device
        results = aten_call.run(str(node.attrs["op_type"]), node.attrs["onnx_attrs"]["call"], list(args), dev)
        return [r.to(device=dev, dtype=TORCH_DTYPES[t.dtype]) for r, t in zip(results, out_types)]
    # onnxruntime on the CPU, exactly as the interpreter runs it (bfloat16 crosses as float32).
    outs = [o for o in node.outputs if o]
    graph = Graph(name="opaque", kind=GraphKind.PRIMITIVE, types=dict(zip(outs, out_types)),
                  opsets=dict(opsets) if opsets else {"": int(node.attrs["opset"])})
    in_types = [TensorType(tuple(v.shape), DTYPES_OF[v.dtype]) for v in args]
    arrays = [(v.float() if v.dtype is torch.bfloat16 else v).detach().cpu().numpy() for v in args]
    results = run_opaque(graph, node, arrays, in_types, exact=False)
    return [_from_numpy(r).to(device=dev, dtype=TORCH_DTYPES[t.dtype]) for r, t in zip(results, out_types)]


def _from_numpy(r: np.ndarray) -> torch.Tensor:
    r = np.asarray(r)
    if not (r.flags.writeable and r.flags.c_contiguous):  # torch.from_numpy wants an owned buffer
        r = np.array(r, order="C", copy=True)
    return torch.from_numpy(r)


_KERNELS: dict[Prim, Kernel] = {
    Prim.FILL: _fill, Prim.CAST: _cast, Prim.WHERE: _where,
    **{p: _unary for p in _UNARY}, **{p: _binary for p in _BINARY},
    Prim.REDUCE_SUM: _reduce, Prim.REDUCE_MAX: _reduce, Prim.REDUCE_MIN: _reduce,
    Prim.BROADCAST: _broadcast, Prim.WINDOW_REDUCE: _window_reduce,
    Prim.TRANSPOSE: _transpose, Prim.RESHAPE: _reshape, Prim.SLICE: _slice, Prim.PAD: _pad,
    Prim.CONCAT: _concat, Prim.GATHER: _gather, Prim.GATHER_ELEMENTS: _gather_elements,
    Prim.MATMUL: _matmul, Prim.CONV: _conv, Prim.CONV_TRANSPOSE: _conv_transpose,
}
assert set(_KERNELS) == set(Prim) - {Prim.OPAQUE}, "every primitive needs a kernel"
