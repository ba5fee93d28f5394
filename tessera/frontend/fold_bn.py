"""An inference BatchNormalization that follows a Conv becomes part of the Conv's weights.

    BN(Conv(x, W, B)) = Conv(x, W * a, (B - mean) * a + bias),   a = scale / sqrt(var + eps)

per output channel c (W's first axis, grouped or not). `torch.onnx.export` folds this itself;
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


def fold_batch_norms(g: Graph) -> int:
    """Fold each inference BatchNormalization into the Conv before it, in place, where the Conv's
    weights (and bias) and the normalization's four vectors are constants and nothing else reads
    the Conv's output. Returns the number folded."""
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
        if conv is None or conv.op != "Conv" or conv.domain or conv.name in replace:
            continue
        if x in outputs or len(consumers.get(x, [])) != 1 or len(conv.outputs) != 1:
            continue
        w = _constant(g, conv.inputs[1])
        b = _constant(g, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or w.dtype.kind != "f" or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
            continue
        vecs = [_constant(g, t) for t in bn.inputs[1:5]]
        c = w.shape[0]
        if any(v is None or v.size != c for v in vecs):
            continue
        scale, bias, mean, var = (np.asarray(v, dtype=np.float64).reshape(c) for v in vecs)
        a = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        w_new = (w.astype(np.float64) * a.reshape((c,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b_old = np.zeros(c) if b is None else b.astype(np.float64).reshape(c)
        b_new = ((b_old - mean) * a + bias).astype(w.dtype)
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
