"""CUDA-graph capture stays quiet about empty graphs, and only about them, no garbage collection
runs inside one, and a capture that fails leaves the plan running launch by launch, with a warning
(or an error under TESSERA_CAPTURE=strict). CPU tests, and GPU tests where one is visible."""
from __future__ import annotations

import contextlib
import gc
import logging
import re
import threading
import warnings
import weakref
from pathlib import Path

import pytest
import torch

import tessera
from tessera.errors import TesseraError
from tessera.runtime.executable import Executable, _PiecewiseGraph
from tessera.runtime.graphs import CaptureError, capture_guard, capture_mode_strict

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def test_only_the_empty_graph_warning_is_silenced():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with capture_guard():
            # torch's words (torch/cuda/graphs.py, capture_end) for a capture that launched nothing
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted "
                          "to be captured on wrong device or stream.", UserWarning)
            warnings.warn("something the user should see", UserWarning)
        warnings.warn("The CUDA Graph is empty. Outside a capture it still shows.", UserWarning)
    assert [str(w.message) for w in seen] == ["something the user should see",
                                              "The CUDA Graph is empty. Outside a capture it still shows."]


def test_every_capture_in_tessera_is_quiet():
    # A plan kernel of views captures nothing: each capture site must drop torch's warning.
    root = Path(__file__).resolve().parents[1] / "tessera"
    sites = [(p, line) for p in root.rglob("*.py") for line in p.read_text().splitlines()
             if re.search(r"with .*torch\.cuda\.graph\(", line)]
    assert len(sites) >= 2
    for path, line in sites:
        assert "capture_guard()" in line, f"{path}: {line.strip()}"


@pytest.mark.parametrize("enabled", [True, False])
def test_no_cyclic_collection_runs_inside_a_capture(enabled):
    # A collection inside a capture that frees another CUDA graph fails the capture (the GPU fuzzer,
    # session 48: "operation failed due to a previous error during capture"); the caller's setting returns.
    (gc.enable if enabled else gc.disable)()
    try:
        with capture_guard():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError, match="inside"), capture_guard():
            raise RuntimeError("inside")
        assert gc.isenabled() is enabled
        with capture_guard():  # overlapping captures (threads): on until the last one ends
            with capture_guard():
                pass
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_a_dropped_piecewise_executable_is_freed_without_the_collector():
    # The executable holds its piecewise graph (a plan with host steps); were the graph to hold the
    # executable back, their CUDA graphs would wait for the cyclic collector, which may run inside a
    # later capture. Dropped, both go at once.
    exe = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(cost="analytical"))
    exe(torch.randn(1, 512, 64), torch.randn(1, 64, 256), torch.randn(1, 256, 64))  # a run leaves no cycle either
    exe._graph = _PiecewiseGraph(exe, [])
    with exe.precision_flags():  # as a GPU run enters them (a class made per call closed over the executable)
        pass
    gone = weakref.ref(exe)
    gc.disable()
    try:
        del exe
        assert gone() is None
    finally:
        gc.enable()


def _g1_inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g) for s in ((1, 512, 64), (1, 64, 256), (1, 256, 64)))


def _chain_ref(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return (a.double().cpu() @ b.double().cpu()) @ d.double().cpu()


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double().cpu() - ref).norm() / ref.norm())


def _failing_capture(exe: Executable, calls: list[int]) -> None:
    def capture(feeds: object) -> None:
        calls.append(1)
        raise CaptureError("the CUDA-graph capture of 1 kernel(s) (k0) failed: operation not permitted "
                           "when stream is capturing")
    exe._capture = capture  # type: ignore[method-assign]


