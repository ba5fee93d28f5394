"""`tessera verify --precision P` runs the graph at P; `tessera verify ARTIFACT --per-kernel` names
the first kernel of a compiled plan whose outputs diverge from the float64 reference."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from opcheck import models_dir

from tessera.cli.main import main
from tessera.frontend import load as frontend_load
from tessera.runtime import executable as executable_module
from tessera.runtime.artifact import load_artifact, read_meta
from tessera.verify import random_inputs, to_tf32, verify, verify_kernels

MODELS = models_dir()


def _save(path: Path, nodes, inputs, outputs, inits=()) -> Path:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)
    return path


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _const(name, value):
    v = np.asarray(value, np.float32)
    return helper.make_tensor(name, TensorProto.FLOAT, list(v.shape), v.ravel().tolist())


# ---- --precision: the graph runs at P -------------------------------------------------------
def test_fp16_runs_in_float16(tmp_path):
    """y = x * 1e5 overflows float16 (65504): an fp16 run gives infinities and fails, where the
    old check (float64 with a looser tolerance) passed. bf16 has float32's range and passes."""
    p = _save(tmp_path / "big.onnx", [helper.make_node("Mul", ["x", "c"], ["y"])], [_vi("x", [64])], [_vi("y", [64])],
              [_const("c", 1e5)])
    assert verify(p, seed=0).passed
    r16 = verify(p, seed=0, precision="fp16")
    assert not r16.passed and r16.outputs[0].rel_l2 == float("inf") and "float16" in r16.arithmetic
    rb = verify(p, seed=0, precision="bf16")
    assert rb.passed and 0 < rb.outputs[0].rel_l2 < 1e-2


def test_bf16_rounds_every_stored_tensor(tmp_path):
    """(x * (1 + 2^-9)) * (1 - 2^-9): each factor is a float16 value but rounds to 1 in bfloat16, and
    each product is stored, so the bf16 run loses both; fp16 keeps them (only storage rounding)."""
    c1, c2 = 1 + 2.0 ** -9, 1 - 2.0 ** -9
    nodes = [helper.make_node("Mul", ["x", "a"], ["t"]), helper.make_node("Mul", ["t", "b"], ["y"])]
    p = _save(tmp_path / "chain.onnx", nodes, [_vi("x", [256])], [_vi("y", [256])], [_const("a", c1), _const("b", c2)])
    r32, r16, rb = (verify(p, seed=1, precision=q).outputs[0].rel_l2 for q in ("fp32", "fp16", "bf16"))
    assert r32 < 1e-7
    assert r16 < 1e-3  # float16 storage: about 2^-12 per element
    assert rb > 1e-3  # bfloat16 storage: the factors are gone, |1 - c1*c2| is tiny but each rounding is 2^-9


def test_tf32_rounds_matmul_operands(tmp_path):
    """A weight of 1 + 2^-12 is 1.0 in TF32 (10 mantissa bits): the tf32 run is off by 2^-12
    relative; the fp32 run is exact."""
    w = np.eye(32, dtype=np.float32) * np.float32(1 + 2.0 ** -12)
    p = _save(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [8, 32])],
              [_vi("y", [8, 32])], [_const("w", w)])
    assert verify(p, seed=2).outputs[0].rel_l2 < 1e-7
    r = verify(p, seed=2, precision="tf32")
    assert "TF32" in r.arithmetic and r.passed
    x = random_inputs(frontend_load(p).graph, 2)["x"].astype(np.float64)
    expect = np.linalg.norm(to_tf32(x) - x * (1 + 2.0 ** -12)) / np.linalg.norm(x * (1 + 2.0 ** -12))
    assert r.outputs[0].rel_l2 == pytest.approx(expect, rel=1e-3)
    assert r.outputs[0].rel_l2 > 1e-4


