"""Storage layouts: the plan-wide layout pass, kernels on any layout, and the library calls' strides (CPU)."""
from __future__ import annotations

import random
from typing import Sequence

import numpy as np
import pytest
import torch
from onnx import helper
from opcheck import Const, graph_model, models_dir, rand

import tessera.compiler as compiler
import tessera.runtime.executable as executable
from tessera.compiler import CompileOptions, compile_model, plan_document
from tessera.cost.layout_price import TEMPLATE_PRICES
from tessera.cost.measured import Job, Record
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, TensorType
from tessera.orchestrate.layout import NHWC, is_conversion
from tessera.runtime.executable import Executable
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime


def conv_model(channels: int = 16):
    """Conv+bias+ReLU, an asymmetric-pad conv with an add epilogue, a max pool, a strided depthwise conv."""
    c = channels
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["c"], pads=[0, 1, 1, 0]),
        helper.make_node("Add", ["c", "y"], ["s"]),
        helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w3", "b3"], ["out"], pads=[1, 1, 1, 1], strides=[2, 2], group=c),
    ]
    inputs = {"x": rand(1, 8, 12, 12), "y": rand(1, c, 12, 12),
              "w1": Const(rand(c, 8, 3, 3, seed=1)), "b1": Const(rand(c, seed=2)),
              "w2": Const(rand(c, c, 2, 2, seed=3)), "w3": Const(rand(c, 1, 3, 3, seed=4)),
              "b3": Const(rand(c, seed=5))}
    return graph_model(nodes, inputs, ["out"], opset=13)


def _check(result, seed: int = 3, exe: Executable | None = None) -> float:
    feeds = random_inputs(result.loaded.graph, seed=seed)
    ref = run_onnxruntime(result.loaded.model, feeds)
    exe = exe or Executable(result.graph, plan_document(result), "cpu")
    out = exe.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    return max(rel_l2(out[o].float().numpy(), ref[o]) for o in exe.output_names)


def test_a_conv_network_runs_channels_last_between_its_boundaries(monkeypatch):
    model = conv_model()
    result = compile_model(model, CompileOptions(cost="analytical", layout="nhwc"))
    g = result.graph
    convs = [n for n in g.nodes if n.op == "conv"]
    assert len(convs) == 3
    for n in convs:  # every convolution reads and writes NHWC
        assert g.types[n.inputs[0]].layout == NHWC and g.types[n.outputs[0]].layout == NHWC
    # The graph input and output stay row-major. The first conv reads the input through one
    # explicit conversion; the last conv's bias add (its generated epilogue) writes the output
    # row-major from NHWC, so it needs none. Nothing converts in between.
    conversions = [n for n in g.nodes if is_conversion(n)]
    assert [(n.inputs[0], g.types[n.outputs[0]].layout) for n in conversions] == [("x", NHWC)]
    assert g.types["out"].plain
    doc = plan_document(result)
    layouts = {b["tensor"]: b["layout"] for b in doc["buffers"]}
    assert layouts["x"] == [0, 1, 2, 3] and layouts["out"] == [0, 1, 2, 3]
    assert any(v == list(NHWC) for v in layouts.values())
    assert any(k.get("conversion") for k in doc["kernels"])
    # The library calls receive channels-last strides: NHWC activations and weights, no copies.
    seen: list[tuple[str, list]] = []
    real_fused, real_node = executable.run_linear_fused, executable.run_node

    def spy_fused(node, args, *a, **k):
        seen.append((node.op, [(x.shape, x.stride()) for x in args]))
        return real_fused(node, args, *a, **k)

    def spy_node(node, args, *a, **k):
        seen.append((node.op, [(x.shape, x.stride()) for x in args]))
        return real_node(node, args, *a, **k)

    monkeypatch.setattr(executable, "run_linear_fused", spy_fused)
    monkeypatch.setattr(executable, "run_node", spy_node)
    assert _check(result) < TOLERANCE["fp32"]
    conv_calls = [s for op, s in seen if op == "conv"]
    assert len(conv_calls) == 3
    for strides in conv_calls:
        for shape, st in strides[:2]:  # input [N, C, H, W], weight [O, C/g, kh, kw]: channels innermost
            if shape[1] > 1:  # (a depthwise weight has one channel: any order is the same memory)
                assert st[1:] == (1, shape[1] * shape[3], shape[1]), strides


