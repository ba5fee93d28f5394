"""CUDA-graph replay and generated kernels on the GPU (skipped without CUDA; run on the device machine)."""
from __future__ import annotations

import pytest
import torch
from opcheck import models_dir

import tessera
from tessera.frontend import load
from tessera.tolerance import rel_l2
from tessera.verify import random_inputs, run_onnxruntime

MODELS = models_dir()

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("name", ["candy_small.onnx", "bert_tiny.onnx", "gpt2_tiny.onnx"])
def test_graph_replay_matches_eager_launches_and_onnxruntime(name):
    opts = tessera.CompileOptions(solver="highs", cost="analytical")  # the GPU machine has highspy (a carried wheel), not PuLP
    replay = tessera.compile(MODELS / name, opts, device="cuda")
    eager = tessera.compile(MODELS / name, opts, device="cuda")
    eager.cuda_graph = False
    model = load(MODELS / name)
    for seed in (1, 2, 3):  # the first call captures, the others replay on new inputs
        feeds = random_inputs(model.graph, seed)
        ref = run_onnxruntime(model.model, feeds)
        got = replay.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        base = eager.run(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        for k in ref:
            assert rel_l2(got[k].cpu().numpy(), ref[k]) < 1e-5
            assert torch.equal(got[k], base[k])  # same kernels, same order: bitwise equal
    assert replay._graph is not None
