"""Convolution templates (codegen/conv.py): one generated kernel per 2-D convolution kernel, epilogue fused.

Each generator case takes a small model's convolution kernel (the conv, every primitive computed
from its result, their free prologue) as a template under Triton's interpreter and compares what
it writes with the float64 reference on random inputs, through the GEMM tests' harness. Then the
wiring: a measured compile that picks templates, plan.json and the artifact, and whole networks
(a small one, candy at 64x64) with every convolution forced onto its template, against onnxruntime.

Tiles stay small under the interpreter: a dot of more than 2^18 multiply-adds wakes NumPy's BLAS
thread pool, which costs ~10 ms a call on a loaded 2-core machine.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from fake_profiler import TemplatePrologueProfiler
from opcheck import Const, graph_model, models_dir, rand
from kernelcheck import DEVICE
from test_gemm_template import run_exe, run_template
from test_gemm_template_wiring import check_template_round_trip

import tessera
from tessera import compiler
from tessera.codegen.conv import conv_problem, conv_schedules
from tessera.codegen.tile import cdiv
from tessera.codegen.kernels import ConvSchedule, GemmSchedule, KernelSource, Schedule, schedule_from_json
from tessera.codegen.select import implement, prologue_of
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import CompileOptions, compile_model
from tessera.cost.measured import Job, _schedule_key
from tessera.cost.schedule_model import rank_templates
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.orchestrate import build_ograph
from tessera.orchestrate.graphview import bits
from tessera.orchestrate.layout import NHWC
from tessera.rewrite import convert_precision
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime

SMALL = ConvSchedule(16, 16, 16, 2, 2, 2)  # many tiles, ragged edges, swizzled in pairs of tile rows
SMALL_DIRECT = ConvSchedule(16, 8, 0, 1, 1, 2)


# ---- harness -----------------------------------------------------------------------------------
def conv_kernel(g: Graph) -> tuple[list[Node], list[Node], list[str]]:
    """The plan-shaped kernel of g's convolution: the conv and what is computed from it (not the
    casts to the declared output types), its free prologue, and the tensors it writes."""
    og = build_ograph(g)
    (root,) = [n for n in og.nodes if n.op == "conv"]
    i = og.index[root.name]
    prims = [root] + [og.nodes[j] for j in bits(og.desc[i]) if not og.nodes[j].name.endswith("/cast_out")]
    outputs = []
    for o in g.outputs:
        producer = next(n for n in g.nodes if o in n.outputs)
        outputs.append(producer.inputs[0] if producer.name.endswith("/cast_out") else o)
    return prims, prologue_of(og, prims), outputs


def check_conv(model: onnx.ModelProto | None, feeds: dict[str, np.ndarray], schedule: ConvSchedule | None = None,
               precision: str = "fp32", layouts: dict[str, tuple[int, ...]] | None = None,
               graph: Graph | None = None) -> tuple[KernelSource, float]:
    """The model's (or primitive graph's) convolution kernel as a template (by default its
    best-ranked schedule) against float64: the kernel and its largest error."""
    g32 = graph if graph is not None else fission(load(model).graph).graph
    g = convert_precision(g32, precision)
    for t, lay in (layouts or {}).items():
        g.types[t] = TensorType(g.types[t].shape, g.types[t].dtype, lay)
    prims, pro, outputs = conv_kernel(g)
    if schedule is None:
        schedule = rank_templates(g, pro + prims, outputs, precision)[0]
    ks = implement(g, prims, pro, outputs, "k0_test", ("Conv_0",), schedule, precision).triton
    assert ks is not None and isinstance(ks.schedule, ConvSchedule)
    env = {**g.constants, **interp.run(g, feeds, keep_all=True)}  # what earlier kernels would write
    got = run_template(g, ks, env)
    ref = interp.run(g32, feeds, exact=True)
    errs = [rel_l2(got[t], ref[o]) for o, t in zip(g32.outputs, outputs)]
    assert max(errs) < TOLERANCE[precision], f"rel L2 {errs} under {schedule}\n{ks.source}"
    return ks, max(errs)


def conv_relu(n: int, c: int, h: int, w: int, o: int, k: tuple[int, int], seed: int = 0,
              **attrs) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv (with bias) then Relu: x [n, c, h, w] * w [o, c/group, *k]."""
    x = rand(n, c, h, w, seed=seed)
    wt = rand(o, c // attrs.get("group", 1), *k, seed=seed + 1, lo=-0.5, hi=0.5)
    model = graph_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs),
                         helper.make_node("Relu", ["y"], ["out"])],
                        {"x": x, "w": Const(wt), "b": Const(rand(o, seed=seed + 2))}, ["out"])
    return model, {"x": x}