def test_auto_layout_follows_the_cost():
    # fp16 tensor-core convolutions pay cuDNN's NCHW conversions: the region goes channels-last.
    half = compile_model(conv_model(), CompileOptions(cost="analytical", precision="fp16"))
    assert half.layouts.summary()["channels_last_regions"] == 1
    assert _check(half) < TOLERANCE["fp16"]
    # Full fp32 has no such conversions in the model, so the boundary costs keep it NCHW.
    full = compile_model(conv_model(), CompileOptions(cost="analytical", precision="fp32"))
    s = full.layouts.summary()
    assert s["regions"] == 1 and s["channels_last_regions"] == 0
    assert all(t.plain for t in full.graph.types.values())
    # "nchw" keeps every tensor row-major whatever the cost says.
    plain = compile_model(conv_model(), CompileOptions(cost="analytical", precision="fp16", layout="nchw"))
    assert all(t.plain for t in plain.graph.types.values())
    with pytest.raises(compiler.TesseraError, match="layout policy"):
        compile_model(conv_model(), CompileOptions(cost="analytical", layout="nwhc"))


@pytest.mark.parametrize("name", ["candy_small", "efficientvit_b0_small"])
def test_shared_conv_models_keep_convolutions_channels_last(name):
    """Acceptance: fp16 for the H100 with the analytical cost; conversions only at the boundary."""
    result = compile_model(models_dir() / f"{name}.onnx", CompileOptions(cost="analytical", precision="fp16"))
    g = result.graph
    convs = [n for n in g.nodes if n.op == "conv" and g.types[n.inputs[0]].rank == 4]
    assert convs and all(g.types[n.inputs[0]].layout == NHWC and g.types[n.outputs[0]].layout == NHWC
                         for n in convs)
    boundary = set(g.inputs) | set(g.outputs)
    for n in g.nodes:
        if is_conversion(n):
            assert set(n.inputs + n.outputs) & boundary, n.name
    # No kernel converts in the middle: a generated kernel reads a row-major activation only
    # where the graph itself needs another order (none in these two networks' conv trunks).
    assert _check(result) < TOLERANCE["fp16"]


