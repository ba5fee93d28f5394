"""Channels-last convolutions: a measured alternative layout for linear conv kernels (CPU)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pytest
import torch
from onnx import helper
from opcheck import Const, graph_model, rand

import tessera.compiler as compiler
from tessera.codegen.select import CHANNELS_LAST, channels_last_applies, implement
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import CompileOptions, compile_model, plan_document
from tessera.cost.db import TuningDB
from tessera.cost.measured import Job, MeasuredCost, Record
from tessera.runtime.executable import Executable, KernelBuildError
from tessera.tolerance import rel_l2
from tessera.verify import run_onnxruntime


def conv_model():
    """Conv+bias+ReLU, an asymmetric-pad conv with an add epilogue, a strided depthwise conv."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["c"], pads=[0, 1, 1, 0]),
        helper.make_node("Add", ["c", "y"], ["s"]),
        helper.make_node("Conv", ["s", "w3", "b3"], ["out"], pads=[1, 1, 1, 1], strides=[2, 2], group=16),
    ]
    inputs = {"x": rand(1, 8, 12, 12), "y": rand(1, 16, 12, 12),
              "w1": Const(rand(16, 8, 3, 3, seed=1)), "b1": Const(rand(16, seed=2)),
              "w2": Const(rand(16, 16, 2, 2, seed=3)), "w3": Const(rand(16, 1, 3, 3, seed=4)),
              "b3": Const(rand(16, seed=5))}
    return graph_model(nodes, inputs, ["out"], opset=13)


def _feeds(seed: int = 3) -> dict[str, np.ndarray]:
    return {"x": rand(1, 8, 12, 12, seed=seed), "y": rand(1, 16, 12, 12, seed=seed + 1)}


def _check(exe: Executable, model) -> None:
    feeds = _feeds()
    ref = run_onnxruntime(model, feeds)
    out = exe.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    assert rel_l2(out["out"].numpy(), ref["out"]) < 1e-5


def test_channels_last_convolutions_compute_the_same(tmp_path):
    model = conv_model()
    result = compile_model(model, CompileOptions(cost="analytical"))
    doc = plan_document(result)
    by_name = {n.name: n for n in result.graph.nodes}
    convs = 0
    for k in doc["kernels"]:
        prims = [by_name[n] for n in k["prims"]]
        root = next((n for n in prims if n.op == "conv"), None)
        if channels_last_applies(result.graph, root):
            k["layout"] = CHANNELS_LAST
            convs += 1
    assert convs == 3
    exe = Executable(result.graph, doc, "cpu")
    assert sum(1 for s in exe.steps if s.impl.layout) == 3
    # conv -> bias -> ReLU (all in the library call) feeds only the next channels-last conv: that
    # edge stays NHWC; the second conv's add epilogue is generated, so its result goes back to NCHW.
    (edge,) = exe._stay_channels_last
    assert exe.graph.types[edge].shape == (1, 16, 12, 12)
    _check(exe, model)


def test_a_layout_the_kernel_cannot_take_is_refused():
    # A matmul kernel has no channels to put last: the plan is refused, naming the kernel.
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                        {"x": rand(8, 16), "w": Const(rand(16, 4))}, ["z"], opset=13)
    result = compile_model(model, CompileOptions(cost="analytical"))
    doc = plan_document(result)
    other = doc["kernels"][0]
    other["layout"] = CHANNELS_LAST
    with pytest.raises(KernelBuildError, match=other["name"]):
        Executable(result.graph, doc, "cpu")
    g = result.graph
    with pytest.raises(Unsupported, match="unknown layout"):
        implement(g, [g.nodes[0]], [], [o for o in g.nodes[0].outputs if o], "k", layout="nhwc")


class LayoutProfiler:
    """Channels-last is faster for the depthwise conv (group > 1) only; logs every key measured."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []

    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        for i, j in enumerate(jobs):
            self.keys.append((j.key.signature, j.key.schedule))
            depthwise = any(n.op == "conv" and n.attrs.get("group", 1) > 1 for n in j.prims)
            seconds = 1e-6 * len(j.prims) + 1e-7 * (j.schedule.num_warps if j.schedule else 4)
            if j.layout:
                seconds *= 0.5 if depthwise else 2.0
            record(i, seconds, "")


@pytest.fixture
def fake_gpu(monkeypatch) -> LayoutProfiler:
    """The compile's measured path on CPU: a fake GPU whose profiler prices the layouts."""
    prof = LayoutProfiler()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "measured_cost", lambda og, opt, progress, analytical, gpu: MeasuredCost(
        og, TuningDB(opt.db), prof, "fake-gpu", "v1", progress, None, opt.precision, gpu))
    return prof


