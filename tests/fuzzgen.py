"""Random ONNX graphs for the differential fuzzer (`tests/test_fuzz.py`, `scripts/fuzz.py`).

`graph_specs()` is a Hypothesis strategy that draws a `GraphSpec` (`fuzzspec.py`): graph inputs,
constants, ONNX nodes and outputs, plus how to compile it (precision, layout policy, strategy, a
schedule seed). The spec is plain data; `fuzzcheck.check` turns it into a model, compiles it
with tessera and compares it with onnxruntime. Hypothesis shrinks a failing spec to the smallest
one that still fails: fewer steps, smaller shapes, the first choice of every list (the simplest
op, the default option).

A graph starts from one graph input; each step picks an op generator (`GENERATORS`, from
`fuzzops.py` and `fuzzops_nn.py`), which takes operands from the pool of tensors made so far or
makes the inputs and constants it needs. Every tensor left unconsumed becomes a graph output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import fuzzops as ops
import fuzzops_nn as nn
from fuzzspec import BF16, FLOAT, HALF, LAYOUTS, OPSETS, PRECISIONS, Builder, Draw, GraphSpec
from hypothesis import strategies as st


@dataclass(frozen=True)
class Gen:
    name: str
    family: str
    fn: Callable[[Draw, Builder], None]
    min_opset: int = 1


GENERATORS: list[Gen] = [
    Gen("unary", "elementwise", ops.unary),
    Gen("binary", "elementwise", ops.binary),
    Gen("compare", "compare", ops.compare),
    Gen("logic", "compare", ops.logic),
    Gen("where", "compare", ops.where),
    Gen("isnan", "compare", ops.isnan),
    Gen("cast", "cast", ops.cast),
    Gen("integer", "integer", ops.integer),
    Gen("transpose", "layout", ops.transpose),
    Gen("reshape", "layout", ops.reshape),
    Gen("concat", "layout", ops.concat),
    Gen("split", "layout", ops.split),
    Gen("slice", "layout", ops.slice_),
    Gen("pad", "layout", ops.pad),
    Gen("expand", "layout", ops.expand),
    Gen("space_depth", "layout", ops.space_depth),
    Gen("gather", "gather", ops.gather),
    Gen("gather_elements", "gather", ops.gather_elements),
    Gen("gather_nd", "gather", ops.gather_nd),
    Gen("scatter", "gather", ops.scatter),
    Gen("matmul", "linear", nn.matmul),
    Gen("gemm", "linear", nn.gemm),
    Gen("einsum", "linear", nn.einsum, 12),
    Gen("conv", "conv", lambda d, b: (nn.conv(d, b), None)[1]),
    Gen("conv_transpose", "conv", nn.conv_transpose),
    Gen("conv_stack", "conv", nn.conv_stack),
    Gen("softmax", "normalization", nn.softmax),
    Gen("layer_norm", "normalization", nn.layer_norm, 17),
    Gen("norm_projection", "normalization", nn.norm_projection, 17),
    Gen("gated_mlp", "linear", nn.gated_mlp),
    Gen("rotary_projection", "linear", nn.rotary_projection),
    Gen("instance_norm", "normalization", nn.instance_norm),
    Gen("batch_norm", "normalization", nn.batch_norm),
    # GroupNormalization-18 is deprecated: the ONNX checker (and tessera's reader) refuse it.
    Gen("group_norm", "normalization", nn.group_norm, 21),
    Gen("reduce", "reduction", nn.reduce),
    Gen("pool", "pooling", nn.pool),
    Gen("resize", "resize", nn.resize),
    Gen("opaque", "opaque", nn.opaque),
]
FAMILIES = sorted({g.family for g in GENERATORS})


# ---- the strategy --------------------------------------------------------------------
@st.composite
def graph_specs(draw: Callable[[Any], Any], precisions: Sequence[str] = PRECISIONS, max_steps: int = 6,
                families: Sequence[str] | None = None, big: float = 0.15) -> GraphSpec:
    """A random graph of 1..max_steps op steps over the given op families (default: all)."""
    d = Draw(draw)
    precision = d.pick(list(precisions))
    opset = d.pick(OPSETS)
    layout = d.pick(LAYOUTS)
    strategy = "greedy" if d.maybe(0.1) else "optimal"
    b = Builder(d, opset, precision, big=d.maybe(big))
    gens = [g for g in GENERATORS if (families is None or g.family in families) and opset >= g.min_opset]
    first = b.add_input(b.shape(d.int(1, 4)))
    del first
    for _ in range(d.int(1, max_steps)):
        g = d.pick(gens)
        b.family = g.family
        g.fn(d, b)
    if not b.nodes:  # every step declined (no shape it could use): one node, so the graph computes
        b.family = "elementwise"
        x = b.pool[-1]
        b.one("Relu" if x.dtype == FLOAT else "Identity", [x], [(x.shape, x.dtype)], exact=x.exact)
    outputs = _outputs(d, b)
    return GraphSpec(opset, precision, layout, strategy, b.inputs, b.consts, b.nodes, outputs,
                     seed=d.int(0, 2 ** 16), schedule_seed=d.int(0, 2 ** 16) if d.maybe(0.7) else 0,
                     index_bounds=b.index_bounds,
                     types=b.types,
                     # drawn last: earlier draws stay as they were (the default mode since session 39)
                     rewrites="on" if d.maybe(0.3) else "regroup" if d.maybe(0.5) else "off",
                     kernel_nodes=1 if d.maybe(0.15) else 0)  # drawn after all the others, as rewrites was


def _outputs(d: Draw, b: Builder) -> list[str]:
    produced = [t for t in b.pool if any(t.name in n.outputs for n in b.nodes)]
    leaves = [t for t in reversed(produced) if t.name not in b.consumed and t.dtype != BF16]
    outs = leaves[:4]
    if not outs:  # every node output was consumed (cannot happen: the last node's are not), or none
        outs = produced[-1:]
    inner = [t for t in produced if t not in outs and t.dtype != BF16]
    if inner and d.maybe(0.25):
        outs.append(inner[d.int(0, len(inner) - 1)])
    if outs and outs[0].dtype == FLOAT and d.maybe(0.1):  # a float16 graph output
        b.family = "cast"
        h = b.one("Cast", [outs[0]], [(outs[0].shape, HALF)], {"to": 10}, exact=False, pool=False)
        outs[0] = h
        b.pool.append(h)
    return [t.name for t in outs]
