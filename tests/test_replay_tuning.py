"""scripts/replay_tuning.py: a measured compile rebuilt on the CPU from another compile's tuning log gives
the same plan, with no job missing from the log."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from fake_profiler import RandomTemplateProfiler
from opcheck import rand
from test_gated_gemm import _swiglu

from tessera import compiler
from tessera.compiler import CompileOptions, compile_model
from tessera.cost.db import TuningDB

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from replay_tuning import ReplayProfiler, read_log  # noqa: E402


def test_a_replayed_compile_rebuilds_the_plan(tmp_path, monkeypatch):
    model = _swiglu(rand(2, 13, 48, seed=140), 48, 40, 141, norm=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: RandomTemplateProfiler())
    first = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), precision="fp16"))
    with TuningDB(tmp_path / "t.db") as db:
        rows = db.export(tmp_path / "log.jsonl")
    replay = ReplayProfiler(read_log(tmp_path / "log.jsonl"))
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: replay)
    again = compile_model(model, CompileOptions(cost="measured", db=":memory:", precision="fp16"))
    assert rows == len(replay.jobs) and not replay.missing
    assert [k.name for k in again.kernels] == [k.name for k in first.kernels]
    assert [k.triton.schedule if k.triton else None for k in again.kernels] == \
        [k.triton.schedule if k.triton else None for k in first.kernels]
