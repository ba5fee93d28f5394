"""The executable: compile, save, load and run against onnxruntime (torch backend, CPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tessera
from tessera.cli.main import main
from tessera.errors import ModelLoadError, ShapeError
from tessera.frontend import load as frontend_load
from tessera.tolerance import rel_l2
from tessera.verify import random_inputs, run_onnxruntime

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


@pytest.mark.parametrize("name", ["attn_s7.onnx", "bert_tiny.onnx", "candy_small.onnx", "gpt2_tiny.onnx",
                                  "segformer_b0_small.onnx", "efficientvit_b0_small.onnx"])
@pytest.mark.parametrize("strategy", ["optimal", "greedy"])
def test_compile_and_run_matches_onnxruntime(name, strategy):
    run = tessera.compile(MODELS / name, tessera.CompileOptions(strategy=strategy, cost="analytical"))
    model = frontend_load(MODELS / name)
    feeds = random_inputs(model.graph, seed=11)
    ref = run_onnxruntime(model.model, feeds)
    outs = run(*[torch.from_numpy(feeds[n]) for n in run.input_names])
    for name_, out in zip(run.output_names, outs):
        assert rel_l2(out.numpy(), ref[name_]) < 1e-5


def test_artifact_round_trip_and_cli_check(tmp_path, capsys):
    out = tmp_path / "bert"
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(out)]) == 0
    for f in ("plan.json", "report.html", "model.onnx", "artifact.json"):
        assert (out / f).is_file()
    assert not list(out.rglob("*.pkl"))  # nothing that unpickles
    capsys.readouterr()
    assert main(["run", str(out), "--check", "--seed", "5"]) == 0
    text = capsys.readouterr().out
    assert "PASS" in text and "seed 5" in text
    exe = tessera.load(out)
    x = torch.randint(0, 1000, (1, 128))
    np.testing.assert_allclose(exe(x)[0].numpy(), exe(input_ids=x)[0].numpy() if "input_ids" in exe.input_names
                               else exe(**{exe.input_names[0]: x})[0].numpy())
    np.savez(tmp_path / "in.npz", **{exe.input_names[0]: x.numpy()})
    # on the CPU, as `exe` runs (a GPU machine's default device is CUDA, whose float32 sums differ in the 7th digit)
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "--save-outputs", str(tmp_path / "o.npz"),
                 "--device", "cpu"]) == 0
    with np.load(tmp_path / "o.npz") as saved:
        np.testing.assert_allclose(saved[exe.output_names[0]], exe(x)[0].numpy(), rtol=1e-6)


def test_runtime_errors(tmp_path, capsys):
    with pytest.raises(ModelLoadError, match="not a tessera artifact"):
        tessera.load(tmp_path)
    assert main(["run", str(tmp_path)]) == 2
    assert "not a tessera artifact" in capsys.readouterr().err
    exe = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(cost="analytical"))
    with pytest.raises(ShapeError, match="'a'"):
        exe(torch.randn(1, 5, 64), torch.randn(1, 64, 256), torch.randn(1, 256, 64))


def test_a_user_set_triton_interpreter_is_refused_for_the_gpu(monkeypatch):
    # Under TRITON_INTERPRET=1 Triton runs kernels on the host; a GPU executable would fail inside
    # CUDA-graph capture with torch's copy error, naming neither cause nor fix. The user gets both.
    from tessera.codegen import launch
    from tessera.errors import TesseraError

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(launch, "_SET_BY_US", False)
    with pytest.raises(TesseraError, match="TRITON_INTERPRET=1 is set.*unset it to run on the GPU"):
        launch.use_interpreter(torch.device("cuda"))
    monkeypatch.setattr(launch, "_SET_BY_US", True)  # tessera's own choice, for an earlier CPU run: undone
    launch.use_interpreter(torch.device("cuda"))
    assert "TRITON_INTERPRET" not in __import__("os").environ  # monkeypatch restores both afterwards


_SWITCH = r"""
import sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
from tessera.codegen import launch
import kmod

