"""Errors that tessera shows to users.

Every error a user can cause (a bad file, an unsupported shape, a wrong
flag) is a `TesseraError`. The CLI prints its message and exits with code 2;
anything else is a bug in tessera and keeps its traceback.
"""
from __future__ import annotations


class TesseraError(Exception):
    """Base class of every error that is the user's to fix."""


class ModelLoadError(TesseraError):
    """The file cannot be read or is not a valid ONNX model."""


class MalformedModelError(TesseraError):
    """The model's graph is inconsistent: a dangling tensor, a cycle, a bad attribute."""


class ShapeError(TesseraError):
    """A shape is unknown, symbolic without an override, or contradicts another."""


class ResourceError(TesseraError):
    """The model needs more memory than the device has."""


class UnsupportedError(TesseraError):
    """A feature that tessera does not handle and cannot route to a fallback."""


def gpu_fault(e: BaseException) -> bool:
    """Is `e` the GPU faulting (an illegal address, a device-side error), whatever raised it: torch,
    Triton's launcher or a library call? After one, the process's CUDA context is lost."""
    text = f"{type(e).__name__}: {e}"
    return "CUDA error" in text or "illegal memory access" in text or "AcceleratorError" in text


def node_ref(name: str, op_type: str) -> str:
    """How every message names an ONNX node: `node 'conv_3' (Conv)`."""
    return f"node '{name}' ({op_type})"
