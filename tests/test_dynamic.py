"""Shape buckets for ONNX models (issue 16): `tessera compile --dynamic`, one artifact per model,
padded calls checked against onnxruntime at the real size."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import tessera
from tessera.cli.main import main
from tessera.compiler import CompileOptions
from tessera.dynamic import compile_buckets, parse_dynamic, write_buckets
from tessera.errors import ModelLoadError, ShapeError, TesseraError
from tessera.runtime.buckets import BucketedExecutable, power_of_two_buckets
from tessera.verify import run_onnxruntime

CPU = CompileOptions(cost="analytical")


def _mlp(path: Path, batch: str | int = "batch", reduce_batch: bool = False) -> Path:
    """x [batch, 12] -> MatMul -> Add -> Relu -> MatMul -> y [batch, 5]; with `reduce_batch` the
    output is also centred over the batch (so zero padding changes it)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((12, 20)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(20).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((20, 5)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"])]
    if reduce_batch:
        nodes += [helper.make_node("MatMul", ["r", "w2"], ["z"]),
                  helper.make_node("ReduceMean", ["z"], ["m"], axes=[0], keepdims=1),
                  helper.make_node("Sub", ["z", "m"], ["y"])]
    else:
        nodes.append(helper.make_node("MatMul", ["r", "w2"], ["y"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])], [w1, b1, w2])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _conv(path: Path) -> Path:
    """A conv -> BatchNorm -> Relu block whose export fixed the batch at 1."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "mean"),
             numpy_helper.from_array((rng.random(6) + 0.5).astype(np.float32), "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 9, 9])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_specs_and_buckets() -> None:
    assert power_of_two_buckets(1, 8) == (1, 2, 4, 8)
    assert power_of_two_buckets(32, 128) == (32, 64, 128)
    assert power_of_two_buckets(3, 100) == (4, 8, 16, 32, 64, 100)
    (r,) = parse_dynamic(["input_ids=1:32..128"])
    assert (r.name, r.axis, r.buckets) == ("input_ids", 1, (32, 64, 128))
    (r,) = parse_dynamic(["x=0:8,1,3"])
    assert (r.low, r.high, r.buckets) == (1, 8, (1, 3, 8))
    for bad in ["x", "x=0", "x=a:1..2", "x=0:4..2", "x=0:0..2"]:
        with pytest.raises(TesseraError, match="--dynamic"):
            parse_dynamic([bad])


def test_one_artifact_runs_batches_1_3_and_8(tmp_path: Path) -> None:
    model = _mlp(tmp_path / "mlp.onnx")
    compiled = compile_buckets(model, CPU, parse_dynamic(["x=0:1..8"]))
    (dim,) = compiled.dims
    assert (dim.symbol, dim.uses, dim.buckets, dim.pad) == ("batch", (("x", 0),), (1, 2, 4, 8), True)
    assert compiled.outputs == {"y": [(0, "batch")]}
    write_buckets(compiled, tmp_path / "out")
    exe = tessera.load(tmp_path / "out")
    assert isinstance(exe, BucketedExecutable)
    rng = np.random.default_rng()
    for b in (1, 3, 8):
        x = rng.standard_normal((b, 12)).astype(np.float32)
        (y,) = exe(x)
        ref = run_onnxruntime(onnx.load(model), {"x": x})["y"]
        assert y.shape == (b, 5)
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert sorted(exe.executables) == [(1,), (4,), (8,)]  # batch 3 ran padded in the bucket of 4
    with pytest.raises(ShapeError, match=r"'x' axis 0 \(batch\) is 9; this artifact runs 1..8"):
        exe(np.zeros((9, 12), np.float32))
    with pytest.raises(ShapeError, match=r"input 'x' has shape \[3, 11\], the model takes \[batch, 12\]"):
        exe(np.zeros((3, 11), np.float32))


def test_padding_that_changes_outputs_is_refused(tmp_path: Path) -> None:
    """Centring over the batch depends on every row: padding would change the real rows, so only
    the bucket sizes run, and an in-between size is refused with the reason."""
    model = _mlp(tmp_path / "centred.onnx", reduce_batch=True)
    compiled = compile_buckets(model, CPU, parse_dynamic(["x=0:1..4"]))
    (dim,) = compiled.dims
    assert not dim.pad
    assert "zero padding batch" in compiled.checks[0].reason and "'y'" in compiled.checks[0].reason
    write_buckets(compiled, tmp_path / "out")
    exe = tessera.load(tmp_path / "out")
    x = np.random.default_rng().standard_normal((4, 12)).astype(np.float32)
    np.testing.assert_allclose(exe(x)[0].numpy(), run_onnxruntime(onnx.load(model), {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="runs only the sizes"):
        exe(x[:3])


def test_cli_compile_dynamic_and_run_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A conv block exported at batch 1: --dynamic declares the axis, --check runs every bucket
    at a padded size against onnxruntime, --input-shape picks one size."""
    model = _conv(tmp_path / "conv.onnx")
    out = tmp_path / "art"
    assert main(["compile", str(model), "-o", str(out), "--cost", "analytical", "--dynamic", "x=0:1..4"]) == 0
    text = capsys.readouterr().out
    assert "x.0 (x axis 0): sizes 1..4, buckets [1, 2, 4]; pads to the next bucket" in text
    assert main(["run", str(out), "--check", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert "x.0=3 ran in the bucket x.0=4" in text and "FAIL" not in text
    assert text.count("PASS (tolerance") == 3
    assert main(["run", str(out), "--check", "--input-shape", "x=2x3x9x9"]) == 0
    assert "x.0=2 ran in the bucket x.0=2" in capsys.readouterr().out
    assert main(["run", str(out), "--input-shape", "x=5x3x9x9"]) == 2
    assert "is 5; this artifact runs 1..4" in capsys.readouterr().err
    # one source model for all buckets
    onnx_files = sorted(out.glob("bucket_*/model.onnx"))
    assert len(onnx_files) == 3 and len({f.stat().st_ino for f in onnx_files}) in (1, 3)
    # other commands take one bucket's folder, and say so
    assert main(["profile", str(out), "--device", "cpu"]) == 2
    assert "one artifact per shape bucket" in capsys.readouterr().err


def test_bad_requests_and_a_changed_manifest(tmp_path: Path) -> None:
    model = _mlp(tmp_path / "mlp.onnx")
    with pytest.raises(TesseraError, match=r"names input 'z'; the model's inputs are \['x'\]"):
        compile_buckets(model, CPU, parse_dynamic(["z=0:1..2"]))
    with pytest.raises(TesseraError, match="rank 2"):
        compile_buckets(model, CPU, parse_dynamic(["x=2:1..2"]))
    with pytest.raises(TesseraError, match="applies to a torch module"):
        tessera.compile(str(model), dynamic={0: {0: (1, 2)}})
    compiled = compile_buckets(model, CPU, parse_dynamic(["x=0:1,2"]))
    write_buckets(compiled, tmp_path / "out")
    manifest = tmp_path / "out" / "buckets.json"
    doc = json.loads(manifest.read_text())
    doc["dims"][0]["buckets"] = [1, 2, 64]
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ModelLoadError, match="changed after the compile"):
        tessera.load(tmp_path / "out")


def test_torch_outputs_from_a_bucket_are_fresh(tmp_path: Path) -> None:
    """Outputs are the call's own tensors: the next call does not overwrite them."""
    compiled = compile_buckets(_mlp(tmp_path / "mlp.onnx"), CPU, parse_dynamic(["x=0:1..4"]))
    write_buckets(compiled, tmp_path / "out")
    exe = tessera.load(tmp_path / "out")
    x = torch.randn(3, 12)
    (a,) = exe(x)
    first = a.clone()
    exe(torch.randn(3, 12))
    assert torch.equal(a, first) and a.is_contiguous()


def test_buckets_share_their_weights() -> None:
    """Large constants are one device copy per content, so B buckets do not hold B copies of the
    weights; small ones and other dtypes are their own."""
    from tessera.runtime.buffers import device_constant

    w = np.random.default_rng(0).standard_normal((128, 160)).astype(np.float32)
    a = device_constant(w, torch.device("cpu"), torch.float32)
    assert device_constant(w.copy(), torch.device("cpu"), torch.float32) is a
    assert device_constant(w, torch.device("cpu"), torch.float16) is not a
    assert device_constant(w[:2], torch.device("cpu"), torch.float32) is not device_constant(
        w[:2], torch.device("cpu"), torch.float32)
    w[0, 0] += 1
    assert device_constant(w, torch.device("cpu"), torch.float32) is not a


def test_compiling_again_into_the_folder_replaces_what_was_there(tmp_path: Path) -> None:
    """A bucketed compile over a single-plan artifact, and back: the folder holds only the newest."""
    model = _mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    assert main(["compile", str(model), "-o", str(out), "--cost", "analytical", "--input-shape", "x=2x12"]) == 0
    write_buckets(compile_buckets(model, CPU, parse_dynamic(["x=0:1..4"])), out)
    assert isinstance(tessera.load(out), BucketedExecutable) and not (out / "artifact.json").exists()
    write_buckets(compile_buckets(model, CPU, parse_dynamic(["x=0:1,2"])), out)
    assert sorted(p.name for p in out.glob("bucket_*")) == ["bucket_batch1", "bucket_batch2"]
    assert main(["compile", str(model), "-o", str(out), "--cost", "analytical", "--input-shape", "x=2x12"]) == 0
    assert not isinstance(tessera.load(out), BucketedExecutable)
