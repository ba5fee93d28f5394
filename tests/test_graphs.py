"""CUDA-graph capture stays quiet about empty graphs, and only about them (CPU)."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

from tessera.runtime.graphs import quiet_capture


def test_only_the_empty_graph_warning_is_silenced():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_capture():
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
        assert "quiet_capture()" in line, f"{path}: {line.strip()}"