x, y = torch.arange(64, dtype=torch.float32), torch.empty(1)
for device in ("cpu", "cuda", "cpu"):  # a CPU run, a GPU build (for sm90, no GPU needed), a CPU run again
    launch.use_interpreter(torch.device(device))
    fn = {}
    exec(compile(open(kmod.__file__).read(), kmod.__file__, "exec"), fn)  # as TritonKernel loads a kernel
    if device == "cpu":
        fn["k"][(1,)](x, y, N=64)
        assert float(y) == 2016 + 22, float(y)
    else:
        src = ASTSource(fn=fn["k"], signature={"x": "*fp32", "y": "*fp32", "N": "constexpr"}, constexprs={(2,): 64})
        assert "st.global" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print("ok")
"""


def test_a_gpu_build_after_a_cpu_run_in_one_process(tmp_path):
    # A CPU run re-imports Triton's language functions as interpreted ones and leaves builtins swapped in
    # triton.language.core; the GPU build after it must find both as they were (it failed: Triton 3.9
    # asserts while importing Gluon, and with the functions re-imported alone, "'block_argument' object
    # has no attribute 'dtype'"). A fresh process, since the switch re-imports modules.
    (tmp_path / "kmod.py").write_text("import triton, triton.language as tl\n@triton.jit\n"
                                      "def k(x, y, N: tl.constexpr):\n    o = tl.arange(0, N)\n"
                                      "    tl.store(y, tl.sum(tl.load(x + o), 0) + tl.cdiv(N, 3))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _SWITCH, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


_RUN_AGAIN = r"""
import numpy as np, onnx, torch
from onnx import TensorProto, helper
import tessera
from tessera.codegen import launch
g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 33])])
exe = tessera.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
                      tessera.CompileOptions(cost="analytical"))