@pytest.mark.parametrize("entry", ["run", "bind_inputs"])
def test_a_failed_capture_leaves_the_plan_running_launch_by_launch(monkeypatch, caplog, entry):
    # What the GPU path does when CUDA fails the capture: the CPU executable is made to take it (its
    # capture replaced by one that fails), so the fallback's bookkeeping is tested without a GPU.
    monkeypatch.delenv("TESSERA_CAPTURE", raising=False)
    exe = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(cost="analytical"))
    exe.cuda_graph = True
    calls: list[int] = []
    _failing_capture(exe, calls)
    x = _g1_inputs()
    with caplog.at_level(logging.WARNING, logger="tessera"):
        if entry == "run":
            out = exe.run(*x)[exe.output_names[0]]
        else:
            feeds = exe.prepare_inputs(*x)
            bound = exe.bind_inputs(feeds)
            assert bound == feeds  # no graph, so no buffers of its own to bind
            out = exe.run_static(bound)[exe.output_names[0]]
    assert _rel(out, _chain_ref(*x)) < 1e-4
    assert exe.capture_error is not None and "k0" in exe.capture_error and not exe.cuda_graph
    assert exe.replay.startswith("launches (capture failed: the CUDA-graph capture of 1 kernel(s) (k0)")
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "launch by launch" in caplog.records[0].getMessage()
    y = _g1_inputs(1)  # later calls launch: no second capture, no second warning, fresh values
    assert _rel(exe.run(*y)[exe.output_names[0]], _chain_ref(*y)) < 1e-4
    assert len(calls) == 1 and len(caplog.records) == 1


def test_a_failed_capture_is_an_error_when_strict(monkeypatch):
    monkeypatch.setenv("TESSERA_CAPTURE", "strict")
    exe = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(cost="analytical"))
    exe.cuda_graph = True
    _failing_capture(exe, [])
    with pytest.raises(CaptureError, match=r"capture of 1 kernel\(s\) \(k0\) failed"):
        exe.run(*_g1_inputs())
    assert exe.capture_error is None


def _capture_mocks(monkeypatch, fail_recovery: bool) -> list[object]:
    """torch.cuda as `graphs.capture` sees it on a machine whose kernel faulted: the capture fails with
    CUDA's fault; the recovery's set_stream fails as well when the error is sticky."""
    from tessera.runtime import graphs

    fault = "CUDA error: an illegal memory access was encountered\nCompile with TORCH_USE_CUDA_DSA"
    tries: list[object] = []

    @contextlib.contextmanager
    def graph(g: object, *args: object, **kwargs: object):
        tries.append(g)
        if len(tries) == 1:  # the plan's capture; the recovery's empty one succeeds
            raise RuntimeError(fault)
        yield

    def set_stream(stream: object) -> None:
        if fail_recovery:
            raise RuntimeError(fault)
        tries.append(stream)

    monkeypatch.setattr(graphs.torch.cuda, "current_stream", lambda *a: "the caller's stream")
    monkeypatch.setattr(graphs.torch.cuda, "graph", graph)
    monkeypatch.setattr(graphs.torch.cuda, "CUDAGraph", lambda: "an empty graph")
    monkeypatch.setattr(graphs.torch.cuda, "set_stream", set_stream)
    return tries


def test_a_capture_whose_recovery_fails_says_the_context_is_lost(monkeypatch):
    """A fault is sticky: putting the stream back fails too. That is not a CaptureError (the plan
    cannot fall back to launches in a lost context) but an error that says to start a new process."""
    from tessera.runtime import graphs

    tries = _capture_mocks(monkeypatch, fail_recovery=False)
    with pytest.raises(CaptureError, match=r"^k0's capture failed: CUDA error: an illegal memory access"):
        with graphs.capture("the plan's graph", what="k0's capture"):
            pass
    assert tries == ["the plan's graph", "the caller's stream", "an empty graph"]
    _capture_mocks(monkeypatch, fail_recovery=True)
    with pytest.raises(graphs.ContextLostError) as lost:
        with graphs.capture("the plan's graph", what="k0's capture"):
            pass
    assert not isinstance(lost.value, CaptureError)
    assert "putting the stream back failed too (CUDA error" in str(lost.value)
    assert "context is lost. Run the model in a new process" in str(lost.value)


