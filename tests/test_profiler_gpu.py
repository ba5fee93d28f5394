"""The GPU profiler and measured compile (skipped without CUDA; run on the device machine)."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from opcheck import Const, graph_model, models_dir, rand

import tessera
from tessera.codegen.kernels import Schedule
from tessera.cost.chain_search import TOP
from tessera.cost.db import Key, TuningDB
from tessera.cost.measured import Job
from tessera.fission import fission
from tessera.frontend import load

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MODELS = models_dir()


def _job(model, schedule=None) -> Job:
    g = fission(load(model).graph).graph
    return Job(Key("gpu", "v", "sig", "s"), g, tuple(g.nodes), (), tuple(g.outputs), schedule)


def _measure(jobs, workers=2):
    from tessera.cost.profiler import GpuProfiler

    got: dict[int, tuple[float, str]] = {}
    prof = GpuProfiler(workers=workers, timeout_s=120)
    try:
        prof.measure(jobs, lambda i, s, why: got.__setitem__(i, (s, why)))
    finally:
        prof.close()
    print({i: (s, why[-300:]) for i, (s, why) in got.items()})
    assert set(got) == set(range(len(jobs)))
    return got


SOFT = graph_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": rand(64, 3000)}, ["y"], opset=13)


def test_a_kernel_that_cannot_be_built_is_contained():
    got = _measure([_job(SOFT), _job(SOFT, Schedule(1, 64, 4, True)), _job(SOFT, Schedule(1, 1024, 4, False))])
    assert math.isfinite(got[0][0]) and 0 < got[0][0] < 1e-3
    assert got[1][0] == math.inf and "persistent" in got[1][1]  # refused at build: tuning goes on
    assert math.isfinite(got[2][0])  # the looped schedule of the same kernel measures fine


def test_a_gpu_fault_is_contained():
    # A gather through indices far outside the data: an illegal address on the GPU. The frontend
    # rejects such constants, so the index is corrupted after fission.
    gather = graph_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
                         {"x": rand(8, 4), "i": Const(np.array([3, 0, 5, 1], np.int64))}, ["y"], opset=13)
    bad = _job(gather)
    (idx,) = bad.graph.constants  # fission's copy of the indices, which the kernel loads
    bad.graph.constants[idx] = np.array([1 << 40, 0, 0, 0], np.int64)
    got = _measure([bad, _job(SOFT)], workers=1)  # one worker: the good job runs after the fault
    assert got[0][0] == math.inf
    assert math.isfinite(got[1][0])


def test_measured_compile_and_cache(tmp_path):
    db = str(tmp_path / "t.db")
    opts = tessera.CompileOptions(cost="measured", db=db, solver="highs")
    exe = tessera.compile(MODELS / "attn_s7.onnx", opts, device="cuda")
    assert exe.plan["cost_model"] == "measured" and exe.plan["tuning"]["measured"] > 0
    with TuningDB(db) as d:
        t = exe.plan["tuning"]
        assert len(d) == t["measured"] + t["schedule_measured"] and t["schedules_tuned"] >= 1
    assert any("schedule" in k for k in exe.plan["kernels"])
    # Again on the same database: the chain model is refit from the chains just measured
    # (chain_search.calibrate_from_db), and its new best few may hold variants not yet timed (H200: 3,
    # then 1 on a third compile), at most TOP of each chain's; everything else is a cache hit.
    again = tessera.compile_model(MODELS / "attn_s7.onnx", opts)
    chains = [k for k in exe.plan["kernels"] if "chain_search" in k]
    assert chains and again.tuning["measured"] <= TOP * len(chains)
    soft = tmp_path / "soft.onnx"
    onnx.save(SOFT, soft)
    first = tessera.compile_model(soft, opts)
    assert first.tuning["measured"] > 0 and tessera.compile_model(soft, opts).tuning["measured"] == 0