x = torch.randn(4, 33)
first = exe(x)[0]
launch.use_interpreter(torch.device("cuda"))  # what a GPU executable made or run since does (no GPU needed)
assert torch.equal(exe(x)[0], first) and torch.allclose(first, torch.softmax(x, -1))
print("ok")
"""


def test_a_cpu_executable_runs_again_after_a_gpu_switch(tmp_path):
    # A CPU executable run after a GPU one was made or run in the same process (`tessera run` on the GPU,
    # then a loaded artifact on the CPU, as test_artifact_round_trip_and_cli_check does on a GPU machine):
    # it failed with "Cannot call @triton.jit'd outside of the scope of a kernel", its interpreted kernel
    # calling tl.sum as the GPU function. Each run now puts the interpreter back. A fresh process.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _RUN_AGAIN], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_precision_io_drops_the_boundary_casts(tmp_path, capsys, precision):
    # gemm_g1 in fp16 with the model's float32 I/O is three input casts, two matmuls and an output
    # cast (issue 15's "defect": peers run .half() on half inputs); with --io precision it is the
    # two matmuls, taking and returning the narrow type, and the artifact keeps the choice.
    narrow = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    declared = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(precision=precision, cost="analytical"))
    assert [s.impl.name.split("_", 1)[1] for s in declared.steps] == ["cast", "cast", "cast", "matmul", "matmul_cast"]
    out = tmp_path / "g1"
    assert main(["compile", str(MODELS / "gemm_g1.onnx"), "-o", str(out), "--precision", precision,
                 "--io", "precision", "--cost", "analytical"]) == 0
    exe = tessera.load(out)
    assert [s.impl.name.split("_", 1)[1] for s in exe.steps] == ["matmul", "matmul"]
    model = frontend_load(MODELS / "gemm_g1.onnx")
    feeds = random_inputs(model.graph, seed=12)
    (y,) = exe(*[torch.from_numpy(feeds[n]).to(narrow) for n in exe.input_names])
    assert y.dtype == narrow
    ref = run_onnxruntime(model.model, feeds)[exe.output_names[0]]
    assert rel_l2(y.float().numpy(), ref) < 1e-2
    capsys.readouterr()
    assert main(["run", str(out), "--check"]) == 0 and "PASS" in capsys.readouterr().out


def test_a_gpu_fault_on_the_first_run_names_its_kernel(monkeypatch):
    """The capture's warm-up synchronizes after each kernel, so a fault names the kernel that made
    it (CUDA reports one at the next launch) with its schedule; other errors pass through as they
    are. The fault is simulated: the CPU has no CUDA to fault."""
    from tessera.runtime.executable import KernelFaultError

    exe = tessera.compile(MODELS / "attn_s7.onnx", tessera.CompileOptions(cost="analytical"))
    feeds = exe.prepare_inputs(*[torch.from_numpy(v) for v in
                                 random_inputs(frontend_load(MODELS / "attn_s7.onnx").graph, seed=3).values()])
    victim = next(s for s in exe.steps if s.kernel is not None)
    real = exe.run_step

    def faulty(step, env):
        if step is victim:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        real(step, env)

    monkeypatch.setattr(exe, "run_step", faulty)
    with pytest.raises(KernelFaultError, match=victim.impl.name + r".*schedule.*faulted the GPU"):
        exe._run_steps(range(len(exe.steps)), exe._feed_env(feeds), sync_each=True)
    monkeypatch.setattr(exe, "run_step", lambda step, env: (_ for _ in ()).throw(ValueError("not a fault")))
    with pytest.raises(ValueError, match="not a fault"):
        exe._run_steps(range(len(exe.steps)), exe._feed_env(feeds), sync_each=True)


def test_the_index_check_runs_on_the_cpu_and_its_kernel_in_the_interpreter():
    # runtime/index_check.py: on a GPU one Triton kernel per index input heads the CUDA graph
    # (tests/test_runtime_gpu.py checks that a bad id stops the replay); on a CPU tensor it is
    # torch's assert, which fails at once. The kernel itself runs here in Triton's interpreter,
    # which drops device asserts, so only its launch is checked.
    from tessera.codegen.launch import use_interpreter
    from tessera.runtime.index_check import BLOCK, check_in_graph

    # Triton fixes a kernel's mode when its module is first imported: imported here under the
    # interpreter, the GPU tests that run after this one in the same process would run the check
    # interpreted, inside their captures (torch: "Cannot copy between CPU and CUDA tensors during
    # CUDA graph capture"). So the module is imported for the GPU, and the kernel wrapped here.
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        from tessera.runtime.index_check_kernel import index_in_range
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    use_interpreter(torch.device("cpu"))
    from triton.runtime.interpreter import InterpretedFunction

    ids = torch.tensor([[0, 5, -10, 9]])
    check_in_graph(ids, 10, "x")
    with pytest.raises(RuntimeError, match="outside"):
        check_in_graph(torch.tensor([[0, 10]]), 10, "x")
    # Triton chose the kernel's mode when its module was first imported: for the GPU where a GPU test ran first
    kernel = index_in_range if isinstance(index_in_range, InterpretedFunction) \
        else InterpretedFunction(index_in_range.fn)
    kernel[(1,)](ids, ids.numel(), 10, BLOCK=BLOCK)


def test_interpreted_masked_lanes_print_no_numpy_warning(tmp_path):
    """A softmax whose last row block runs past the rows: the masked rows sum to 0 and `1 / 0` gives
    inf there, unstored, as on a GPU. Triton's interpreter computes it in NumPy, which warned
    "divide by zero" to the user of `tessera run` (found on the transformers sweep, session 50)."""
    import warnings

    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 24, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 24, 24])])
    path = tmp_path / "softmax.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    run = tessera.compile(str(path), tessera.CompileOptions(cost="analytical"))
    x = torch.randn(2, 4, 24, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        (y,) = run(x)
    assert rel_l2(y.numpy(), torch.softmax(x, -1).numpy()) < 1e-6