# ---- the generator -----------------------------------------------------------------------------
NCHW: tuple[int, ...] = ()
# (n, c, h, w, o, kernel, attrs, storage layout of x and out, form the template takes)
CASES = [
    (1, 3, 13, 13, 5, (3, 3), {"pads": [1, 1, 1, 1]}, NCHW, "flat K"),  # RGB in: few channels, a flat K
    (2, 17, 7, 5, 16, (3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}, NHWC, "flat K"),  # asymmetric pads
    (1, 5, 13, 7, 17, (3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, NHWC, "flat K"),
    (2, 16, 5, 5, 3, (1, 1), {}, NCHW, "by channel blocks"),  # 1x1: a plain GEMM over the channels
    (1, 17, 7, 7, 5, (1, 1), {"strides": [2, 2]}, NHWC, "by channel blocks"),  # a ragged channel block
    (1, 100, 5, 5, 16, (3, 3), {"pads": [1, 1, 1, 1]}, NHWC, "by channel blocks"),  # ragged, per tap
    (1, 16, 1, 1, 17, (3, 3), {"pads": [1, 1, 1, 1]}, NHWC, "K"),  # a 1x1 image: one pixel
    (1, 5, 7, 7, 1, (3, 3), {"pads": [1, 1, 1, 1]}, NHWC, "K"),  # one output channel
    (1, 16, 7, 7, 16, (3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, NHWC, "2 groups"),
    (1, 32, 5, 7, 34, (3, 3), {"group": 2, "pads": [1, 2, 0, 1]}, NCHW, "2 groups"),
    (1, 17, 7, 13, 17, (3, 3), {"group": 17, "strides": [2, 2], "pads": [1, 1, 1, 1]}, NHWC, "multiplier 1"),
    (1, 5, 7, 7, 10, (3, 3), {"group": 5, "pads": [1, 1, 1, 1]}, NCHW, "multiplier 2"),
    (1, 1, 7, 7, 16, (5, 5), {"pads": [2, 2, 2, 2]}, NCHW, "multiplier 16"),  # one input channel: direct
    (1, 32, 7, 7, 3, (9, 9), {"pads": [4, 4, 4, 4]}, NHWC, "by channel blocks"),  # candy's last conv
    (1, 32, 5, 7, 3, (9, 9), {"pads": [4, 4, 4, 4]}, NCHW, "K"),
]
# Few output channels: the direct form on the CUDA cores, beside the implicit GEMM.
DIRECT_CASES = [
    (1, 6, 9, 11, 3, (9, 9), {"pads": [4, 4, 4, 4]}, NCHW),  # candy's last conv (32 -> 3), fewer channels
    (1, 6, 9, 11, 3, (9, 9), {"pads": [4, 4, 4, 4]}, NHWC),
    (2, 5, 7, 6, 7, (3, 3), {"strides": [2, 1], "pads": [0, 1, 2, 1], "dilations": [1, 2]}, NHWC),
    (1, 12, 7, 7, 10, (3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, NCHW),  # 6 channels per group -> 5
    (1, 17, 6, 5, 1, (1, 1), {}, NHWC),  # one output channel, a 1x1 window
]


@pytest.mark.parametrize("n,c,h,w,o,k,attrs,layout,form", CASES, ids=[f"{c[1]}to{c[4]}-{c[8]}" for c in CASES])
def test_shapes_forms_and_layouts(n, c, h, w, o, k, attrs, layout, form):
    model, feeds = conv_relu(n, c, h, w, o, k, seed=c + o + h, **attrs)
    lay = {"x": layout, "out": layout} if layout else None
    g = fission(load(model).graph).graph
    prims, pro, outputs = conv_kernel(g)
    # The best-ranked schedule of the form under test: a few output channels may rank the direct form first.
    best = next(s for s in rank_templates(g, pro + prims, outputs) if (s.block_k == 0) == ("multiplier" in form))
    ks, _ = check_conv(model, feeds, best, layouts=lay)
    header = next(line for line in ks.source.splitlines() if line.startswith("# "))  # after the imports
    assert form in header
    assert ("tl.dot" in ks.source) == ("direct" not in header)
    check_conv(model, feeds, SMALL_DIRECT if "multiplier" in form else SMALL, layouts=lay)


@pytest.mark.parametrize("n,c,h,w,o,k,attrs,layout", DIRECT_CASES, ids=[f"{c[1]}to{c[4]}-{'nhwc' if c[7] else 'nchw'}"
                                                                     for c in DIRECT_CASES])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_few_output_channels_take_the_direct_form(n, c, h, w, o, k, attrs, layout, precision):
    """A convolution with few output channels has two template forms: the implicit GEMM (N padded
    to a tensor-core tile) and the direct form (a multiply-add per input channel and tap on the
    CUDA cores); both are in the schedule space."""
    model, feeds = conv_relu(n, c, h, w, o, k, seed=c + o, **attrs)
    lay = {"x": layout, "out": layout} if layout else None
    g = convert_precision(fission(load(model).graph).graph, precision)
    prims, pro, outputs = conv_kernel(g)
    ranked = rank_templates(g, pro + prims, outputs, precision)
    assert any(s.block_k for s in ranked)
    direct = next(s for s in ranked if s.block_k == 0)
    ks, _ = check_conv(model, feeds, direct, precision, layouts=lay)
    assert "direct convolution template" in ks.source and "tl.dot" not in ks.source
    assert f"{c // attrs.get('group', 1)} input channels per group" in ks.source
    # A row of output channels per step: read from a copy, unless only one dim of w exceeds 1.
    assert ks.input_layouts == ({} if (o, *k) == (1, 1, 1) else {"w": (2, 3, 1, 0)})
    check_conv(model, feeds, ConvSchedule(16, 4, 0, 1, 1, 1), precision, layouts=lay)  # ragged tiles


# Split-K: (case, layout, schedule). Slices that do not divide the walk leave the last one short.
SPLIT_CASES = [
    ((1, 20, 5, 5, 17, (3, 3), {"pads": [1, 1, 1, 1]}), NHWC, ConvSchedule(16, 16, 16, 2, 2, 1, 4)),  # 18 steps / 4
    ((1, 5, 7, 7, 9, (3, 3), {"pads": [1, 1, 1, 1]}), NCHW, ConvSchedule(16, 16, 16, 2, 2, 1, 2)),  # flat K 45
    ((1, 16, 7, 7, 16, (3, 3), {"group": 2, "pads": [1, 1, 1, 1]}), NHWC, ConvSchedule(16, 16, 16, 2, 2, 1, 3)),
    ((2, 17, 7, 5, 16, (3, 3), {"strides": [2, 2], "pads": [0, 1, 1, 0]}), NHWC, ConvSchedule(16, 16, 16, 2, 2, 8, 2)),
    ((1, 23, 3, 3, 19, (1, 1), {}), NCHW, ConvSchedule(16, 16, 16, 2, 2, 1, 2)),  # a 1x1 window, ragged channels
]


@pytest.mark.parametrize("case,layout,s", SPLIT_CASES,
                         ids=[f"{c[0][1]}to{c[0][4]}-sk{c[2].split_k}" for c in SPLIT_CASES])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_split_k_walks_the_window_in_slices(case, layout, s, precision):
    """Few output tiles over a long window (ResNet-50's last stage: 49 pixels, K 4608) leave most
    SMs idle; split-K gives each tile several programs, and its last sums their slices in order."""
    n, c, h, w, o, k, attrs = case
    model, feeds = conv_relu(n, c, h, w, o, k, seed=c + o, **attrs)
    ks, _ = check_conv(model, feeds, s, precision, layouts={"x": layout, "out": layout} if layout else None)
    assert ks.workspace > 0 and "split-K" in ks.source and ks.launches[0].grid[-1] == s.split_k


def test_split_k_joins_the_space_where_tiles_leave_sms_idle():
    def space(c: int, hw: int, o: int, k: int) -> list[ConvSchedule]:
        model, _ = conv_relu(1, c, hw, hw, o, (k, k), pads=[k // 2] * 4)
        g = fission(load(model).graph).graph
        return conv_schedules(conv_problem(g, conv_kernel(g)[0][0]), 2)

    last = space(512, 7, 512, 3)  # ResNet-50's last stage: 49 pixels
    assert any(s.split_k > 1 for s in last) and len(last) <= 100  # a small space (Hidet): under ~100 points
    for s in last:  # each slice keeps at least SPLIT_K_MIN_CHUNK of the window, no program idle
        if s.split_k > 1:
            assert 512 * 9 / s.split_k >= 128 and s.split_k <= cdiv(9 * cdiv(512, s.block_k), 2)
    big = space(64, 112, 64, 3)  # 12544 pixels: only the widest tiles leave SMs idle
    assert all(cdiv(12544, s.block_m) * cdiv(64, s.block_n) < 132 for s in big if s.split_k > 1)
    assert any(s.split_k == 1 and s.block_m <= 64 for s in big)
    with pytest.raises(Unsupported, match="split-K splits an implicit GEMM"):
        model, _ = conv_relu(1, 8, 5, 5, 3, (1, 1))
        g = fission(load(model).graph).graph
        prims, pro, outputs = conv_kernel(g)
        implement(g, prims, pro, outputs, "k0", (), ConvSchedule(16, 4, 0, 1, 1, 1, 2))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_each_promising_form_leads_the_ranking(layout):
    """Candy's last convolution (32 -> 3 channels, 9x9, tf32): the best implicit GEMM and the best
    direct schedule lead the ranking stored NCHW, so both are measured first. Channels-last, the
    direct form reads strided columns (4-8x slower on the H100) and is ranked out of the lead."""
    model, _ = conv_relu(1, 32, 224, 224, 3, (9, 9), pads=[4, 4, 4, 4])
    g = convert_precision(fission(load(model).graph).graph, "tf32")
    if layout == "nhwc":
        for t in ("x", "out"):
            g.types[t] = TensorType(g.types[t].shape, g.types[t].dtype, NHWC)
    prims, pro, outputs = conv_kernel(g)
    ranked = rank_templates(g, pro + prims, outputs, "tf32")
    lead = {s.block_k == 0 for s in ranked[:2]}  # the direct form among the first two
    assert lead == ({True, False} if layout == "nchw" else {False})


def test_the_direct_form_refuses_many_output_channels():
    model, _ = conv_relu(1, 8, 5, 5, 32, (3, 3), pads=[1, 1, 1, 1])
    g = fission(load(model).graph).graph
    prims, pro, outputs = conv_kernel(g)
    assert all(s.block_k for s in rank_templates(g, pro + prims, outputs))
    with pytest.raises(Unsupported, match="at most 16 output channels per group, not 32"):
        implement(g, prims, pro, outputs, "k0", (), ConvSchedule(16, 16, 0, 1, 1, 1))


@pytest.mark.parametrize("case,layout,want", [
    ((1, 16, 7, 7, 16, (3, 3), {"pads": [1, 1, 1, 1]}), NHWC, (0, 2, 3, 1)),  # by channel blocks
    ((1, 5, 13, 7, 17, (3, 3), {"pads": [2, 2, 2, 2]}), NHWC, (0, 2, 3, 1)),  # flat K, channels innermost
    ((1, 17, 7, 13, 17, (3, 3), {"group": 17, "pads": [1, 1, 1, 1]}), NHWC, (2, 3, 1, 0)),  # direct
    ((2, 16, 5, 5, 3, (1, 1), {}), NCHW, None),  # a 1x1 window: already K-contiguous
    ((1, 3, 13, 13, 5, (3, 3), {"pads": [1, 1, 1, 1]}), NCHW, None),  # flat K over (c, kh, kw): as stored
])
def test_constant_weights_are_read_k_contiguous(case, layout, want):
    # An [O, C, KH, KW] weight gathered per tap with channels innermost would be read with a stride
    # of KH*KW along K. Such templates read a copy stored (O, KH, KW, C), made once at load; the
    # direct form reads a copy stored (KH, KW, C, O), a row of output channels per tap.
    n, c, h, w, o, k, attrs = case
    model, feeds = conv_relu(n, c, h, w, o, k, seed=4, **attrs)
    g = fission(load(model).graph).graph
    prims, pro, outputs = conv_kernel(g)
    direct = attrs.get("group") == c  # depthwise: the direct form; else the best implicit GEMM
    best = next(s for s in rank_templates(g, pro + prims, outputs) if (s.block_k == 0) == direct)
    ks, _ = check_conv(model, feeds, best, layouts={"x": layout, "out": layout} if layout else None)
    assert ks.input_layouts == ({"w": want} if want else {})
    assert ("# weight: read from a copy" in ks.source) == (want is not None)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_narrow_and_tf32_math(precision):
    model, feeds = conv_relu(1, 16, 7, 7, 24, (3, 3), seed=5, pads=[1, 1, 1, 1])
    ks, err = check_conv(model, feeds, SMALL, precision=precision, layouts={"x": NHWC})
    if precision == "tf32":
        # Operands are rounded to tf32 in the kernel: the error is tf32's, not fp32's.
        assert 'input_precision="tf32"' in ks.source and err > 1e-5
    else:
        assert "input_precision" not in ks.source and "tl.dot(a" in ks.source
    check_conv(*conv_relu(1, 6, 5, 7, 12, (3, 3), seed=7, group=6, pads=[1, 1, 1, 1]), precision=precision)


@pytest.mark.xfail(DEVICE == "cuda", strict=True, reason=(
    "Triton 3.6 on the H100 miscompiles this flat-K gather (no padding, strides 2x1): its TTGIR is "
    "right, and the kernel is right when the window strides are runtime values (session 8 bisect). "
    "Measured compiles check every template candidate against the library and reject it."))
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "tf32"])
def test_flat_k_without_padding(precision):
    check_conv(*conv_relu(1, 3, 13, 5, 17, (3, 3), seed=6, strides=[2, 1]), precision=precision)


def test_residual_cast_and_two_outputs():
    # The biased conv plus a residual and the ReLU of it are both written; one output is a cast.
    x, r = rand(1, 5, 7, 13, seed=8), rand(1, 16, 7, 13, seed=9)
    model = graph_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
                         helper.make_node("Add", ["y", "r"], ["z"]), helper.make_node("Relu", ["z"], ["a"]),
                         helper.make_node("Cast", ["a"], ["h"], to=onnx.TensorProto.FLOAT16)],
                        {"x": x, "r": r, "w": Const(rand(16, 5, 3, 3, seed=10)), "b": Const(rand(16, seed=11))},
                        ["z", "h"])
    g = fission(load(model).graph).graph
    for t in ("x", "r", "z"):
        g.types[t] = TensorType(g.types[t].shape, g.types[t].dtype, NHWC)
    prims, pro, outputs = conv_kernel(g)
    ks = implement(g, prims, pro, outputs, "k0", (), SMALL).triton
    assert len(ks.outputs) == 2 and ks.source.count("tl.store(") == 2 and "acc + " in ks.source
    got = run_template(g, ks, {**g.constants, "x": x, "r": r})
    ref = interp.run(g, {"x": x, "r": r}, exact=True)
    assert rel_l2(got["z"], ref["z"]) < TOLERANCE["fp32"]
    assert rel_l2(got["h"], ref["h"]) < TOLERANCE["fp16"]


@pytest.mark.parametrize("group", [1, 4])
def test_weights_stored_in_another_order_are_read_in_place(group):
    # A weight held as [kh, kw, c, o] (TensorFlow's order) reaches the conv through a transpose of
    # the constant: the template reads it through the transpose, without a copy.
    x = rand(1, 4, 7, 7, seed=12)
    w_hwio = rand(3, 3, 4 // group, 8, seed=13)
    f32 = DType.FLOAT32
    types = {"x": TensorType((1, 4, 7, 7), f32), "w_hwio": TensorType(w_hwio.shape, f32),
             "w": TensorType((8, 4 // group, 3, 3), f32), "out": TensorType((1, 8, 7, 7), f32)}
    conv = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": group}
    g = Graph(name="hwio", kind=GraphKind.PRIMITIVE, inputs=["x"], outputs=["out"], types=types,
              constants={"w_hwio": w_hwio},
              nodes=[Node("transpose", "transpose", ("w_hwio",), ("w",), {"perm": (3, 2, 0, 1)}),
                     Node("conv", "conv", ("x", "w"), ("out",), conv)])
    ks, _ = check_conv(None, {"x": x}, SMALL if group == 1 else SMALL_DIRECT, graph=g)
    assert "transpose (transpose)" in ks.source and "in0: w_hwio float32[3x3" in ks.source


def test_no_template_form():
    model, _ = conv_relu(1, 4, 5, 5, 8, (3, 3), seed=14, group=4)  # depthwise: the direct form only
    g = fission(load(model).graph).graph
    prims, pro, outputs = conv_kernel(g)
    with pytest.raises(Unsupported, match="direct form"):
        implement(g, prims, pro, outputs, "k0", (), SMALL)
    x = rand(1, 4, 9, seed=15)  # a 1-D convolution has no template
    g = fission(load(graph_model([helper.make_node("Conv", ["x", "w"], ["out"])],
                                 {"x": x, "w": Const(rand(2, 4, 3, seed=16))}, ["out"])).graph).graph
    assert rank_templates(g, g.nodes, list(g.outputs)) == []
    with pytest.raises(Unsupported, match="2-D convolution"):
        implement(g, list(g.nodes), [], list(g.outputs), "k0", (), SMALL)
    a = rand(3, 4, seed=17)
    g = fission(load(graph_model([helper.make_node("MatMul", ["a", "b"], ["out"])],
                                 {"a": a, "b": Const(a.T.copy())}, ["out"])).graph).graph
    with pytest.raises(Unsupported, match="without a convolution"):
        implement(g, list(g.nodes), [], list(g.outputs), "k0", (), SMALL)


# ---- schedules -----------------------------------------------------------------------------------
def test_schedule_space_ranking_keys_and_json():
    for args in [(1, 3, 64, 64, 32, (9, 9), {}), (1, 128, 16, 16, 128, (3, 3), {"pads": [1, 1, 1, 1]}),
                 (1, 32, 7, 7, 32, (3, 3), {"group": 32}), (8, 64, 56, 56, 64, (1, 1), {}),
                 (1, 16, 1, 1, 17, (3, 3), {"pads": [1, 1, 1, 1]})]:
        model, _ = conv_relu(*args[:6], **args[6])
        g = fission(load(model).graph).graph
        prims, pro, outputs = conv_kernel(g)
        p = conv_problem(g, prims[0])
        for itemsize in (2, 4):
            space = conv_schedules(p, itemsize)
            assert 1 <= len(space) <= 100 and len(set(space)) == len(space)
            if p.depthwise:
                assert all(s.block_k == 0 for s in space)
            else:
                assert all(min(s.block_m, s.block_n, s.block_k) >= 16 for s in space)
        ranked = rank_templates(g, pro + prims, outputs)
        assert ranked and all(isinstance(s, ConvSchedule) for s in ranked)
        assert set(ranked) == set(conv_schedules(p, 4))
    s = ConvSchedule(64, 32, 32, 4, 3, 8)
    assert _schedule_key(s) == "conv-m64-n32-k32-w4-s3-g8"
    assert _schedule_key(ConvSchedule(64, 32, 0, 4, 1, 1)).startswith("conv-")
    split = ConvSchedule(16, 64, 64, 2, 4, 1, 4)
    assert _schedule_key(split) == "conv-m16-n64-k64-w2-s4-g1-sk4"
    assert schedule_from_json(json.loads(json.dumps(split.to_json()))) == split
    assert schedule_from_json({k: v for k, v in s.to_json().items() if k != "split_k"}) == s  # plans before split-K
    assert _schedule_key(GemmSchedule(64, 128, 32, 4, 3, 8, 1)) == "gemm-m64-n128-k32-w4-s3-g8-sk1"  # unchanged
    assert _schedule_key(Schedule(1024, 1, 4)) == "x1024-r1-w4-p"
    assert schedule_from_json(json.loads(json.dumps(s.to_json()))) == s and s.to_json()["form"] == "conv"


# ---- wiring --------------------------------------------------------------------------------------
def convnet() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """RGB in: a 3x3 conv + ReLU, a strided depthwise conv, a 1x1 conv with a residual, a 3-channel conv out."""
    x = rand(1, 3, 13, 13, seed=20)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2], group=16),
             helper.make_node("Conv", ["d", "w3"], ["p"]), helper.make_node("Add", ["p", "d"], ["q"]),
             helper.make_node("Conv", ["q", "w4", "b4"], ["out"], pads=[1, 0, 1, 2])]
    inits = {"x": x, "w1": Const(rand(16, 3, 3, 3, seed=21, lo=-0.5, hi=0.5)), "b1": Const(rand(16, seed=22)),
             "w2": Const(rand(16, 1, 3, 3, seed=23, lo=-0.5, hi=0.5)), "b2": Const(rand(16, seed=24)),
             "w3": Const(rand(16, 16, 1, 1, seed=25, lo=-0.5, hi=0.5)),
             "w4": Const(rand(3, 16, 3, 3, seed=26, lo=-0.5, hi=0.5)), "b4": Const(rand(3, seed=27))}
    return graph_model(nodes, inits, ["out"]), {"x": x}


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_forced_network_matches_onnxruntime(layout):
    # Channels-last also pads the channels of the region's convolutions for the library, and the
    # runtime must leave template weights in their graph layout.
    model, feeds = convnet()
    auto = compile_model(model, CompileOptions(cost="analytical", layout=layout))
    assert "template" not in {k.backend for k in auto.kernels}  # analytical compiles keep the library
    exe = tessera.compile(model, CompileOptions(cost="analytical", templates="force", layout=layout), DEVICE)
    assert exe.backends.get("template") == 4 and "linear" not in exe.backends
    sources = [s for s in exe.sources().values() if "convolution template" in s]
    direct = sum("direct convolution template" in s for s in sources)
    assert 1 <= direct < len(sources)  # the depthwise one and others direct, at least one implicit GEMM
    assert any("ONNX nodes: Add_4, Conv_3" in s for s in sources)  # the residual, fused
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(exe, feeds)[0], ref) < TOLERANCE["fp32"]


class TemplateFavouringProfiler:
    """Convolution templates measure faster than the library here."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def measure(self, jobs: list[Job], record) -> None:
        for i, j in enumerate(jobs):
            self.keys.append(j.key.schedule)
            record(i, 1e-6 if isinstance(j.schedule, ConvSchedule) else 5e-6, "")


@pytest.fixture
def fake_gpu(monkeypatch) -> TemplateFavouringProfiler:
    prof = TemplateFavouringProfiler()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    return prof


def test_measured_compile_picks_conv_templates_and_the_artifact_reloads_them(tmp_path, fake_gpu):
    model, feeds = convnet()
    check_template_round_trip(model, feeds, tmp_path, fake_gpu.keys, "conv", 4)


def check_prologue_fuses(model: onnx.ModelProto, feeds: dict[str, np.ndarray], ops: set[str], tmp_path,
                         monkeypatch, layout: str) -> None:
    """A measured compile (fake GPU, templates timed) puts `ops` in the convolution's template
    kernel; the reloaded artifact matches onnxruntime."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: TemplatePrologueProfiler(ConvSchedule))
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), layout=layout))
    conv = next(k for k in result.kernels if any(n.op == "conv" for n in k.prims))
    assert conv.backend == "template" and ops <= {n.op for n in conv.prims}
    out = tmp_path / "art"
    compiler.write_artifacts(result, out)
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(tessera.load(out, DEVICE), feeds)[0], ref) < TOLERANCE["fp32"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_normalization_apply_and_relu_fuse_into_the_convolution_template(tmp_path, monkeypatch, layout):
    # relu(x * s + t) -> conv: a BatchNorm's apply and its ReLU before a convolution (pre-activation
    # ResNets), computed while the template gathers its input tile.
    x = rand(1, 8, 9, 9, seed=70)
    model = graph_model([helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Add", ["xs", "t"], ["xt"]),
                         helper.make_node("Relu", ["xt"], ["xr"]),
                         helper.make_node("Conv", ["xr", "w"], ["out"], pads=[1, 1, 1, 1])],
                        {"x": x, "s": Const(rand(1, 8, 1, 1, seed=71)), "t": Const(rand(1, 8, 1, 1, seed=72)),
                         "w": Const(rand(16, 8, 3, 3, seed=73, lo=-0.5, hi=0.5))}, ["out"])
    check_prologue_fuses(model, {"x": x}, {"mul", "add", "max"}, tmp_path, monkeypatch, layout)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_reflect_pad_and_a_concat_fuse_into_the_convolution_template(tmp_path, monkeypatch, layout):
    # conv(reflect_pad(concat(x, relu(y)))): candy pads every convolution's input by reflection; the
    # template gathers its input tile through the pad and the concat, so neither is a copy kernel.
    x, y = rand(1, 5, 9, 11, seed=74), rand(1, 3, 9, 11, seed=75)
    model = graph_model([helper.make_node("Relu", ["y"], ["yr"]),
                         helper.make_node("Concat", ["x", "yr"], ["c"], axis=1),
                         helper.make_node("Pad", ["c", "pads"], ["p"], mode="reflect"),
                         helper.make_node("Conv", ["p", "w"], ["out"])],
                        {"x": x, "y": y, "pads": Const(np.array([0, 0, 2, 1, 0, 0, 2, 1], np.int64)),
                         "w": Const(rand(16, 8, 3, 3, seed=76, lo=-0.5, hi=0.5))}, ["out"])
    check_prologue_fuses(model, {"x": x, "y": y}, {"concat", "pad", "max"}, tmp_path, monkeypatch, layout)


def test_candy_small_with_every_conv_on_its_template(monkeypatch):
    # The largest tiles whose dots stay single-threaded in the interpreter (see the module doc).
    from tessera.cost import schedule_model

    ranking = schedule_model.rank_templates

    def size(s: ConvSchedule) -> int:
        work = s.block_m * s.block_n * max(s.block_k, 1)
        return work if work <= 1 << 18 else 0

    monkeypatch.setattr(schedule_model, "rank_templates", lambda *a, **k: sorted(ranking(*a, **k), key=lambda s: -size(s)))
    path = models_dir() / "candy_small.onnx"
    exe = tessera.compile(path, CompileOptions(cost="analytical", templates="force"), DEVICE)
    assert exe.backends.get("template") == 16 and "linear" not in exe.backends
    sources = [s for s in exe.sources().values() if "convolution template" in s]
    assert any("Cg 3 x 9x9" in s for s in sources) and any("x channels N 3 x" in s for s in sources)
    model = load(path)
    feeds = random_inputs(model.graph, seed=11)
    ref = run_onnxruntime(model.model, feeds)
    for name, out in zip(exe.output_names, run_exe(exe, feeds)):
        assert rel_l2(out, ref[name]) < TOLERANCE["fp32"]

