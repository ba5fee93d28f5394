"""CUDA-graph capture without torch's "The CUDA Graph is empty" warning.

A plan kernel that launches nothing (a view, a candidate whose work is all aliasing) captures an
empty graph. That is correct and replays as a no-op, but torch warns about it on every capture:
several times per model in a measured compile, about nothing the user can act on (issue 13).
Only that warning is silenced, and only around a capture.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

EMPTY_GRAPH_WARNING = r"The CUDA Graph is empty"


@contextlib.contextmanager
def quiet_capture() -> Iterator[None]:
    """Inside: torch's empty-graph warning is dropped; every other warning passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=EMPTY_GRAPH_WARNING, category=UserWarning)
        yield