def test_the_capture_setting_is_checked(monkeypatch):
    monkeypatch.setenv("TESSERA_CAPTURE", "Strict ")
    assert capture_mode_strict()
    monkeypatch.setenv("TESSERA_CAPTURE", "fallback")
    assert not capture_mode_strict()
    monkeypatch.setenv("TESSERA_CAPTURE", "off")
    with pytest.raises(TesseraError, match="TESSERA_CAPTURE='off': expected 'strict' or 'fallback'"):
        capture_mode_strict()


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _gpu_g1() -> Executable:
    exe = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(cost="analytical"), device="cuda")
    assert exe.cuda_graph
    return exe


def _other_thread_work(kind: str) -> None:
    if kind == "synchronize":
        torch.cuda.synchronize()
    else:  # a new allocation (cudaMalloc), a launch on its own stream, and a wait on that stream
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.empty(int(1.9e8), device="cuda").fill_(1.0)
        s.synchronize()


@gpu
def test_a_gpu_executable_reads_the_capture_setting_when_made(monkeypatch):
    monkeypatch.setenv("TESSERA_CAPTURE", "off")
    with pytest.raises(TesseraError, match="TESSERA_CAPTURE='off'"):
        _gpu_g1()


@gpu
@pytest.mark.parametrize("kind", ["allocate_and_launch", "synchronize"])
def test_another_threads_work_during_a_capture(monkeypatch, caplog, kind):
    # A server's other thread works on the GPU while tessera captures (H200, session 49,
    # scripts/results/bench/session49/capture_modes.py). Its allocations and launches on its own
    # stream neither fail nor break the capture, because the capture is thread_local: under torch's
    # default mode ("global") CUDA fails both. A device-wide synchronize fails there in either mode
    # and breaks the capture: the plan then runs launch by launch with the same results, and the
    # capturing thread keeps its stream and a working random generator.
    monkeypatch.delenv("TESSERA_CAPTURE", raising=False)
    exe = _gpu_g1()
    inside, done = threading.Event(), threading.Event()
    errors: list[str] = []

    def other() -> None:
        inside.wait(60)
        try:
            _other_thread_work(kind)
        except RuntimeError as e:
            errors.append(str(e).splitlines()[0])
        done.set()

    real = Executable.launch_index_checks

    def checks(self: Executable, feeds: object) -> None:  # runs inside the first graph's capture
        inside.set()
        assert done.wait(60)
        real(self, feeds)

    monkeypatch.setattr(Executable, "launch_index_checks", checks)
    t = threading.Thread(target=other)
    t.start()
    x = tuple(v.cuda() for v in _g1_inputs())
    stream = torch.cuda.current_stream()
    try:
        with caplog.at_level(logging.WARNING, logger="tessera"):
            out = exe.run(*x)[exe.output_names[0]]
    finally:
        inside.set()
        t.join()
    assert _rel(out, _chain_ref(*x)) < 1e-3
    assert torch.cuda.current_stream() == stream and torch.randn(8, device="cuda").isfinite().all()
    if kind == "synchronize":
        assert errors and "not permitted when stream is capturing" in errors[0], errors
        assert exe.replay.startswith("launches (capture failed") and len(caplog.records) == 1
    else:
        assert errors == [] and exe.replay == "cuda graph" and exe.capture_error is None
        y = tuple(v.cuda() for v in _g1_inputs(1))  # the captured graph replays fresh inputs
        assert _rel(exe.run(*y)[exe.output_names[0]], _chain_ref(*y)) < 1e-3


