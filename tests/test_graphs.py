"""CUDA-graph capture stays quiet about empty graphs, and only about them, and no garbage
collection runs inside one (CPU)."""
from __future__ import annotations

import gc
import re
import warnings
import weakref
from pathlib import Path

import pytest
import torch

import tessera
from tessera.runtime.executable import _PiecewiseGraph
from tessera.runtime.graphs import capture_guard

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
