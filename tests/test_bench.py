"""`tessera bench` on a CPU: the same inputs for every contender, every output checked (no timing claims)."""
from __future__ import annotations

import json

import pytest
import torch

from tessera.bench import bench
from tessera.cli.main import main


@pytest.mark.slow
def test_bench_zoo_model_against_eager(tmp_path, capsys):
    doc = bench("zoo:mlp_tiny", precision="fp32", peers=["eager"], strategies=["optimal", "greedy"],
                cost="analytical", device="cpu")
    names = [e["name"] for e in doc["entries"]]
    assert names == ["tessera-optimal", "tessera-greedy", "eager"]
    assert all(e["passed"] and e["ms"] > 0 for e in doc["entries"])
    assert doc["entries"][-1]["vs_best_peer"] == 1.0
    assert {"torch", "onnxruntime"} <= set(doc["versions"]) and doc["date"]
    assert ("note" in doc) == (not torch.cuda.is_available())  # a CPU run says it is no benchmark
    prof = doc["entries"][0]["extra"]["profile"]  # where the plan's time goes, kernel by kernel
    assert prof["top"] and prof["total_cost_us"] >= prof["total_roofline_us"] > 0
    assert sum(b["kernels"] for b in prof["by_backend"].values()) == doc["entries"][0]["extra"]["kernels"]
    assert all(r["cost_us"] >= r["roofline_us"] for r in prof["top"])  # analytical: roofline plus launch


def test_bench_cli_writes_json_and_rejects_unknown_models(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "zoo:mlp_tiny", "--precision", "fp32", "--vs", "eager", "--strategy", "greedy",
                 "--cost", "analytical", "--device", "cpu", "--json", str(out)]) == 0
    assert "tessera-greedy" in capsys.readouterr().out
    assert json.loads(out.read_text())["model"] == "mlp_tiny"
    assert main(["bench", "zoo:nope", "--device", "cpu"]) == 2
    assert "no zoo model 'nope'" in capsys.readouterr().err


def test_zoo_candy_is_the_shared_candy_network(tmp_path):
    # Same operators, same counts, same input: the PyTorch source of ../shared/models/candy.onnx's network.
    from collections import Counter
    from pathlib import Path

    from tessera.frontend import load
    from tessera.zoo import build

    ours = load(build("candy", tmp_path, seed=3)).graph
    shared = load(Path(__file__).resolve().parents[2] / "shared" / "models" / "candy.onnx").graph
    assert Counter(n.op for n in ours.nodes) == Counter(n.op for n in shared.nodes)
    assert [ours.types[t] for t in ours.inputs] == [shared.types[t] for t in shared.inputs]
    assert [ours.types[t] for t in ours.outputs] == [shared.types[t] for t in shared.outputs]


def test_zoo_segformer_is_the_shared_segformer_network(tmp_path):
    # The PyTorch source of ../shared/models/segformer_b0.onnx (needs transformers; the GPU machine has it).
    pytest.importorskip("transformers")
    from collections import Counter
    from pathlib import Path

    from tessera.frontend import load
    from tessera.zoo import build

    ours = load(build("segformer_b0", tmp_path)).graph
    shared = load(Path(__file__).resolve().parents[2] / "shared" / "models" / "segformer_b0.onnx").graph
    assert Counter(n.op for n in ours.nodes) == Counter(n.op for n in shared.nodes)
    assert [ours.types[t] for t in ours.inputs] == [shared.types[t] for t in shared.inputs]
    assert [ours.types[t] for t in ours.outputs] == [shared.types[t] for t in shared.outputs]


def test_a_cpu_bench_says_it_is_no_benchmark():
    from tessera.bench import CPU_NOTE, format_table

    doc = {"model": "m", "precision": "fp32", "device": "x86_64", "date": "2026-11-23", "note": CPU_NOTE,
           "entries": [{"name": "tessera-optimal", "ms": 1.0, "vs_best_peer": None, "rel_l2": 0.0, "passed": True}]}
    assert format_table(doc).splitlines()[-1] == CPU_NOTE and "not a benchmark" in CPU_NOTE


def test_zoo_batchnorms_get_the_statistics_of_their_activations():
    # Random weights with default BatchNorm statistics let activations drift layer by layer (fp16
    # MobileNet-V2 underflowed to 0, Inception-V3 overflowed): calibrated, each BatchNorm's output
    # on fresh inputs has about zero mean and unit variance per channel, as in a trained network.
    import torch

    from tessera.zoo import calibrate_batchnorm

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i in range(6):
        conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        torch.nn.init.normal_(conv.weight, std=2.0)  # each layer grows activations about 17x
        layers += [conv, torch.nn.BatchNorm2d(8), torch.nn.ReLU()]
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), *layers).eval()
    seen: list[torch.Tensor] = []
    for m in model:
        if isinstance(m, torch.nn.BatchNorm2d):
            m.register_forward_hook(lambda mod, inp, out: seen.append(out))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)
    assert max(float(o.abs().max()) for o in seen) > 1e4  # uncalibrated: the drift is real
    assert calibrate_batchnorm(model, (x,)) == 6
    assert not model.training and not any(m.training for m in model.modules())
    seen.clear()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    for o in seen:
        mean, std = o.mean(dim=(0, 2, 3)), o.std(dim=(0, 2, 3))
        assert float(mean.abs().max()) < 0.5 and 0.5 < float(std.mean()) < 1.5
