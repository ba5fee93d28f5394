"""Executables called from several threads: each call gets its own results. Every call of an
executable writes the same buffers (and on a GPU replays one captured graph), so calls take turns
(`Executable.exclusive`); on the CPU, Triton's interpreter keeps process-wide launch state, so two
executables' kernels take turns too (`codegen/launch.py`). CPU tests, and one GPU test."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import tessera
from tessera.frontend import load
from tessera.verify import random_inputs, run_onnxruntime

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def _inputs(seed: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(device) for s in ((1, 512, 64), (1, 64, 256), (1, 256, 64)))


def _rel_to_chain(out: torch.Tensor, x: tuple[torch.Tensor, ...]) -> float:
    a, b, d = (v.double().cpu() for v in x)
    ref = (a @ b) @ d
    return float((out.double().cpu() - ref).norm() / ref.norm())


def _in_threads(work: Callable[[int], float], n: int) -> list[float]:
    """Run work(i) for i < n in n threads that start together; their results (or raise the first error)."""
    start = threading.Barrier(n)
    results: list[float | BaseException] = [0.0] * n

    def go(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            results[i] = e

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [float(r) for r in results]  # type: ignore[arg-type]


def _bert_cases(n: int) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """n random inputs of bert_tiny (token ids) and onnxruntime's outputs for them."""
    loaded = load(MODELS / "bert_tiny.onnx")
    feeds = [random_inputs(loaded.graph, seed) for seed in range(n)]
    refs = [next(iter(run_onnxruntime(loaded.model, f).values())) for f in feeds]
    return feeds, refs


def _rel(out: torch.Tensor, ref: np.ndarray) -> float:
    got = out.double().cpu().numpy()
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def test_threads_calling_one_executable_get_their_own_results():
    # bert_tiny: 16 generated kernels writing the plan's shared buffers between 16 library calls.
    exe = tessera.compile(MODELS / "bert_tiny.onnx", tessera.CompileOptions(cost="analytical"))
    feeds, refs = _bert_cases(8)

    def work(i: int) -> float:
        return max(_rel(exe(**{k: torch.from_numpy(v) for k, v in feeds[j].items()})[0], refs[j])
                   for j in (i, i + 4))

    assert max(_in_threads(work, 4)) < 1e-4


def test_threads_calling_two_executables_on_the_cpu_get_their_own_results():
    # Two plans of one model, so that both run generated kernels in the interpreter at once.
    opts = tessera.CompileOptions(cost="analytical")
    exes = [tessera.compile(MODELS / "bert_tiny.onnx", opts) for _ in range(2)]
    feeds, refs = _bert_cases(4)

    def work(i: int) -> float:
        return max(_rel(exes[i](**{k: torch.from_numpy(v) for k, v in feeds[j].items()})[0], refs[j])
                   for j in (i, i + 2))

    assert max(_in_threads(work, 2)) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_threads_on_their_own_streams_replay_one_graph_in_turn():
    # Each thread calls on a CUDA stream of its own. The lock passes between threads before their
    # streams' copies out of the graph's buffers have run, so each call first waits on the GPU for the
    # previous caller's stream.
    exe = tessera.compile(MODELS / "gemm_g1.onnx", tessera.CompileOptions(cost="analytical"), device="cuda")

    def work(i: int) -> float:
        stream = torch.cuda.Stream()
        worst = 0.0
        with torch.cuda.stream(stream):
            for k in range(20):
                x = _inputs(100 * i + k, "cuda")
                out = exe(*x)[0]
                stream.synchronize()
                worst = max(worst, _rel_to_chain(out, x))
        return worst

    assert max(_in_threads(work, 4)) < 1e-3
    assert exe.replay == "cuda graph"


def test_threads_meeting_one_new_shape_compile_it_once(monkeypatch):
    """The backend's per-shape plans and bucketed plans: two threads that call with one new shape at
    once used to compile it twice (the result right, the time doubled). Now one compiles, the other
    waits and uses that plan."""
    from tessera import torch_backend
    from tessera.torch_dynamic import BucketedModule

    compiles: list[tuple] = []
    started = threading.Event()

    def slow_compile(*args, **kwargs):
        compiles.append(args)
        started.set()
        threading.Event().wait(0.3)  # long enough that the other thread arrives meanwhile
        return lambda *xs: xs[0] * 2

    monkeypatch.setattr(torch_backend, "compile_module", slow_compile)
    per_shape = torch_backend.PerShape(None, None, set(), "g")
    bucketed = BucketedModule(None, [], "g", lambda padded: slow_compile(padded))
    for module in (per_shape, bucketed):
        compiles.clear()
        started.clear()
        x = torch.ones(3)
        out: list[torch.Tensor] = []
        threads = [threading.Thread(target=lambda: out.append(module(x))) for _ in range(2)]
        threads[0].start()
        started.wait(5)
        threads[1].start()
        for t in threads:
            t.join(10)
        assert len(compiles) == 1, type(module).__name__
        assert len(out) == 2 and all(torch.equal(o, x * 2) for o in out)