def test_verify_cli_says_what_ran(capsys):
    assert main(["verify", str(MODELS / "gemm_g3.onnx"), "--seed", "3", "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "computed in float16 storage after the precision pass" in out and "(fp16)" in out
    assert main(["verify", str(MODELS / "gemm_g3.onnx"), "--seed", "3", "--precision", "bf16", "--json"]) == 0
    assert "bfloat16" in json.loads(capsys.readouterr().out)["arithmetic"]
    assert main(["verify", str(MODELS / "gemm_g3.onnx"), "--stage", "frontend", "--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stage frontend runs the operator graph in onnxruntime" in err


def test_a_constant_reference_is_named(tmp_path, capsys):
    """A model whose output is one number everywhere (vanished activations give all zeros) passes any
    check whose kernels also write that number: verify and run --check say so. A varying output has
    no note."""
    nodes = [helper.make_node("Mul", ["x", "zero"], ["z"]), helper.make_node("Add", ["z", "two"], ["y"]),
             helper.make_node("Relu", ["x"], ["r"])]
    p = _save(tmp_path / "flat.onnx", nodes, [_vi("x", [4, 8])], [_vi("y", [4, 8]), _vi("r", [4, 8])],
              [_const("zero", 0.0), _const("two", 2.0)])
    r = verify(p, seed=0)
    notes = {o.name: o.note for o in r.outputs}
    assert r.passed and "constant (2 everywhere)" in notes["y"] and notes["r"] == ""
    assert main(["verify", str(p), "--json"]) == 0
    assert [o.get("note", "") != "" for o in json.loads(capsys.readouterr().out)["outputs"]] == [True, False]
    assert main(["compile", str(p), "-o", str(tmp_path / "flat"), "--cost", "analytical"]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "flat"), "--check"]) == 0
    out = capsys.readouterr().out
    assert out.count("note: the reference is constant") == 1 and "PASS" in out


# ---- --per-kernel ---------------------------------------------------------------------------
def _convnet(path: Path) -> Path:
    """conv -> instance norm -> relu -> conv -> add (residual) -> softmax over channels: several kernels
    of each backend, convolutions that the nhwc policy stores channels-last."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("InstanceNormalization", ["c1", "g", "be"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=1)]
    inits = [_const("w1", rng.standard_normal((8, 8, 3, 3)) * 0.2), _const("b1", rng.standard_normal(8)),
             _const("g", rng.standard_normal(8)), _const("be", rng.standard_normal(8)),
             _const("w2", rng.standard_normal((8, 8, 3, 3)) * 0.2), _const("b2", rng.standard_normal(8))]
    return _save(path, nodes, [_vi("x", [1, 8, 12, 12])], [_vi("y", [1, 8, 12, 12])], inits)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("perkernel")
    model = _convnet(d / "convnet.onnx")
    out = {"model": model}
    for name, extra in (("fp32", []), ("fp16_nhwc", ["--precision", "fp16", "--layout", "nhwc"])):
        assert main(["compile", str(model), "-o", str(d / name), "--cost", "analytical", *extra]) == 0
        out[name] = d / name
    return out


def _report(artifact: Path, propagate: bool = False, seed: int = 0):
    meta = read_meta(artifact)
    exe = load_artifact(artifact, "cpu")
    feeds = random_inputs(frontend_load(artifact / "model.onnx", meta["input_shapes"]).graph, seed)
    return exe, verify_kernels(exe, feeds, propagate=propagate, seed=seed)


def test_clean_plans_pass(artifacts, capsys):
    assert main(["verify", str(artifacts["fp32"]), "--per-kernel", "--seed", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "isolated" in out and out.strip().splitlines()[-1].startswith("PASS")
    # fp16 storage, channels-last buffers, precision casts at the boundaries: all mapped back.
    _, r = _report(artifacts["fp16_nhwc"])
    plan = json.loads((artifacts["fp16_nhwc"] / "plan.json").read_text())
    assert any(b["layout"] != sorted(b["layout"]) for b in plan["buffers"]), "expected channels-last buffers"
    assert r.passed and len(r.kernels) == len(plan["kernels"]) and r.precision == "fp16"
    assert {k.backend for k in r.kernels} >= {"triton", "linear"}
    assert 0 < max(k.worst.rel_l2 for k in r.kernels) < 1e-2
    _, rp = _report(artifacts["fp16_nhwc"], propagate=True)
    assert rp.passed and rp.mode == "propagated"


def _plant(monkeypatch, victim: str) -> None:
    """A bug in one generated kernel, in the executable only: its outputs come out 1% too large."""
    real = executable_module.TritonKernel

    class Buggy(real):  # type: ignore[misc, valid-type]
        def __call__(self, *tensors: torch.Tensor) -> None:
            super().__call__(*tensors)
            if self.ks.name == victim:
                for out in tensors[len(self.ks.inputs):]:
                    if out.dtype.is_floating_point:
                        out.mul_(1.01)

    monkeypatch.setattr(executable_module, "TritonKernel", Buggy)


def test_a_planted_bug_is_named_as_the_first_diverging_kernel(artifacts, monkeypatch, capsys):
    plan = json.loads((artifacts["fp32"] / "plan.json").read_text())
    exe = load_artifact(artifacts["fp32"], "cpu")
    # A generated kernel in the middle: kernels before and after it.
    index, victim = next((i, s.impl.name) for i, s in enumerate(exe.steps)
                         if s.impl.backend == "triton" and 0 < i < len(exe.steps) - 1)
    assert plan["kernels"][index]["name"] == victim
    _plant(monkeypatch, victim)
    assert main(["verify", str(artifacts["fp32"]), "--per-kernel", "--seed", "4", "--device", "cpu"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    fail, prims, onnx_nodes = lines[-3:]
    assert fail.startswith(f"FAIL: first diverging kernel {victim} (#{index}, triton)") and ">= tolerance 1e-05" in fail
    assert "1 kernel(s) fail in all" in fail  # isolated: the kernels after it read the reference's values
    assert prims == "  its primitives: " + ", ".join(plan["kernels"][index]["prims"])
    assert onnx_nodes == "  its ONNX nodes: " + ", ".join(plan["kernels"][index]["source_nodes"])
    # The same from Python, and propagated: the same first kernel, and the error travels on.
    _, r = _report(artifacts["fp32"], seed=4)
    assert r.first_failure.name == victim and [k.name for k in r.kernels if not k.passed] == [victim]
    assert r.first_failure.worst.rel_l2 == pytest.approx(0.01, rel=0.05)
    _, rp = _report(artifacts["fp32"], propagate=True, seed=4)
    assert rp.first_failure.name == victim
    assert main(["verify", str(artifacts["fp32"]), "--per-kernel", "--propagate", "--json", "--device", "cpu"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["first_failure"] == victim and doc["mode"] == "propagated" and not doc["passed"]


def test_a_wrong_weight_in_a_library_kernel_is_found(artifacts):
    """A constant changed in the executable only (the reference keeps the graph's): the fp16,
    channels-last convolution that reads it is the first and only diverging kernel."""
    exe = load_artifact(artifacts["fp16_nhwc"], "cpu")
    conv = next(s for s in exe.steps if s.impl.backend == "linear")
    w = conv.impl.linear.inputs[1]
    exe.constants[w] = exe.constants[w] * 1.1
    meta = read_meta(artifacts["fp16_nhwc"])
    feeds = random_inputs(frontend_load(artifacts["fp16_nhwc"] / "model.onnx", meta["input_shapes"]).graph, 5)
    r = verify_kernels(exe, feeds)
    assert [k.name for k in r.kernels if not k.passed] == [conv.impl.name]


def test_per_kernel_compiles_a_model_first(artifacts, capsys):
    assert main(["verify", str(artifacts["model"]), "--per-kernel", "--seed", "2", "--precision", "bf16",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "(bf16)" in out and out.strip().splitlines()[-1].startswith("PASS")


@pytest.mark.parametrize("argv, message", [
    (["--propagate"], "--propagate applies to --per-kernel"),
    (["--per-kernel", "--precision", "fp16"], "was compiled for fp32"),
    (["--per-kernel", "--stage", "fission"], "--stage does not apply to --per-kernel"),
    (["--per-kernel", "--input-shape", "x=1x8x4x4"], "--input-shape applies to an .onnx file"),
    ([], "is a directory; to check an artifact's kernels pass --per-kernel"),
])
def test_per_kernel_user_mistakes(artifacts, capsys, argv, message):
    assert main(["verify", str(artifacts["fp32"]), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_per_kernel_missing_target(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nope"), "--per-kernel"]) == 2
    assert "no such artifact directory or model file" in capsys.readouterr().err
