"""What every CUDA-graph capture in tessera runs inside (`capture_guard`).

- No "The CUDA Graph is empty" warning. A plan kernel that launches nothing (a view, a candidate
  whose work is all aliasing) captures an empty graph. That is correct and replays as a no-op, but
  torch warns about it on every capture: several times per model in a measured compile, about
  nothing the user can act on (issue 13). Only that warning is silenced.
- No cyclic garbage collection. Python's collector runs whenever enough objects have been
  allocated, which a capture does. If it then frees an unreachable CUDA graph (an earlier
  executable's, a user's), torch destroys that graph inside the capture, which CUDA forbids
  ("operation not permitted when stream is capturing"), and the capture fails: "operation failed
  due to a previous error during capture" (the GPU fuzzer, session 48). torch's `graph` context
  collects before a capture only where `force_cudagraph_gc` is set; tessera holds the collector off
  for the capture's length instead, which costs nothing, and restores it after.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import warnings
from typing import Iterator

EMPTY_GRAPH_WARNING = r"The CUDA Graph is empty"

# Captures in several threads overlap: the collector comes back when the last of them ends.
_lock = threading.Lock()
_open = 0
_was_enabled = False


@contextlib.contextmanager
def capture_guard() -> Iterator[None]:
    """Inside: torch's empty-graph warning is dropped (every other warning passes) and the cyclic
    garbage collector does not run; when the last open guard ends, the collector is back as it was."""
    global _open, _was_enabled
    with _lock:
        if _open == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _open += 1
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=EMPTY_GRAPH_WARNING, category=UserWarning)
            yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0 and _was_enabled:
                gc.enable()
