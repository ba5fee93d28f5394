"""`tessera bench` on a CPU: the same inputs for every contender, every output checked (no timing claims)."""
from __future__ import annotations

import json

import pytest
import torch

from tessera.bench import bench
from tessera.cli.main import main


@pytest.mark.slow
def test_bench_zoo_model_against_eager(tmp_path, capsys):
    saved: list[dict] = []  # what a caller could save after each contender (a cut-off run keeps these)
    doc = bench("zoo:mlp_tiny", precision="fp32", peers=["eager"], strategies=["optimal", "greedy"],
                cost="analytical", device="cpu", on_entry=saved.append)
    names = [e["name"] for e in doc["entries"]]
    assert names == ["tessera-optimal", "tessera-greedy", "eager"]
    assert [[e["name"] for e in d["entries"]] for d in saved] == [names[:1], names[:2], names]
    assert all(d["partial"] for d in saved) and "partial" not in doc
    assert saved[-1]["entries"] == doc["entries"]
    assert all(e["passed"] and e["ms"] > 0 for e in doc["entries"])
    assert doc["entries"][-1]["vs_best_peer"] == 1.0
    assert {"torch", "onnxruntime"} <= set(doc["versions"]) and doc["date"]
    assert "note" in doc  # a CPU run (device="cpu" here, on a GPU machine too) says it is no benchmark
    prof = doc["entries"][0]["extra"]["profile"]  # where the plan's time goes, kernel by kernel
    assert prof["top"] and prof["total_cost_us"] >= prof["total_roofline_us"] > 0
    assert sum(b["kernels"] for b in prof["by_backend"].values()) == doc["entries"][0]["extra"]["kernels"]
    assert all(r["cost_us"] >= r["roofline_us"] for r in prof["top"])  # analytical: roofline plus launch
    # every kernel's estimate by name, to set beside the replay's kernels (scripts/profile_diff.py --estimates)
    assert len(prof["estimate_us"]) == doc["entries"][0]["extra"]["kernels"]
    assert abs(sum(prof["estimate_us"].values()) - prof["total_cost_us"]) < 0.01 * len(prof["estimate_us"])


def test_bench_times_tessera_through_dynamo_beside_the_onnx_path():
    """`--vs tessera-dynamo`: the zoo module through torch.compile(backend="tessera"), checked against
    the same reference, listed but never the best peer."""
    doc = bench("zoo:mlp_tiny", precision="fp32", peers=["eager", "tessera-dynamo"], strategies=["optimal"],
                cost="analytical", device="cpu")
    by = {e["name"]: e for e in doc["entries"]}
    dyn = by["tessera-dynamo"]
    assert dyn["passed"] and dyn["extra"]["graphs"] == 1 and dyn["extra"]["opaque"] == []
    assert dyn["extra"]["kernels"] == by["tessera-optimal"]["extra"]["kernels"]  # the same plan, two frontends
    (stages,) = dyn["extra"]["stages"]  # where its compile's time went, step by step
    assert {"trace", "onnx", "load", "plan cache"} <= set(stages) and all(v >= 0 for v in stages.values())
    (plan,) = dyn["extra"]["plan"]  # its kernels by name and backend, beside the ONNX path's
    assert [k["backend"] for k in plan] == [k["backend"] for k in by["tessera-optimal"]["extra"]["plan"]]
    assert by["eager"]["vs_best_peer"] == 1.0


def test_bench_a_users_pytorch_model(tmp_path, capsys):
    """FILE.py:FUNC (FUNC returns (module, example_inputs)) benches a user's model against the peers,
    through the PyTorch frontend; a model with value-dependent control flow is named and refused."""
    f = tmp_path / "mine.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "def make():\n"
                 "    torch.manual_seed(0)\n"
                 "    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),\n"
                 "                      nn.Linear(4 * 6 * 6, 5))\n"
                 "    return m, (torch.randn(2, 3, 6, 6),)\n"
                 "class Branchy(nn.Module):\n"
                 "    def forward(self, x):\n"
                 "        return x * 2 if x.sum() > 0 else x\n"
                 "def branchy():\n"
                 "    return Branchy(), (torch.randn(3),)\n")
    assert main(["bench", f"{f}:make", "--device", "cpu", "--vs", "eager", "--strategy", "optimal",
                 "--cost", "analytical"]) == 0
    out = capsys.readouterr().out
    assert "Sequential" in out and "tessera-optimal" in out and "eager" in out
    with pytest.raises(Exception, match="does not trace as one graph"):
        bench(f"{f}:branchy", peers=["eager"], strategies=["optimal"], cost="analytical", device="cpu")


def test_bench_cli_writes_json_and_rejects_unknown_models(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "zoo:mlp_tiny", "--precision", "fp32", "--vs", "eager", "--strategy",
                 "greedy,greedy-notemplates", "--cost", "analytical", "--device", "cpu", "--json", str(out)]) == 0
    assert "tessera-greedy-notemplates" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["model"] == "mlp_tiny"
    assert [e["name"] for e in doc["entries"]] == ["tessera-greedy", "tessera-greedy-notemplates", "eager"]
    assert main(["bench", "zoo:mlp_tiny", "--strategy", "greedy-fast", "--device", "cpu"]) == 2
    assert "unknown strategy 'greedy-fast'" in capsys.readouterr().err
    assert main(["bench", "zoo:nope", "--device", "cpu"]) == 2
    assert "no zoo model 'nope'" in capsys.readouterr().err


def test_a_strategy_suffix_picks_the_rewrite_mode():
    from tessera.bench import _rewrites
    from tessera.errors import TesseraError

    assert _rewrites(["precisionio"]) == "regroup"
    assert _rewrites(["precisionio", "rewrites"]) == "on" and _rewrites(["norewrites"]) == "off"
    with pytest.raises(TesseraError, match="-rewrites or -norewrites"):
        _rewrites(["rewrites", "norewrites"])


def test_bench_a_zoo_model_at_a_larger_batch(tmp_path, capsys):
    # `--batch N`: the zoo model exported at N items (fresh rows, not copies of one), every contender
    # checked on the same N-item inputs, the document named for the batch.
    import numpy as np

    from tessera.frontend import load
    from tessera.verify import random_inputs
    from tessera.zoo import build, make

    graph = load(build("mlp_tiny", tmp_path, seed=1, batch=3)).graph
    (x,) = graph.inputs
    assert graph.types[x].shape[0] == 3 and (tmp_path / "mlp_tiny_b3.onnx").is_file()
    _, (example,) = make("mlp_tiny", batch=3)
    assert example.shape[0] == 3 and not torch.equal(example[0], example[1])
    feeds = random_inputs(graph, seed=0)[x]
    assert not np.array_equal(feeds[0], feeds[1])
    assert main(["bench", "zoo:mlp_tiny", "--batch", "3", "--device", "cpu", "--vs", "eager", "--strategy", "optimal",
                 "--cost", "analytical", "--json", str(tmp_path / "b.json")]) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["model"] == "mlp_tiny_b3" and all(e["passed"] for e in doc["entries"])
    assert len(doc["entries"]) == 2


def test_a_batch_is_refused_where_the_shapes_are_fixed(capsys):
    # An attention case's first axis is its heads, and an ONNX file's shapes are its own: no silent batch.
    assert main(["bench", "zoo:attn_s1", "--batch", "2", "--device", "cpu"]) != 0
    assert "zoo model attn_s1 has fixed shapes" in capsys.readouterr().err
    assert main(["bench", "model.onnx", "--batch", "2", "--device", "cpu"]) != 0
    assert "a batch of 2 applies to zoo models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "zoo:mlp_tiny", "--batch", "0", "--device", "cpu"])
    assert "--batch: must be an integer >= 1" in capsys.readouterr().err


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


def test_zoo_llama_is_a_grouped_query_decoder_that_compiles_and_matches_onnxruntime(tmp_path):
    # The zoo's llama at one layer and 16 tokens: its attention shares 4 key/value heads among 12 query
    # heads, its norms are RMSNorms, and its plan matches onnxruntime.
    pytest.importorskip("transformers")
    import numpy as np
    import torch

    import tessera
    from tessera.frontend import load
    from tessera.tolerance import rel_l2
    from tessera.verify import random_inputs, run_onnxruntime
    from tessera.zoo import llama

    torch.manual_seed(0)
    model, args = llama(seq=16, layers=1)
    attn = model.model.layers[0].self_attn
    assert (attn.config.num_attention_heads, attn.config.num_key_value_heads) == (12, 4)
    path = tmp_path / "llama.onnx"
    with torch.no_grad():
        torch.onnx.export(model.eval(), args, dynamo=True, optimize=True, verbose=False).save(str(path))
    graph = load(path)
    run = tessera.compile(path, tessera.CompileOptions(cost="analytical"))
    feeds = random_inputs(graph.graph, seed=4)
    ref = run_onnxruntime(graph.model, feeds)
    out = run(*[torch.from_numpy(feeds[n]) for n in run.input_names])[0]
    assert out.shape == (1, 16, 768) and np.isfinite(out.numpy()).all()
    assert rel_l2(out.numpy(), ref[run.output_names[0]]) < 1e-5


def test_a_cpu_bench_says_it_is_no_benchmark():
    from tessera.bench import CPU_NOTE, format_table

    doc = {"model": "m", "precision": "fp32", "device": "x86_64", "date": "2026-11-23", "note": CPU_NOTE,
           "entries": [{"name": "tessera-optimal", "ms": 1.0, "vs_best_peer": None, "rel_l2": 0.0, "passed": True}]}
    assert format_table(doc).splitlines()[-1] == CPU_NOTE and "not a benchmark" in CPU_NOTE


def test_the_table_says_which_tessera_row_ran_without_its_cuda_graph():
    from tessera.bench import format_table

    why = "the CUDA-graph capture of 2 kernel(s) (k0, k1) failed: operation not permitted"
    doc = {"model": "m", "precision": "fp16", "device": "H200", "date": "2026-11-29", "entries": [
        {"name": "tessera-optimal", "ms": 1.0, "vs_best_peer": 1.1, "rel_l2": 0.0, "passed": True,
         "extra": {"replay": f"launches (capture failed: {why})", "capture_error": why}},
        {"name": "tessera-greedy", "ms": 1.2, "vs_best_peer": 1.3, "rel_l2": 0.0, "passed": True,
         "extra": {"replay": "cuda graph", "capture_error": None}},
        {"name": "eager", "ms": 0.9, "vs_best_peer": 1.0, "rel_l2": 0.0, "passed": True, "extra": {}}]}
    lines = format_table(doc).splitlines()
    assert lines[-1] == f"tessera-optimal: ran launch by launch; its CUDA-graph capture failed: {why}"
    assert not any("tessera-greedy:" in line for line in lines)


def test_zoo_batchnorms_get_the_statistics_of_their_activations():
    # Random weights with default BatchNorm statistics let activations drift layer by layer (fp16
    # MobileNet-V2 underflowed to 0, Inception-V3 overflowed): calibrated, each BatchNorm's output
    # on fresh inputs has about unit variance per channel, and mean RELU_SHIFT where a ReLU reads it.
    import torch

    from tessera.zoo import RELU_SHIFT, calibrate_batchnorm

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
        assert float((mean - RELU_SHIFT).abs().max()) < 0.5 and 0.5 < float(std.mean()) < 1.5


class _ConvNormRelu(torch.nn.Module):
    """Inception's building block: the ReLU is a function call, not a module."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.relu(self.bn(self.conv(x)), inplace=True)


def test_zoo_calibration_shifts_only_the_batchnorms_a_relu_reads():
    # Zero-mean BatchNorm outputs feeding ReLUs amplify rounding errors layer after layer; a
    # BatchNorm whose output goes elsewhere (a linear bottleneck, a residual sum) stays centred.
    from tessera.zoo import RELU_SHIFT, calibrate_batchnorm

    torch.manual_seed(0)
    model = torch.nn.Sequential(_ConvNormRelu(3, 8), torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU6(), torch.nn.Conv2d(8, 4, 1), torch.nn.BatchNorm2d(4))
    assert calibrate_batchnorm(model, (torch.randn(1, 3, 16, 16),)) == 3
    biases = [float(m.bias.detach().mean()) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert biases == [RELU_SHIFT, RELU_SHIFT, 0.0]


class _ImageContext(torch.nn.Module):
    """Each channel's mean over the image, everywhere: varies between images, not within one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True).expand_as(x)


