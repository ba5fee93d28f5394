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


def test_a_replay_converts_its_inputs_in_the_one_copy_into_the_graph():
    # fp16 inputs in the plan (io="precision"), fp32 tensors from the caller: once captured, `run`
    # copies each input straight into the graph's fp16 buffer (one conversion kernel), and must give
    # what converting first gives, bit for bit, for a strided input too.
    opts = tessera.CompileOptions(solver="highs", cost="analytical", precision="fp16", io="precision")
    exe = tessera.compile(MODELS / "candy_small.onnx", opts, device="cuda")
    model = load(MODELS / "candy_small.onnx")
    name = model.graph.inputs[0]
    for seed in (1, 2, 3):  # the first call captures, the others take the one-copy path
        x = torch.from_numpy(random_inputs(model.graph, seed)[name]).cuda()
        strided = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, other strides
        got = exe.run(strided)[exe.output_names[0]]
        want = exe.run_static(exe.prepare_inputs(x.half()))[exe.output_names[0]]
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert exe._graph is not None


_OUT_OF_RANGE = """
import sys, torch, tessera
from opcheck import models_dir
exe = tessera.compile(models_dir() / "gpt2_tiny.onnx", tessera.CompileOptions(solver="highs", cost="analytical"),
                      device="cuda")
ids = torch.randint(0, 1000, (1, 128), device="cuda")
exe(ids)  # captures, checking the first call's ids on the host
torch.cuda.synchronize()
ids[0, 7] = int(sys.argv[1])  # the next call's ids on the GPU: checked by the graph alone
exe(ids)
torch.cuda.synchronize()
print("REPLAYED")
"""


@pytest.mark.parametrize("bad", [1000, -1001])
def test_an_index_out_of_range_stops_the_replay(bad, tmp_path):
    # GPU tensors' index ranges are checked inside the CUDA graph (runtime/index_check.py), not by host
    # ops: a bad id stops the stream with a device-side assert before GPT-2's gather reads past its table.
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "oob.py"
    script.write_text(_OUT_OF_RANGE)
    import os

    # without TRITON_INTERPRET: a CPU test run before in this process (pytest-xdist's workers) has it set
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(script), str(bad)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode != 0 and "REPLAYED" not in r.stdout, r.stdout + r.stderr
    assert "device-side assert" in r.stderr or "outside the dim it gathers from" in r.stderr, r.stderr[-2000:]
    ok = subprocess.run([sys.executable, str(script), "999"], capture_output=True, text=True, env=env, timeout=600)
    assert ok.returncode == 0 and "REPLAYED" in ok.stdout, ok.stderr[-2000:]
