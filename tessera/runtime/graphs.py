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

A capture that fails anyway raises `CaptureError` (`capture`), after putting back what torch's failed
capture leaves behind; the executable turns it into a warning and a plan run launch by launch
(`Executable._capture_or_launch`) unless TESSERA_CAPTURE=strict.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
import warnings
from typing import Iterator

import torch

from tessera.errors import TesseraError

EMPTY_GRAPH_WARNING = r"The CUDA Graph is empty"
CAPTURE_ENV = "TESSERA_CAPTURE"  # "strict": a failed capture is an error, not a fallback to launches


class CaptureError(TesseraError):
    """A plan's CUDA-graph capture failed (after its warm-up had run every kernel); names the kernels
    that were being captured and CUDA's reason."""


class ContextLostError(TesseraError):
    """A capture failed and so did putting the process back: a sticky CUDA error (a kernel that
    faulted) has lost this process's CUDA context, and nothing more can run on the GPU in it."""


def raw_stream(device_index: int) -> int:
    """The handle of the current CUDA stream of GPU `device_index`, without making a Stream object (the
    private call Inductor's generated code uses; `current_stream` where a torch lacks it)."""
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return getter(device_index) if getter is not None else torch.cuda.current_stream(device_index).cuda_stream


def capture_mode_strict() -> bool:
    """Whether a failed capture raises `CaptureError` (TESSERA_CAPTURE=strict) rather than leaving
    the executable to run launch by launch."""
    mode = os.environ.get(CAPTURE_ENV, "").strip().lower()
    if mode not in ("", "strict", "fallback"):
        raise TesseraError(f"{CAPTURE_ENV}={mode!r}: expected 'strict' or 'fallback' (the default)")
    return mode == "strict"

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


@contextlib.contextmanager
def capture(graph: torch.cuda.CUDAGraph, pool: object = None, what: str = "the CUDA-graph capture") -> Iterator[None]:
    """Capture the work of the body into `graph` (inside `capture_guard`); if CUDA or torch fails
    it, raise `CaptureError` naming `what` and the reason, with the process left as before."""
    stream = torch.cuda.current_stream()
    try:
        # thread_local: another thread's allocations (cudaMalloc) and launches on its own streams
        # (a server's other requests) neither fail nor break this capture. Under torch's default
        # ("global") CUDA fails them there, "operation not permitted when stream is capturing", in
        # code that never asked for a capture, and this capture with them. A device-wide synchronize
        # fails in that thread and breaks the capture in either mode (H200, session 49).
        with capture_guard(), torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            yield
    except RuntimeError as e:
        reason = _first_line(e)
        try:
            _after_a_failed_capture(stream)
        except Exception as again:  # noqa: BLE001 - whatever CUDA raises once its context is gone
            raise ContextLostError(f"{what} failed: {reason}; putting the stream back failed too "
                                   f"({_first_line(again)}): this process's CUDA context is lost. Run the "
                                   "model in a new process; a kernel that faults is a tessera or Triton bug, "
                                   "please report it with the artifact's plan.json") from e
        raise CaptureError(f"{what} failed: {reason}") from e


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _after_a_failed_capture(stream: torch.cuda.Stream) -> None:
    """Undo what torch (2.11) leaves behind when ending a capture fails: its capture stream stays the
    thread's current stream, and the CUDA random generator stays marked as capturing, so that the
    next `torch.randn` on the GPU raises "Offset increment outside graph capture encountered
    unexpectedly". A capture that succeeds (an empty one) clears the mark."""
    torch.cuda.set_stream(stream)
    with capture_guard(), torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass
