"""A few of `scripts/arch_zoo.py`'s architectures end to end on the CPU, one for each feature the shared
models lack: grouped-query attention with rotary embeddings and RMSNorm (llama), shifted-window attention
with padding (swin), a convolutional feature extractor with a grouped positional convolution and instance
norm (wav2vec2), relative position buckets (t5_encoder), position ids from a running sum of the padding
mask (roberta: an integer CumSum), rotary tables read by GatherND (falcon), a mixture-of-experts router's
TopK (mixtral), patches folded back by Col2Im (mobilevitv2). Each is exported to ONNX, compiled (analytical cost), run and compared with onnxruntime on
fresh random inputs, with no node left to the fallback; llama also goes through
`torch.compile(backend="tessera")`. The whole sweep (60 architectures, fp32 and fp16) is in
docs/testing.md, "Architecture breadth"."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("transformers")  # a dev dependency (pyproject.toml)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import arch_zoo  # noqa: E402

import tessera  # noqa: E402
from tessera.frontend import load as frontend_load  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2, weak_reference  # noqa: E402
from tessera.verify import random_inputs, run_onnxruntime  # noqa: E402


@pytest.mark.parametrize("name,precision", [("llama", "fp32"), ("swin", "fp32"), ("wav2vec2", "fp16"),
                                            ("t5_encoder", "fp16"), ("roberta", "fp32"), ("falcon", "fp16"),
                                            ("mixtral", "fp16"), ("mobilevitv2", "fp32")])
def test_an_architecture_compiles_and_matches_onnxruntime(tmp_path, name, precision):
    path, std = arch_zoo.export(name, tmp_path)
    assert 1e-2 < std < 1e3, f"{name}'s output vanishes or explodes (std {std}): the check would show little"
    graph = frontend_load(str(path)).graph
    feeds = random_inputs(graph, seed=7)
    run = tessera.compile(str(path), tessera.CompileOptions(cost="analytical", precision=precision))
    assert not [n for n in run.graph.nodes if n.op == "opaque"], "every node lowers: no fallback"
    outs = run.run(**feeds)
    ref = run_onnxruntime(onnx.load(str(path)), feeds)
    for out_name, r in ref.items():
        assert not weak_reference(r)
        got = outs[out_name].float().numpy()
        err = rel_l2(got, r)
        assert err < TOLERANCE[precision], (name, out_name, err)
        assert np.isfinite(got).all()


def test_llama_through_the_torch_backend():
    err, _, graphs, eager, reference = arch_zoo.through_backend("llama", "fp32", "cpu")
    assert graphs == 1 and eager == 0 and err < TOLERANCE["fp32"] and reference == "float64 eager", (graphs, eager, err)


def test_llama_with_a_dynamic_sequence_runs_padded_in_buckets(tmp_path, capsys):
    """A causal model's later positions do not change earlier ones, so a call between two buckets
    runs zero-padded up to the larger (docs/architecture.md, "Shape buckets"); run --check compares
    each bucket's padded run with onnxruntime at the real size."""
    from tessera.cli.main import main

    path, _ = arch_zoo.export("llama", tmp_path, dynamic_seq=True)
    out = tmp_path / "llama_dynamic"
    assert main(["compile", str(path), "--dynamic", "args_0=1:8..32", "--cost", "analytical", "-o", str(out)]) == 0
    assert "pads to the next bucket" in capsys.readouterr().out
    assert main(["run", str(out), "--check"]) == 0
    text = capsys.readouterr().out
    assert text.count("PASS (tolerance") == 3 and "seq=12 ran in the bucket seq=16" in text, text
