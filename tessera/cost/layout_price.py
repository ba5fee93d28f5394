"""What a storage layout costs: the prices `orchestrate/layout.py` weighs.

Analytical (no GPU): a library convolution costs its roofline in either layout,
plus, stored NCHW under tensor-core math (tf32, fp16, bf16), what cuDNN adds
around its NHWC kernels: a conversion of the input before and of the result
after, each a read and a write of the tensor and a launch. That is what the
H100 profile showed (`nchwToNhwcKernel`, `nhwcToNchwKernel`; issue 12), and it
is why a channels-last region wins. Full fp32 has no such conversions in this
model, so fp32 plans stay NCHW unless measured otherwise. Depthwise
convolutions run on CUDA cores and pay nothing either way.

Measured (a GPU): each distinct convolution is timed alone in both layouts
through the tuning database, as any candidate is (`MeasuredLayoutPrice`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from tessera.cost.analytical import cudnn_nchw_conversions, tensor_cores
from tessera.cost.db import Key, TuningDB
from tessera.cost.devices import Device
from tessera.cost.measured import (FAILED_S, Job, Profiler, _schedule_key, kernel_signature, math_mode,
                                   template_space, tune)
from tessera.ir.graph import Graph, Node, TensorType
from tessera.orchestrate.layout import padded_channels, zero_padded


# The fraction of one extra pass over a tensor that strided access costs a generated kernel.
STRIDED_PASS = 0.1


def _bytes(graph: Graph, t: str) -> float:
    return float(graph.types[t].nbytes)


class AnalyticalLayoutPrice:
    """Roofline prices of convolutions per layout, of conversions and of strided access."""

    def __init__(self, device: Device, precision: str) -> None:
        self.device, self.precision = device, precision

    def conv(self, graph: Graph, node: Node, layout: tuple[int, ...]) -> float:
        d = self.device
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        ws = graph.types[w].shape
        flops = 2.0 * graph.types[y].numel * ws[1] * math.prod(ws[2:])
        cores = tensor_cores(graph, node, self.precision)
        rate = (d.tf32 if self.precision == "tf32" else d.fp16) if cores else d.fp32
        moved = _bytes(graph, x) + _bytes(graph, w) + _bytes(graph, y)
        t = d.launch + max(moved / d.bandwidth, flops / rate)
        return t if layout else t + cudnn_nchw_conversions(graph, node, d, self.precision)

    def conversion(self, graph: Graph, tensor: str) -> float:
        return self.device.launch + 2 * _bytes(graph, tensor) / self.device.bandwidth

    def pad(self, graph: Graph, node: Node) -> bool:
        """The alignment rule: a library kernel wants 16-byte channels."""
        return True

    def strided(self, graph: Graph, tensor: str) -> float:
        # A generated kernel that reads or writes a tensor across its storage order pays little:
        # its tiled and strided-row schedules keep the accesses coalesced. Measured on the H100
        # (efficientvit_b0 fp16, scripts/results/layout_probe/): a full pass per boundary tensor
        # priced its 110 boundary tensors at 471 µs, and kept the region NCHW, where storing it
        # channels-last cost its generated kernels 12 µs and saved 58 µs in all.
        return STRIDED_PASS * _bytes(graph, tensor) / self.device.bandwidth


def _forms(graph: Graph, node: Node, layout: tuple[int, ...]) -> tuple[bool, ...]:
    """Channels padded or not, the forms a convolution is timed in: both where it is misaligned
    and stored channels-last (`padded_channels`), else as it is."""
    return (False, True) if layout and padded_channels(graph, node) is not None else (False,)


TEMPLATE_PRICES = 3  # best-ranked convolution templates timed per (convolution, layout)


class MeasuredLayoutPrice(AnalyticalLayoutPrice):
    """Convolutions timed on the GPU in both layouts (cached in the tuning database); conversions
    and strided access priced as the analytical model does (the measured profile checks them).

    With `templates`, a convolution costs the faster of the library call and its best-ranked
    templates (`TEMPLATE_PRICES` of them), as the plan would run it: on the H100 in tf32, candy's
    last convolution (32 -> 3 channels, 9x9) costs cuDNN 83 µs stored NCHW and 118 µs NHWC, and
    its template 74 µs NHWC; priced by the library alone, its region stayed NCHW, with cuDNN's
    conversions around the call."""

    def __init__(self, device: Device, precision: str, db: TuningDB, profiler: Profiler, device_name: str,
                 versions: str, progress: Callable[[int, int], None] | None = None, templates: bool = False) -> None:
        super().__init__(device, precision)
        self.db, self.profiler, self.device_name, self.versions = db, profiler, device_name, versions
        self.progress = progress
        self.templates = templates
        # (convolution, layout, channels padded) -> seconds
        self._seconds: dict[tuple[str, tuple[int, ...], bool], float] = {}
        self.measured = 0

    def prepare(self, graph: Graph, convs: Sequence[Node], layouts: Sequence[tuple[int, ...]]) -> None:
        """Measure every (convolution, layout) pair at once, so the profiler builds in parallel:
        a misaligned one channels-last both padded and as it is."""
        jobs = {(n.name, lay, padded): self._jobs(graph, n, lay, padded) for n in convs for lay in layouts
                for padded in _forms(graph, n, lay)}
        before = len(self.db)
        got = tune([j for js in jobs.values() for j in js], self.profiler, self.db, progress=self.progress)
        self.measured += len(self.db) - before
        for k, js in jobs.items():
            s = min(got[j.key] for j in js)
            self._seconds[k] = s if math.isfinite(s) else FAILED_S

    def _variants(self, graph: Graph, node: Node, layout: tuple[int, ...]) -> dict[bool, float]:
        """Seconds of `node` in `layout`, by channels padded or not (the forms that apply)."""
        forms = _forms(graph, node, layout)
        if any((node.name, layout, p) not in self._seconds for p in forms):
            self.prepare(graph, [node], [layout])
        return {p: self._seconds[(node.name, layout, p)] for p in forms}

    def conv(self, graph: Graph, node: Node, layout: tuple[int, ...]) -> float:
        """The faster form: the layout pass pads where that is faster (`pad`)."""
        return min(self._variants(graph, node, layout).values())

    def pad(self, graph: Graph, node: Node) -> bool:
        v = self._variants(graph, node, (0, 2, 3, 1))
        return v.get(True, math.inf) <= v[False]

    def _jobs(self, graph: Graph, node: Node, layout: tuple[int, ...], padded: bool) -> list[Job]:
        """The library call, then the best-ranked templates (with `templates`), of one convolution
        in one layout (its channels padded or not); each shares the library job's signature."""
        lib = self._job(graph, node, layout, padded)
        if not self.templates:
            return [lib]
        (conv,), y = lib.prims, lib.outputs
        ranked = template_space(lib.graph, (conv,), (), y, self.precision, self.device)[:TEMPLATE_PRICES]
        return [lib] + [Job(Key(self.device_name, self.versions, lib.key.signature, _schedule_key(s)), lib.graph,
                            (conv,), (), y, s, self.precision) for s in ranked]

    def _job(self, graph: Graph, node: Node, layout: tuple[int, ...], padded: bool = False) -> Job:
        """The convolution alone, its input and output stored in `layout` (part of the signature),
        with its channels padded to the library's alignment (`padded_channels`) or as it is. Both
        are timed where padding applies: cuDNN's fp16 kernels ran resnet50's first convolution
        in 22 µs with 4 input channels and 39 µs with 8 (H100), and a template on a padded RGB
        input does 8/3 times the work, where candy's last convolution padded or not still
        picked cuDNN's slow channels-last kernels (118-148 µs against 83 NCHW, tf32)."""
        g = replace(graph, types=dict(graph.types), constants=dict(graph.constants))  # arrays shared
        padding = padded_channels(graph, node) if layout and padded else None
        if padding is not None:
            node = self._padded(g, node, *padding)
        for t in (node.inputs[0], node.outputs[0]):
            ty = g.types[t]
            g.types[t] = TensorType(ty.shape, ty.dtype, tuple(layout))
        sig = kernel_signature(g, [node], [], [node.outputs[0]], math_mode([node], self.precision))
        return Job(Key(self.device_name, self.versions, sig, "default"), g, (node,), (), (node.outputs[0],), None,
                   self.precision)

    @staticmethod
    def _padded(g: Graph, node: Node, cp: int, op: int) -> Node:
        """`node` on zero-padded channels, its new tensors and weight added to `g`."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        xt, wt, yt = g.types[x], g.types[w], g.types[y]
        names = (f"{x}/price/padded{cp}", f"{w}/price/padded{op}x{cp}", f"{y}/price/padded{op}")
        g.types[names[0]] = TensorType((xt.shape[0], cp, *xt.shape[2:]), xt.dtype)
        zero_padded(g, w, (op, cp, *wt.shape[2:]), names[1], "", node.source)  # a constant: padded here
        g.types[names[2]] = TensorType((yt.shape[0], op, *yt.shape[2:]), yt.dtype)
        return Node(node.name, node.op, (names[0], names[1], *node.inputs[2:]), (names[2],), dict(node.attrs),
                    node.domain, node.source)
