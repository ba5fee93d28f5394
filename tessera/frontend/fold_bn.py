"""An inference BatchNormalization that follows a Conv or a linear layer becomes part of its weights.

    BN(Conv(x, W, B)) = Conv(x, W * a, (B - mean) * a + bias),   a = scale / sqrt(var + eps)

per output channel c (W's first axis, grouped or not), and for a linear layer's [rows, C] output
(BatchNorm1d after nn.Linear: Gemm, or a rank-2 MatMul by a constant)

    BN(alpha * A @ B' + beta * C) = Gemm(A, B' * a, beta * C * a + shift; alpha, beta = 1)

with B' scaled per column (per row where transB reads it transposed) and shift = bias - mean * a. `torch.onnx.export` folds this itself;
a model from another exporter, or dynamo's graph through the PyTorch frontend, keeps the
BatchNormalization, which fission turns into a multiply and an add riding in every convolution's
epilogue: two more per-channel vectors read per tile, for values the compile can compute once.
The new weights are computed in float64 and rounded once to W's type, as the exporters do.
"""
from __future__ import annotations

import numpy as np

from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node, TensorType


def _constant(g: Graph, t: str) -> np.ndarray | None:
    return g.constants.get(t) if t else None


def _fresh(g: Graph, base: str) -> str:
    name, i = base, 0
    while name in g.types:
        i += 1
        name = f"{base}_{i}"
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


def _fold_linear(g: Graph, lin: Node, bn: Node) -> Node | None:
    """The Gemm that computes BN(lin(...)) for a Gemm or a MatMul by a constant with a [rows, C]
    output, or None where it does not apply."""
    out = g.types[lin.outputs[0]]
    if len(out.shape) != 2:
        return None
    c = out.shape[1]
    a_attrs = dict(lin.attrs) if lin.op == "Gemm" else {}
    trans_b = int(a_attrs.get("transB", 0))
    w = _constant(g, lin.inputs[1])
    bias_in = lin.inputs[2] if lin.op == "Gemm" and len(lin.inputs) > 2 and lin.inputs[2] else ""
    bias = _constant(g, bias_in) if bias_in else None
    if w is None or w.ndim != 2 or w.dtype.kind != "f" or (bias_in and bias is None):
        return None
    ss = _scale_shift(g, bn, c)
    if ss is None:
        return None
    a, shift = ss
    w_new = (w.astype(np.float64) * (a[:, None] if trans_b else a[None, :])).astype(w.dtype)
    beta = float(a_attrs.get("beta", 1.0))
    c_old = np.zeros(c) if bias is None else np.broadcast_to(bias.astype(np.float64), np.broadcast_shapes(bias.shape, (c,)))
    c_new = (beta * c_old * a + shift).astype(w.dtype)
    wt, ct = _fresh(g, f"{lin.inputs[1]}_bn"), _fresh(g, f"{lin.name}_bn_bias")
    g.constants[wt], g.types[wt] = w_new, TensorType(w_new.shape, DType.from_numpy(w_new.dtype))
    g.constants[ct], g.types[ct] = c_new, TensorType(c_new.shape, DType.from_numpy(c_new.dtype))
    attrs = {**a_attrs, "beta": 1.0}
    return Node(lin.name, "Gemm", (lin.inputs[0], wt, ct), (bn.outputs[0],), attrs, "",
                tuple(lin.source) + tuple(bn.source or (bn.name,)))


def fold_batch_norms(g: Graph) -> int:
    """Fold each inference BatchNormalization into the Conv, Gemm or MatMul before it, in place,
    where that op's weights (and bias) and the normalization's four vectors are constants and
    nothing else reads its output. Returns the number folded."""
    producers, consumers = g.producers(), g.consumers()
    outputs = set(g.outputs)
    replace: dict[str, Node] = {}  # conv name -> the folded conv
    drop: set[str] = set()  # the normalizations folded
    for bn in g.nodes:
        if bn.op != "BatchNormalization" or bn.domain or int(bn.attrs.get("training_mode", 0)) \
                or not int(bn.attrs.get("spatial", 1)):  # opset 7's per-element statistics: not per channel
            continue
        if any(o and consumers.get(o) for o in bn.outputs[1:]) or any(o in outputs for o in bn.outputs[1:]):
            continue
        x = bn.inputs[0]
        conv = producers.get(x)
        if conv is None or conv.op not in ("Conv", "Gemm", "MatMul") or conv.domain or conv.name in replace:
            continue
        if x in outputs or len(consumers.get(x, [])) != 1 or len(conv.outputs) != 1:
            continue
        if conv.op != "Conv":
            folded = _fold_linear(g, conv, bn)
            if folded is not None:
                replace[conv.name] = folded
                drop.add(bn.name)
                g.types.pop(x, None)
            continue
        w = _constant(g, conv.inputs[1])
        b = _constant(g, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or w.dtype.kind != "f" or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
            continue
        c = w.shape[0]
        ss = _scale_shift(g, bn, c)
        if ss is None:
            continue
        a, shift = ss
        w_new = (w.astype(np.float64) * a.reshape((c,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b_old = np.zeros(c) if b is None else b.astype(np.float64).reshape(c)
        b_new = (b_old * a + shift).astype(w.dtype)
        wt, bt = _fresh(g, f"{conv.inputs[1]}_bn"), _fresh(g, f"{conv.name}_bn_bias")
        g.constants[wt], g.types[wt] = w_new, TensorType(w_new.shape, DType.from_numpy(w_new.dtype))
        g.constants[bt], g.types[bt] = b_new, TensorType(b_new.shape, DType.from_numpy(b_new.dtype))
        replace[conv.name] = Node(conv.name, conv.op, (conv.inputs[0], wt, bt), (bn.outputs[0],), dict(conv.attrs),
                                  conv.domain, tuple(conv.source) + tuple(bn.source or (bn.name,)))
        drop.add(bn.name)
        g.types.pop(x, None)
    if replace:
        g.nodes = [replace.get(n.name, n) for n in g.nodes if n.name not in drop]
        g.remove_dead()  # the unfolded weights, where nothing else reads them
    return len(replace)