def test_zoo_calibration_amplifies_no_channel_by_orders_of_magnitude():
    # A near-dead channel (variance 1e-8 of its neighbours') is scaled up no more than 10x its
    # layer's median channel, and a channel that varies only between images (attention context)
    # keeps that variance: per-image statistics gave it ~0 and scaled it by up to 1/sqrt(eps).
    from tessera.zoo import calibrate_batchnorm

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    with torch.no_grad():
        conv.weight[0] *= 1e-4
        conv.bias[0] = 0.0
    dead, context = torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8)
    model = torch.nn.Sequential(conv, dead, torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1), _ImageContext(), context)
    assert calibrate_batchnorm(model, (torch.randn(1, 3, 16, 16),)) == 2
    gain = 1 / (dead.running_var + dead.eps).sqrt()  # the weights are all 1
    assert float(gain.max()) <= 10.01 / float((dead.running_var.median() + dead.eps).sqrt())
    with torch.no_grad():
        out = model(torch.randn(4, 3, 16, 16))
    assert float(out.std(dim=(0, 2, 3)).max()) < 3.0


def test_bench_precision_io_strategy_takes_half_inputs(tmp_path, capsys):
    # "-precisionio": the plan takes and returns fp16, as the .half() peers do, so the boundary casts
    # are gone; it is still checked against onnxruntime.
    out = tmp_path / "b.json"
    assert main(["bench", "zoo:mlp_tiny", "--precision", "fp16", "--vs", "eager", "--strategy",
                 "greedy,greedy-precisionio", "--cost", "analytical", "--device", "cpu", "--json", str(out)]) == 0
    by = {e["name"]: e for e in json.loads(out.read_text())["entries"]}
    plain, io = by["tessera-greedy"], by["tessera-greedy-precisionio"]
    assert plain["passed"] and io["passed"]
    # The input cast fused with a reshape is a generated kernel; without it the reshape is a view.
    assert io["extra"]["backends"].get("triton", 0) < plain["extra"]["backends"]["triton"]


def test_guards_skip_modules_drops_dynamo_guards_on_module_state_for_every_torch_compile():
    """`--guards skip-modules`: a parameter's changed properties no longer recompile (dynamo checks no
    guard on module state, the per-call cost that made bert_base's backend call host-bound); the bench
    records the setting; a bad value is named."""
    from tessera.bench import guard_options
    from tessera.compiler import CompileOptions
    from tessera.errors import TesseraError
    from tessera.torch_backend import dynamo_compile

    counts = {}
    for guards in ("all", "skip-modules"):
        torch._dynamo.reset()
        m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
        fn, compiled = dynamo_compile(m, CompileOptions(cost="analytical"), guard_options(guards))
        x = torch.randn(2, 8)
        with torch.no_grad():
            fn(x)
            m[1].inplace = True  # module state its forward reads (torch 2.11 no longer guards requires_grad here)
            fn(x)
        counts[guards] = len(compiled)
    assert counts == {"all": 2, "skip-modules": 1}
    # A user's spelling: torch takes guard_filter_fn out of the options before tessera reads its own.
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    fn = torch.compile(m, backend="tessera", options={"cost": "analytical", **guard_options("skip-modules")})
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x))
    doc = bench("zoo:mlp_tiny", precision="fp32", peers=["eager", "tessera-dynamo"], strategies=["optimal"],
                cost="analytical", device="cpu", guards="skip-modules")
    assert doc["guards"] == "skip-modules" and all(e["passed"] for e in doc["entries"])
    with pytest.raises(TesseraError, match="skip-modules"):
        guard_options("none")
