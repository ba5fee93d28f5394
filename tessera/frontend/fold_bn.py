"""An inference BatchNormalization that follows a Conv or a linear layer becomes part of its weights.

    BN(Conv(x, W, B)) = Conv(x, W * a, (B - mean) * a + bias),   a = scale / sqrt(var + eps)

per output channel c (W's first axis, grouped or not), and for a linear layer's [rows, C] output
(BatchNorm1d after nn.Linear: Gemm, or a rank-2 MatMul by a constant)

    BN(alpha * A @ B' + beta * C) = Gemm(A, B' * a, beta * C * a + shift; alpha, beta = 1)

with B' scaled per column (per row where transB reads it transposed) and shift = bias - mean * a.
`torch.onnx.export` folds this itself (for convolutions); a model from another exporter, or
dynamo's graph through the PyTorch frontend, keeps the BatchNormalization, which fission turns
into a multiply and an add riding in every convolution's epilogue: two more per-channel vectors
read per tile, for values the compile can compute once.
The new weights are computed in float64 and rounded once to W's type, as the exporters do.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType


def _constant(g: Graph, t: str) -> np.ndarray | None:
    return g.constants.get(t) if t else None


def _add_constant(g: Graph, base: str, value: np.ndarray) -> str:
    """`value` as a new constant of `g`, under a name derived from `base` that nothing uses."""
    name, i = base, 0
    while name in g.types:
        i += 1
        name = f"{base}_{i}"
    g.constants[name], g.types[name] = value, TensorType(value.shape, DType.from_numpy(value.dtype))
    return name


def _scale_shift(g: Graph, bn: Node, c: int) -> tuple[np.ndarray, np.ndarray] | None:
    """a = scale / sqrt(var + eps) and shift = bias - mean * a, in float64; None unless all four
    vectors are constants of `c` values."""
    vecs = [_constant(g, t) for t in bn.inputs[1:5]]
    if any(v is None or v.size != c for v in vecs):
        return None
    scale, bias, mean, var = (np.asarray(v, dtype=np.float64).reshape(c) for v in vecs)
    a = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return a, bias - mean * a


def _weights(g: Graph, layer: Node, bias_at: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The layer's constant float weight (input 1) and bias (input `bias_at`, None if absent);
    None unless both that are given are constants."""
    w = _constant(g, layer.inputs[1])
    has_bias = len(layer.inputs) > bias_at and bool(layer.inputs[bias_at])
    b = _constant(g, layer.inputs[bias_at]) if has_bias else None
    if w is None or w.dtype.kind != "f" or (has_bias and b is None):
        return None
    return w, b


def _bias(g: Graph, name: str, value: np.ndarray, had_bias: bool) -> tuple[str, ...]:
    """The folded layer's bias input: none where the layer had none and the fold's is all zeros (an
    untrained network's statistics: mean 0, shift 0), as the exporters leave it. An add of zeros in
    every kernel's epilogue is work for nothing, and it made the PyTorch frontend's ResNet-50 plan
    differ from the ONNX export's (issue 16)."""
    return (_add_constant(g, name, value),) if had_bias or value.any() else ()


def _fold_conv(g: Graph, conv: Node, bn: Node) -> Node | None:
    """The Conv that computes BN(conv(...)), or None where it does not apply."""
    found = _weights(g, conv, 2)
    if found is None:
        return None
    w, b = found
    c = w.shape[0]
    ss = _scale_shift(g, bn, c)
    if ss is None:
        return None
    a, shift = ss
    w_new = (w.astype(np.float64) * a.reshape((c,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    b_old = np.zeros(c) if b is None else b.astype(np.float64).reshape(c)
    wt = _add_constant(g, f"{conv.inputs[1]}_bn", w_new)
    ins = (conv.inputs[0], wt) + _bias(g, f"{conv.name}_bn_bias", (b_old * a + shift).astype(w.dtype), b is not None)
    return Node(conv.name, conv.op, ins, (bn.outputs[0],), dict(conv.attrs), conv.domain,
                tuple(conv.source) + tuple(bn.source or (bn.name,)))


def _fold_linear(g: Graph, lin: Node, bn: Node) -> Node | None:
    """The Gemm that computes BN(lin(...)) for a Gemm or a MatMul by a constant with a [rows, C]
    output, or None where it does not apply."""
    out = g.types[lin.outputs[0]]
    found = _weights(g, lin, 2 if lin.op == "Gemm" else len(lin.inputs))
    if len(out.shape) != 2 or found is None or found[0].ndim != 2:
        return None
    w, bias = found
    c = out.shape[1]
    ss = _scale_shift(g, bn, c)
    if ss is None:
        return None
    a, shift = ss
    attrs = dict(lin.attrs) if lin.op == "Gemm" else {}
    w_new = (w.astype(np.float64) * (a[:, None] if int(attrs.get("transB", 0)) else a[None, :])).astype(w.dtype)
    beta = float(attrs.get("beta", 1.0))
    c_old = np.zeros(c) if bias is None else np.broadcast_to(bias.astype(np.float64), np.broadcast_shapes(bias.shape, (c,)))
    wt = _add_constant(g, f"{lin.inputs[1]}_bn", w_new)
    ins = (lin.inputs[0], wt) + _bias(g, f"{lin.name}_bn_bias", (beta * c_old * a + shift).astype(w.dtype),
                                      bias is not None)
    return Node(lin.name, "Gemm", ins, (bn.outputs[0],), {**attrs, "beta": 1.0}, "",
                tuple(lin.source) + tuple(bn.source or (bn.name,)))


_FOLDS = {"Conv": _fold_conv, "Gemm": _fold_linear, "MatMul": _fold_linear}


def fold_batch_norms(g: Graph) -> int:
    """Fold each inference BatchNormalization into the Conv, Gemm or MatMul before it, in place,
    where that op's weights (and bias) and the normalization's four vectors are constants and
    nothing else reads its output. Returns the number folded; the unfolded weights stay in
    `g.constants` for the caller's `remove_dead`."""
    producers, consumers = g.producers(), g.consumers()
    outputs = set(g.outputs)
    replace: dict[str, Node] = {}  # layer name -> the layer with the normalization folded in
    drop: set[str] = set()  # the normalizations folded
    for bn in g.nodes:
        if bn.op != "BatchNormalization" or bn.domain or int(bn.attrs.get("training_mode", 0)) \
                or not int(bn.attrs.get("spatial", 1)):  # opset 7's per-element statistics: not per channel
            continue
        if any(o and consumers.get(o) for o in bn.outputs[1:]) or any(o in outputs for o in bn.outputs[1:]):
            continue
        x = bn.inputs[0]
        layer = producers.get(x)
        if layer is None or layer.op not in _FOLDS or layer.domain or layer.name in replace:
            continue
        if x in outputs or len(consumers.get(x, [])) != 1 or len(layer.outputs) != 1:
            continue
        folded = _FOLDS[layer.op](g, layer, bn)
        if folded is not None:
            replace[layer.name] = folded
            drop.add(bn.name)
            g.types.pop(x, None)
    if replace:
        g.nodes = [replace.get(n.name, n) for n in g.nodes if n.name not in drop]
    return len(replace)
