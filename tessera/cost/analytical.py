"""The analytical roofline cost of a candidate kernel.

    time = launch + max(bytes / bandwidth, vector_flops / fp32_rate + matrix_flops / matrix_rate)

Bytes are what the kernel must move through DRAM: every input it reads
(outputs of other kernels, graph inputs and constants, each once) plus every
output it writes; intermediates stay on chip. A kernel of reshapes alone is a
view of memory already written and costs (almost) nothing. With --precision fp16/bf16
float tensors move half the bytes and matrix work runs at the fp16 rate.
"""
from __future__ import annotations

import math
from typing import Callable

from tessera.cost.devices import PRECISIONS, Device
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Category, Prim
from tessera.orchestrate.candidates import Candidate
from tessera.orchestrate.graphview import OGraph, bits, free_concat, is_view

# Relative cost of one element of an elementwise primitive, in fp32 FLOPs:
# transcendental and division units run at a fraction of the FMA rate.
_ELEMENT_FLOPS = {Prim.EXP: 4, Prim.LOG: 4, Prim.TANH: 6, Prim.ERF: 6, Prim.SIGMOID: 5, Prim.SQRT: 4,
                  Prim.RECIPROCAL: 4, Prim.DIV: 4, Prim.POW: 8, Prim.SIN: 6, Prim.COS: 6, Prim.MOD: 8}


class AnalyticalCost:
    """Seconds for a candidate kernel of `og` on `device` at `precision`."""

    def __init__(self, og: OGraph, device: Device, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.og, self.device, self.precision = og, device, precision
        g = og.graph
        half = precision in ("fp16", "bf16")
        self._scale = lambda t: 0.5 if half and g.types[t].dtype.is_float and g.types[t].dtype.itemsize == 4 else 1.0
        self.out_bytes = [sum(g.types[o].nbytes * self._scale(o) for o in n.outputs if o) for n in og.nodes]
        self.ext_bytes = {t: g.types[t].nbytes * self._scale(t) for ext in og.external for t in ext}
        self.vec = [0.0] * og.n
        self.mat = [0.0] * og.n
        for i, n in enumerate(og.nodes):
            self.vec[i], self.mat[i] = self._flops(n)
        self.view_only = [is_view(g, n) for n in og.nodes]
        self.free_concat = [free_concat(og, i) for i in range(og.n)]
        self.matrix_rate = {"fp32": device.fp32, "tf32": device.tf32}.get(precision, device.fp16)
        # cuDNN's tensor-core convolutions are NHWC kernels: an NCHW one converts its input before
        # and its result after (two more launches, a read and a write of each; cost/layout_price.py).
        self.extra = [self._nchw_conversions(n) for n in og.nodes]

    def _nchw_conversions(self, n: Node) -> float:
        g = self.og.graph
        if n.op != Prim.CONV.value or g.types[n.inputs[0]].rank != 4 or not g.types[n.inputs[0]].plain:
            return 0.0
        return cudnn_nchw_conversions(g, n, self.device, self.precision,
                                      lambda t: g.types[t].nbytes * self._scale(t))

    def _flops(self, n: Node) -> tuple[float, float]:
        """(vector FLOPs, matrix-unit FLOPs) of one primitive."""
        g, p = self.og.graph, Prim(n.op)
        out = g.types[n.outputs[0]] if n.outputs else None
        if p.category is Category.ELEMENTWISE:
            return float(out.numel * _ELEMENT_FLOPS.get(p, 1)), 0.0
        if p in (Prim.REDUCE_SUM, Prim.REDUCE_MAX, Prim.REDUCE_MIN):
            return float(g.types[n.inputs[0]].numel), 0.0
        if p is Prim.WINDOW_REDUCE:
            return float(out.numel * math.prod(n.attrs["kernel"])), 0.0
        if p is Prim.MATMUL:
            k = g.types[n.inputs[0]].shape[-1]
            return 0.0, 2.0 * out.numel * k
        if p in (Prim.CONV, Prim.CONV_TRANSPOSE):
            w = g.types[n.inputs[1]].shape
            src = out if p is Prim.CONV else g.types[n.inputs[0]]
            per_out = w[1] * math.prod(w[2:]) if p is Prim.CONV else (w[1]) * math.prod(w[2:])
            flops = 2.0 * src.numel * per_out
            # Grouped convs with few channels per group (depthwise) run on CUDA cores.
            return (flops, 0.0) if w[1] < 8 else (0.0, flops)
        return 0.0, 0.0

    def traffic(self, c: Candidate) -> tuple[float, float]:
        """(bytes read, bytes written) by candidate c."""
        read = sum(self.out_bytes[u] for u in bits(c.inputs))
        ext: set[str] = set()
        for i in bits(c.nodes):
            ext |= self.og.external[i]
        read += sum(self.ext_bytes[t] for t in ext)
        return read, sum(self.out_bytes[v] for v in bits(c.outputs))

    def _copies_nothing(self, members: tuple[int, ...]) -> bool:
        """Reshapes that are views, or a concatenation its producers write in place (`view_cost`)."""
        return all(self.view_only[i] for i in members) or (len(members) == 1 and self.free_concat[members[0]])

    def roofline(self, c: Candidate) -> float:
        """The time the kernel's traffic and arithmetic need at the device's rates, with no launch cost."""
        members = bits(c.nodes)
        if self._copies_nothing(members):
            return 0.0
        read, written = self.traffic(c)
        compute = sum(self.vec[i] for i in members) / self.device.fp32 + \
            sum(self.mat[i] for i in members) / self.matrix_rate
        return max((read + written) / self.device.bandwidth, compute)

    def __call__(self, c: Candidate) -> float:
        members = bits(c.nodes)
        if self._copies_nothing(members):
            return 1e-9 * len(members)  # a view: no launch; a nanosecond of bookkeeping breaks ties
        read, written = self.traffic(c)
        vec = sum(self.vec[i] for i in members)
        mat = sum(self.mat[i] for i in members)
        compute = vec / self.device.fp32 + mat / self.matrix_rate
        extra = sum(self.extra[i] for i in members)
        return self.device.launch + max((read + written) / self.device.bandwidth, compute) + extra


def tensor_cores(graph: Graph, conv: Node, precision: str) -> bool:
    """Does a library convolution run on the tensor cores? Under tf32/fp16/bf16 math, unless it
    has fewer than 8 input channels per group (depthwise convolutions run on CUDA cores)."""
    return precision in ("tf32", "fp16", "bf16") and graph.types[conv.inputs[1]].shape[1] >= 8


def cudnn_nchw_conversions(graph: Graph, conv: Node, device: Device, precision: str,
                           nbytes: Callable[[str], float] | None = None) -> float:
    """What cuDNN adds around a tensor-core convolution handed NCHW tensors: its kernels are NHWC,
    so it converts the input before and the result after (two launches, a read and a write of
    each; `nchwToNhwcKernel` / `nhwcToNchwKernel` in the H100 profile of issue 12)."""
    if not tensor_cores(graph, conv, precision):
        return 0.0
    size = nbytes or (lambda t: float(graph.types[t].nbytes))
    return 2 * device.launch + 2 * (size(conv.inputs[0]) + size(conv.outputs[0])) / device.bandwidth