@gpu
def test_a_capture_that_cuda_fails_falls_back_and_the_next_one_captures(monkeypatch, caplog):
    # The capturing thread itself synchronizes inside the capture, which CUDA forbids: the capture
    # fails, the plan runs launch by launch with the same results, and CUDA is left usable: a new
    # executable captures and replays.
    monkeypatch.delenv("TESSERA_CAPTURE", raising=False)
    exe = _gpu_g1()
    real = Executable.launch_index_checks

    def checks(self: Executable, feeds: object) -> None:
        torch.cuda.synchronize()
        real(self, feeds)

    monkeypatch.setattr(Executable, "launch_index_checks", checks)
    x = tuple(v.cuda() for v in _g1_inputs())
    stream = torch.cuda.current_stream()
    with caplog.at_level(logging.WARNING, logger="tessera"):
        out = exe.run(*x)[exe.output_names[0]]
    assert exe.capture_error is not None and "capture of" in exe.capture_error, exe.capture_error
    # What torch leaves behind is put back: the caller's stream, and a random generator that works
    # (torch leaves it marked as capturing: "Offset increment outside graph capture").
    assert torch.cuda.current_stream() == stream
    assert torch.randn(8, device="cuda").isfinite().all()
    assert exe.replay.startswith("launches (capture failed") and len(caplog.records) == 1
    assert _rel(out, _chain_ref(*x)) < 1e-3
    y = tuple(v.cuda() for v in _g1_inputs(1))
    assert _rel(exe.run(*y)[exe.output_names[0]], _chain_ref(*y)) < 1e-3
    monkeypatch.setattr(Executable, "launch_index_checks", real)
    again = _gpu_g1()
    assert _rel(again.run(*y)[again.output_names[0]], _chain_ref(*y)) < 1e-3
    assert again.replay == "cuda graph" and again.capture_error is None
    monkeypatch.setattr(Executable, "launch_index_checks", checks)
    monkeypatch.setenv("TESSERA_CAPTURE", "strict")
    with pytest.raises(CaptureError, match="capture of"):
        _gpu_g1().run(*y)


def _host_step_model() -> bytes:
    """Relu, then Atan (opaque: onnxruntime on the host), then Exp and an Add: a plan captured as two
    CUDA graphs with a host step between them."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Atan", ["a"], ["b"]),
             helper.make_node("Exp", ["b"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    g = helper.make_graph(nodes, "host_step", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@gpu
def test_a_piecewise_capture_whose_second_graph_fails_falls_back(monkeypatch, caplog):
    # The first graph captures, the host step runs, the second graph's capture fails: the whole plan
    # runs launch by launch, host step included, and matches a float64 reference.
    monkeypatch.delenv("TESSERA_CAPTURE", raising=False)
    exe = tessera.compile(_host_step_model(), tessera.CompileOptions(cost="analytical"), device="cuda")
    segments = exe._segments()
    assert [host for host, _ in segments] == [False, True, False], segments
    last = segments[-1][1]
    real = Executable._run_steps

    def run_steps(self: Executable, steps: object, *args: object, **kwargs: object) -> object:
        if torch.cuda.is_current_stream_capturing() and list(steps) == last:  # type: ignore[call-overload]
            torch.cuda.synchronize()
        return real(self, steps, *args, **kwargs)

    monkeypatch.setattr(Executable, "_run_steps", run_steps)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    xd = x.double()
    ref = torch.exp(torch.atan(torch.relu(xd))) + xd
    with caplog.at_level(logging.WARNING, logger="tessera"):
        out = exe.run(x.cuda())[exe.output_names[0]]
    assert exe.replay.startswith("launches (capture failed: the CUDA-graph capture of 1 kernel(s)"), exe.replay
    assert _rel(out, ref) < 1e-5 and len(caplog.records) == 1
    assert torch.randn(8, device="cuda").isfinite().all()
    y = torch.randn(4, 64, generator=torch.Generator().manual_seed(4))
    yd = y.double()
    assert _rel(exe.run(y.cuda())[exe.output_names[0]], torch.exp(torch.atan(torch.relu(yd))) + yd) < 1e-5
