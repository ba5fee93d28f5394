"""The GPU profiler and measured compile (skipped without CUDA; run on the device machine)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import helper
from opcheck import Const, rand
from test_codegen_kernels import graph_model

import tessera
from tessera.codegen.kernels import Schedule
from tessera.cost.db import Key, TuningDB
from tessera.cost.measured import Job
from tessera.fission import fission
from tessera.frontend import load

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
if not MODELS.is_dir():
    MODELS = Path(__file__).resolve().parents[1] / "carry" / "a"


def _job(model, schedule=None) -> Job:
    g = fission(load(model).graph).graph
    return Job(Key("gpu", "v", "sig", "s"), g, tuple(g.nodes), (), tuple(g.outputs), schedule)


def test_failures_are_contained():
    from tessera.cost.profiler import GpuProfiler

    soft = graph_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": rand(64, 3000)}, ["y"], opset=13)
    # A gather through indices far outside the data: an illegal address on the GPU.
    bad = graph_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
                      {"x": rand(8, 4), "i": Const(np.array([1 << 40], np.int64))}, ["y"], opset=13)
    jobs = [_job(soft), _job(soft, Schedule(1, 64, 4, True)), _job(bad), _job(soft, Schedule(1, 1024, 4, False))]
    got: dict[int, tuple[float, str]] = {}
    prof = GpuProfiler(workers=2, timeout_s=120)
    try:
        prof.measure(jobs, lambda i, s, why: got.__setitem__(i, (s, why)))
    finally:
        prof.close()
    assert set(got) == {0, 1, 2, 3}
    assert math.isfinite(got[0][0]) and 0 < got[0][0] < 1e-3
    assert got[1][0] == math.inf and "persistent" in got[1][1]  # refused at build: the compile goes on
    assert got[2][0] == math.inf  # the fault killed a worker, not the run
    assert math.isfinite(got[3][0])  # the looped schedule of the same kernel measures fine


def test_measured_compile_and_cache(tmp_path):
    db = str(tmp_path / "t.db")
    opts = tessera.CompileOptions(cost="measured", db=db, solver="highs")
    exe = tessera.compile(MODELS / "attn_s7.onnx", opts, device="cuda")
    assert exe.plan["cost_model"] == "measured" and exe.plan["tuning"]["measured"] > 0
    again = tessera.compile_model(MODELS / "attn_s7.onnx", opts)
    assert again.tuning["measured"] == 0  # a cache hit for every candidate
    with TuningDB(db) as d:
        assert len(d) == exe.plan["tuning"]["measured"]