class LayoutProfiler:
    """A fake GPU: NHWC convolutions are 3x faster; everything else costs by size. Logs every key."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            self.keys.append((j.key.signature, j.key.schedule))
            seconds = 1e-6 * len(j.prims) + 1e-7 * (j.schedule.num_warps if j.schedule else 4)
            for n in j.prims:
                if n.op == "conv" and j.graph.types[n.inputs[0]].layout == NHWC:
                    seconds /= 3
            record(i, seconds, "")


@pytest.fixture
def fake_gpu(monkeypatch) -> LayoutProfiler:
    prof = LayoutProfiler()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    return prof


def test_measured_layouts_time_each_convolution_once_per_layout(tmp_path, fake_gpu):
    opts = CompileOptions(cost="measured", db=str(tmp_path / "t.db"))
    result = compile_model(conv_model(), opts)
    assert result.layouts.summary()["channels_last_regions"] == 1
    # 3 convolutions x 2 layouts, each as the library call and its best-ranked templates
    assert result.tuning["layout_convs_measured"] == 3 * 2 * (1 + TEMPLATE_PRICES)
    assert len(set(fake_gpu.keys)) == len(fake_gpu.keys)  # nothing measured twice
    assert _check(result) < TOLERANCE["fp32"]
    fake_gpu.keys.clear()
    again = compile_model(conv_model(), opts)  # everything from the database
    assert not fake_gpu.keys and again.tuning["layout_convs_measured"] == 0
    assert [str(t) for t in again.graph.types.values()] == [str(t) for t in result.graph.types.values()]


class AlignmentProfiler:
    """A fake GPU whose channels-last convolutions take `aligned` seconds when every channel count
    is a multiple of 16 bytes and `misaligned` otherwise (cuDNN's aligned and unaligned kernels)."""

    def __init__(self, aligned: float, misaligned: float) -> None:
        self.aligned, self.misaligned = aligned, misaligned
        self.nhwc_channels: list[tuple[int, int]] = []

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            seconds = 1e-6 * len(j.prims)
            for n in j.prims:
                if n.op == "conv" and j.graph.types[n.inputs[0]].layout == NHWC:
                    o, c = j.graph.types[n.inputs[1]].shape[:2]
                    self.nhwc_channels.append((c, o))
                    seconds = self.misaligned if o % 4 or c % 4 else self.aligned
                elif n.op == "conv":
                    seconds = 10e-6
            record(i, seconds, "")


class TemplateLayoutProfiler:
    """A fake GPU on which the library's channels-last convolutions are slow and a template's fast."""

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            seconds = 1e-6 * len(j.prims)
            for n in j.prims:
                if n.op == "conv":
                    nhwc = j.graph.types[n.inputs[0]].layout == NHWC
                    seconds = (5e-6 if nhwc else 12e-6) if j.schedule is not None else (20e-6 if nhwc else 10e-6)
            record(i, seconds, "")


@pytest.mark.parametrize("templates,channels_last", [("auto", 1), ("off", 0)])
def test_layouts_are_priced_at_the_faster_of_library_and_template(tmp_path, monkeypatch, templates, channels_last):
    """A convolution costs what the plan would run: the library call or its template. On the
    H100 in tf32, cuDNN ran candy's last convolution faster NCHW, its template faster still NHWC."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: TemplateLayoutProfiler())
    opts = CompileOptions(cost="measured", db=str(tmp_path / "t.db"), templates=templates)
    result = compile_model(conv_model(), opts)
    assert result.layouts.summary()["channels_last_regions"] == channels_last
    assert result.tuning["layout_convs_measured"] == 3 * 2 * (1 + (TEMPLATE_PRICES if templates == "auto" else 0))
    assert _check(result) < TOLERANCE["fp32"]


@pytest.mark.parametrize("aligned,misaligned,padded", [(5e-6, 20e-6, 1), (8e-6, 5e-6, 0)])
def test_channels_last_convolutions_are_priced_padded_or_not_as_they_run(tmp_path, monkeypatch, aligned,
                                                                         misaligned, padded):
    """A convolution with 3 output channels, stored NHWC, is timed padded to 4 (`padded_channels`)
    and as it is, and the layout pass pads it where that is faster. Timed only as cuDNN runs it
    unpadded, its unaligned kernel kept candy's last region NCHW on the H100; padded always,
    resnet50's first convolution in fp16 took 39 µs (8 channels) where 4 took 22 µs. The artifact
    repeats the choice."""
    prof = AlignmentProfiler(aligned, misaligned)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["out"], pads=[2, 2, 2, 2])]
    model = graph_model(nodes, {"x": rand(1, 8, 40, 40), "w1": Const(rand(16, 8, 3, 3, seed=1)),
                                "w2": Const(rand(3, 16, 5, 5, seed=2)), "b2": Const(rand(3, seed=3))},
                        ["out"], opset=13)
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), templates="off"))
    assert (16, 4) in prof.nhwc_channels and (16, 3) in prof.nhwc_channels  # both forms timed
    summary = result.layouts.summary()
    assert summary["channels_last_regions"] == 1
    assert (summary["convs_padded"], summary["convs_unpadded"]) == (padded, 1 - padded)
    assert _check(result) < TOLERANCE["fp32"]
    compiler.write_artifacts(result, tmp_path / "art")
    from tessera.runtime.artifact import load_artifact

    exe = load_artifact(tmp_path / "art")  # rebuilds the graph with the same padding, or refuses
    assert _check(result, exe=exe) < TOLERANCE["fp32"]


def test_the_cli_says_what_the_layout_pass_chose(tmp_path, capsys):
    import onnx

    from tessera.cli.main import main

    onnx.save(conv_model(), tmp_path / "convs.onnx")
    # fp16: the cast of the float32 input (the model's declared type) writes NHWC itself.
    assert main(["compile", str(tmp_path / "convs.onnx"), "-o", str(tmp_path / "half"), "--cost", "analytical",
                 "--precision", "fp16"]) == 0
    assert "layout: 3 of 3 convolutions channels-last (1 of 1 regions), 0 conversions" in capsys.readouterr().out
    # fp32 forced channels-last: the first convolution reads the input through one conversion kernel.
    assert main(["compile", str(tmp_path / "convs.onnx"), "-o", str(tmp_path / "out"), "--cost", "analytical",
                 "--layout", "nhwc"]) == 0
    assert "layout: 3 of 3 convolutions channels-last (1 of 1 regions), 1 conversions" in capsys.readouterr().out
    html = (tmp_path / "out" / "report.html").read_text()
    assert "[0, 2, 3, 1]" in html and "<mark>conversion</mark>" in html  # the report shows both
    import json

    doc = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert sum(1 for k in doc["kernels"] if k["conversion"]) == 1
    assert {tuple(b["layout"]) for b in doc["buffers"]} == {(0, 1, 2, 3), (0, 2, 3, 1)}


def permuted(graph: Graph, seed: int) -> Graph:
    """`graph` with a random storage order on every intermediate tensor of rank 2 or more."""
    rng = random.Random(seed)
    g = graph.clone()
    fixed = set(g.inputs) | set(g.outputs) | set(g.constants)
    for t, ty in g.types.items():
        if t not in fixed and ty.rank >= 2:
            perm = list(range(ty.rank))
            rng.shuffle(perm)
            g.types[t] = TensorType(ty.shape, ty.dtype, tuple(perm))
    return g


@pytest.mark.parametrize("name,seed", [("candy_small", 0), ("bert_tiny", 1), ("gpt2_tiny", 2),
                                        ("segformer_b0_small", 3), ("attn_s7", 4)])
def test_every_kernel_form_reads_and_writes_any_layout(name, seed):
    """Every generated kernel (pointwise, reductions over strided rows, pooling, pads, gathers,
    concats, tiled transposes) and every library call on randomly permuted storage, against
    onnxruntime: layouts change addresses, never values."""
    result = compile_model(models_dir() / f"{name}.onnx", CompileOptions(cost="analytical", layout="nchw"))
    g = permuted(result.graph, seed)
    assert sum(1 for t in g.types.values() if not t.plain) >= 2
    exe = Executable(g, plan_document(result), "cpu")
    assert _check(result, exe=exe) < TOLERANCE["fp32"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_library_operands_are_aligned(monkeypatch, precision):
    """Odd channel counts (8 -> 7 -> 7 -> depthwise 7) channels-last: every operand a library
    convolution receives starts on 16 bytes and has a leading dimension of a multiple of 16 bytes;
    the channels are zero-padded for it, and the results are the same."""
    result = compile_model(conv_model(channels=7), CompileOptions(cost="analytical", layout="nhwc",
                                                                  precision=precision))
    assert result.layouts.summary()["convs_padded"] == 2  # the depthwise conv keeps its groups
    assert any(t.layout == NHWC and t.shape[1] == 7 for t in result.graph.types.values())
    seen: list[tuple[str, torch.Tensor]] = []
    real = executable.run_linear_fused, executable.run_node
    monkeypatch.setattr(executable, "run_linear_fused", lambda node, args, *a, **k: (
        seen.extend((node.attrs.get("group", 1), x) for x in args[:2]), real[0](node, args, *a, **k))[1])
    monkeypatch.setattr(executable, "run_node", lambda node, args, *a, **k: (
        seen.extend((node.attrs.get("group", 1), x) for x in args[:2] if node.op == "conv"),
        real[1](node, args, *a, **k))[1])
    assert _check(result, seed=11) < TOLERANCE[precision]
    dense = [x for group, x in seen if group == 1]
    assert len(dense) == 4
    for x in dense:
        assert x.data_ptr() % 16 == 0 and (x.shape[1] * x.element_size()) % 16 == 0 and x.stride()[1] == 1


def test_strided_rows_get_blocks_of_many_rows():
    # InstanceNorm over H and W of an NHWC tensor: the row's elements are C apart, so the
    # schedule space starts with blocks of many side-by-side rows, and the model ranks them first.
    from tessera.codegen.kernels import rows_strided
    from tessera.cost.schedule_model import rank_kernel

    model = graph_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                         helper.make_node("InstanceNormalization", ["c", "s", "b"], ["n"]),
                         helper.make_node("Relu", ["n"], ["out"])],
                        {"x": rand(1, 4, 20, 20), "w": Const(rand(24, 4, 3, 3, seed=1)),
                         "s": Const(rand(24, seed=2)), "b": Const(rand(24, seed=3))}, ["out"], opset=13)
    result = compile_model(model, CompileOptions(cost="analytical", layout="nhwc"))
    reds = [impl for impl in result.kernels if impl.triton and impl.triton.rnumel > 1]
    assert reds and all(impl.triton.strided for impl in reds)
    assert rows_strided(result.graph, reds[0].nodes)
    space, ranked = rank_kernel(result.graph, reds[0].triton)
    assert space[0].xblock > 1 and ranked[0].xblock >= 8
    assert _check(result) < TOLERANCE["fp32"]
    # Every schedule of the space computes the same.
    doc = plan_document(result)
    for sched in space:
        for k, impl in zip(doc["kernels"], result.kernels):
            if impl is reds[0]:
                k["schedule"] = sched.to_json()
        assert _check(result, exe=Executable(result.graph, doc, "cpu")) < TOLERANCE["fp32"], sched


def test_storage_shape_and_strides():
    t = TensorType((2, 3, 4, 5), DType.FLOAT32, NHWC)
    assert t.storage_shape == (2, 4, 5, 3) and t.strides == (60, 1, 15, 3) and not t.plain
    assert "@0231" in str(t)
    one = TensorType((1, 3, 1, 1), t.dtype, NHWC)
    assert one.plain and "@" not in str(one)  # size-1 dims: the same memory in every order
    assert np.prod(t.storage_shape) == t.numel


def test_pointwise_convolutions_channels_last_run_as_one_gemm(monkeypatch):
    """A 1x1 convolution on NHWC storage is a GEMM of leading dimension C (bias and ReLU in its
    epilogue), not a cuDNN call: counted through the GEMM helper, checked against onnxruntime."""
    from tessera.runtime import torch_prims

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w3", "b3"], ["out"])]
    model = graph_model(nodes, {"x": rand(1, 8, 9, 9), "w1": Const(rand(16, 8, 1, 1, seed=1)),
                                "b1": Const(rand(16, seed=2)), "w2": Const(rand(16, 16, 3, 3, seed=3)),
                                "w3": Const(rand(24, 16, 1, 1, seed=4)), "b3": Const(rand(24, seed=5))},
                        ["out"], opset=13)
    result = compile_model(model, CompileOptions(cost="analytical", layout="nhwc"))
    calls = []
    real = torch_prims.pointwise_conv_as_gemm

    def spy(node, args, *a, **k):
        y = real(node, args, *a, **k)
        calls.append(y is not None)
        return y

    monkeypatch.setattr(executable, "pointwise_conv_as_gemm", spy)
    assert _check(result) < TOLERANCE["fp32"]
    assert sorted(calls) == [False, True, True]  # the two 1x1 convolutions; the 3x3 goes to cuDNN


def test_kernels_are_timed_on_inputs_already_in_their_layout():
    # The profiler's inputs are stored in each kernel's layout, so the timed launch converts
    # nothing. (They were once row-major, and every channels-last kernel was timed with a copy.)
    from tessera.cost.profiler import _inputs
    from tessera.runtime.buffers import as_layout

    g = Graph("k", GraphKind.PRIMITIVE, inputs=["x", "y"], outputs=[],
              types={"x": TensorType((1, 3, 4, 5), DType.FLOAT16, NHWC), "y": TensorType((2, 3), DType.FLOAT32)})
    feeds = _inputs(g, "cpu", 0)
    assert feeds["x"].stride() == (60, 1, 15, 3) and as_layout(feeds["x"], NHWC) is feeds["x"]
    assert as_layout(feeds["y"], ()) is feeds["y"]


def test_long_reductions_over_few_strided_rows_split_in_two_levels(monkeypatch):
    # InstanceNorm of an NHWC tensor: N*C rows, each H*W long and C apart. With few rows a row
    # kernel has no parallelism, so each reduction becomes a partial reduction over (s, H/s)
    # splits and a small second level. Same values; candy at 224x224 splits 30 reductions.
    import tessera.orchestrate.layout as layout

    monkeypatch.setattr(layout, "MIN_ROW", 64)
    monkeypatch.setattr(layout, "TARGET_ROWS", 96)
    monkeypatch.setattr(layout, "MIN_PART", 8)
    model = graph_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                         helper.make_node("InstanceNormalization", ["c", "s", "b"], ["n"]),
                         helper.make_node("Relu", ["n"], ["r"]),
                         helper.make_node("ReduceMax", ["r"], ["out"], axes=[2, 3])],
                        {"x": rand(1, 4, 12, 10), "w": Const(rand(24, 4, 3, 3, seed=1)),
                         "s": Const(rand(24, seed=2)), "b": Const(rand(24, seed=3))}, ["out"], opset=13)
    result = compile_model(model, CompileOptions(cost="analytical", layout="nhwc"))
    assert result.layouts.split_reductions == 3  # the norm's mean and variance, the max
    partial = [n for n in result.graph.nodes if n.name.endswith("/partial")]
    assert partial and all(result.graph.types[n.inputs[0]].rank == 5 for n in partial)
    assert _check(result, seed=5) < TOLERANCE["fp32"]


def test_strided_rows_are_numbered_in_storage_order():
    # Rows of a reduction over H and W of an NHWC tensor are its channels: a block of rows is a run
    # of neighbouring channels only if row x+1 sits next to row x in memory. Numbered in the
    # logical order (n, c, h of a split norm) neighbours were H*W*C apart and no load coalesced.
    import re

    import tessera.orchestrate.layout as layout

    for split in (False, True):
        model = graph_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                             helper.make_node("InstanceNormalization", ["c", "s", "b"], ["out"])],
                            {"x": rand(1, 4, 12, 10), "w": Const(rand(24, 4, 3, 3, seed=1)),
                             "s": Const(rand(24, seed=2)), "b": Const(rand(24, seed=3))}, ["out"], opset=13)
        with pytest.MonkeyPatch.context() as mp:
            if split:
                mp.setattr(layout, "MIN_ROW", 64)
                mp.setattr(layout, "TARGET_ROWS", 96)
                mp.setattr(layout, "MIN_PART", 8)
            result = compile_model(model, CompileOptions(cost="analytical", layout="nhwc"))
        assert result.layouts.split_reductions == (2 if split else 0)
        reds = [impl for impl in result.kernels if impl.triton and impl.triton.strided]
        assert reds
        for impl in reds:
            src = impl.triton.source
            exprs = dict(re.findall(r"^\s*(i\d+) = (.*)$", src, re.M))
            loads = re.findall(r"tl\.load\(in\d+ \+ (i\d+)", src)
            strided = [exprs[i] for i in loads if i in exprs and "rindex" in exprs[i]]
            assert strided, src
            for e in strided:
                r = {k: 0 for k in re.findall(r"rindex\d+", e)}
                at = [eval(e, {}, {"xindex": x, **r}) for x in (0, 1)]  # noqa: S307 - our own generated index
                assert at[1] - at[0] == 1, (impl.name, e)
        assert _check(result, seed=7) < TOLERANCE["fp32"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_library_matmuls_get_aligned_leading_dimensions(monkeypatch, precision):
    # EfficientViT's linear attention multiplies by values with a row of ones appended (n = 17):
    # cuBLAS then runs align1/align2 kernels. Such an n, and a k like it, are zero-padded to 16
    # bytes (a PAD on computed operands, a padded copy of a constant), and the result is sliced
    # back: the same values, every library operand aligned.
    ones = np.ones((1, 2, 9, 1), np.float32)
    model = graph_model([helper.make_node("Concat", ["v", "one"], ["v1"], axis=3),
                         helper.make_node("MatMul", ["q", "v1"], ["kv"]),
                         helper.make_node("MatMul", ["kv", "w"], ["out"])],
                        {"q": rand(1, 2, 160, 9), "v": rand(1, 2, 9, 16), "one": Const(ones),
                         "w": Const(rand(17, 13, seed=4))}, ["out"], opset=13)
    result = compile_model(model, CompileOptions(cost="analytical", precision=precision))
    assert result.layouts.padded_matmuls == 2
    seen: list[torch.Tensor] = []
    real = executable.run_linear_fused, executable.run_node
    monkeypatch.setattr(executable, "run_linear_fused", lambda node, args, *a, **k: (
        seen.extend(args[:2] if node.op == "matmul" else ()), real[0](node, args, *a, **k))[1])
    monkeypatch.setattr(executable, "run_node", lambda node, args, *a, **k: (
        seen.extend(args[:2] if node.op == "matmul" else ()), real[1](node, args, *a, **k))[1])
    assert _check(result, seed=13) < TOLERANCE[precision]
    assert len(seen) == 4
    for x in seen:
        x2 = x if x.dim() >= 2 else x[None]
        assert x2.data_ptr() % 16 == 0 and (x2.shape[-1] * x2.element_size()) % 16 == 0, x.shape


def test_a_matmul_of_a_tensor_with_itself_pads_it_along_both_dims():
    # Found by the fuzzer: x @ x with k = n = 17 pads x along its last dim (as A) and along its
    # second-to-last (as B); both pads were named x/k20 and the graph was refused.
    model = graph_model([helper.make_node("MatMul", ["x", "x"], ["out"])], {"x": rand(3, 5, 17, 17)}, ["out"],
                        opset=13)
    result = compile_model(model, CompileOptions(cost="analytical"))
    assert result.layouts.padded_matmuls == 1
    assert _check(result, seed=2) < TOLERANCE["fp32"]