def test_tuning_keeps_channels_last_where_it_measures_faster(tmp_path, fake_gpu):
    model = conv_model()
    prof = fake_gpu
    opts = CompileOptions(cost="measured", db=str(tmp_path / "t.db"))
    result = compile_model(model, opts)
    assert result.tuning["convs_tried_channels_last"] == 3 and result.tuning["convs_channels_last"] == 1
    doc = plan_document(result)
    chosen = [k for k in doc["kernels"] if k.get("layout")]
    assert len(chosen) == 1 and chosen[0]["layout"] == CHANNELS_LAST
    by_name = {n.name: n for n in result.graph.nodes}
    assert any(by_name[n].op == "conv" and by_name[n].attrs["group"] == 16 for n in chosen[0]["prims"])
    # What runs is what the profile reports: the channels-last time, not the candidate's NCHW one.
    from tessera.bench import kernel_profile

    row = next(r for r in kernel_profile(result, top=100)["top"] if r["name"] == chosen[0]["name"])
    assert row["layout"] == CHANNELS_LAST and row["cost_us"] == pytest.approx(chosen[0]["tuned_s"] * 1e6)
    assert chosen[0]["tuned_s"] < next(k.cost_s for k in result.plan.kernels if k.name == chosen[0]["name"])
    cl_keys = [k for k in prof.keys if k[1].endswith("-cl")]
    assert len(cl_keys) == 3 and len(set(prof.keys)) == len(prof.keys)  # nothing measured twice
    # The NCHW side of each comparison was the candidate's own row, not a new timing.
    assert {s for s, _ in cl_keys} <= {s for s, k in prof.keys if not k.endswith("-cl")}
    _check(Executable(result.graph, doc, "cpu"), model)
    prof.keys.clear()
    again = compile_model(model, opts)  # everything from the database
    assert not prof.keys and [k.get("layout") for k in plan_document(again)["kernels"]] == \
        [k.get("layout") for k in doc["kernels"]]
    assert math.isfinite(again.tuning["seconds"])


def test_a_real_model_with_every_conv_channels_last_and_every_transpose_tiled():
    # What tuning may choose on a GPU, all at once on a whole model: each 2-D convolution
    # channels-last and each transposing kernel on a tiled schedule, against onnxruntime.
    from opcheck import models_dir

    from tessera.codegen.kernels import schedules
    from tessera.verify import random_inputs

    result = compile_model(models_dir() / "efficientvit_b0_small.onnx", CompileOptions(cost="analytical"))
    doc = plan_document(result)
    convs = tiled = 0
    for k, impl in zip(doc["kernels"], result.kernels):
        if impl.backend == "linear" and channels_last_applies(result.graph, impl.linear):
            k["layout"] = CHANNELS_LAST
            convs += 1
        ks = impl.triton
        if impl.backend == "triton" and ks is not None and ks.tile:
            options = [s for s in schedules(ks.xnumel, ks.rnumel, ks.tile) if s.rblock > 1]
            k["schedule"] = options[tiled % len(options)].to_json()
            tiled += 1
    assert convs >= 40 and tiled >= 3
    feeds = random_inputs(result.loaded.graph, seed=7)
    ref = run_onnxruntime(result.loaded.model, feeds)
    exe = Executable(result.graph, doc, "cpu")
    assert exe._stay_channels_last  # conv -> conv edges that skip the round trip to NCHW
    outs = exe.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    for o in exe.output_names:
        assert rel_l2(outs[o].numpy(), ref[o]) < 1e-5


def test_the_cli_summary_says_what_tuning_chose(tmp_path, fake_gpu, capsys):
    import onnx

    from tessera.cli.main import main

    onnx.save(conv_model(), tmp_path / "convs.onnx")
    assert main(["compile", str(tmp_path / "convs.onnx"), "-o", str(tmp_path / "out"), "--cost", "measured",
                 "--db", str(tmp_path / "t.db")]) == 0
    text = capsys.readouterr().out
    assert "1 of 3 convolutions faster channels-last" in text and "after the solve:" in text
