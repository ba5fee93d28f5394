"""Turning generated source into a launchable kernel.

Triton's `@jit` reads a kernel's source from its file, so each kernel is
written to a cache directory under a content hash and imported from there.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from tessera.codegen.kernels import KernelSource


_SET_BY_US = False


def use_interpreter(device: torch.device) -> None:
    """On a CPU, generated kernels run in Triton's interpreter (read when a kernel is loaded).

    A GPU executable made later in the same process must not inherit that choice.
    """
    global _SET_BY_US
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        _SET_BY_US = True
    elif device.type == "cuda" and _SET_BY_US:
        os.environ.pop("TRITON_INTERPRET", None)
        _SET_BY_US = False


def cache_dir() -> Path:
    """Where generated kernel files live: $TESSERA_CACHE or ~/.cache/tessera."""
    root = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
    d = root / "kernels"
    d.mkdir(parents=True, exist_ok=True)
    return d


class KernelCompileError(Exception):
    """A generated kernel failed to import or compile."""


class TritonKernel:
    """A generated kernel bound to its launch configuration."""

    def __init__(self, ks: KernelSource, directory: Path | None = None) -> None:
        self.ks = ks
        digest = hashlib.sha1(ks.source.encode()).hexdigest()[:12]
        path = (directory or cache_dir()) / f"{ks.name}_{digest}.py"
        if not path.exists():
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(ks.source)
            tmp.replace(path)  # atomic: a concurrent reader never sees half a file
        self.path = path
        spec = importlib.util.spec_from_file_location(f"tessera_kernels.{path.stem}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # a generator bug: name the kernel and what it computes
            raise KernelCompileError(f"kernel {ks.name} ({', '.join(ks.prims)}) failed to load: {e}") from e
        self.fn = getattr(module, ks.name)
        s = ks.schedule
        self.grid = (ks.grid,)
        self.meta: dict[str, Any] = {"XBLOCK": s.xblock, "RBLOCK": s.rblock, "num_warps": s.num_warps}

    def __call__(self, *tensors: torch.Tensor) -> None:
        """Launch on tensors in argument order: the inputs, then the outputs to write."""
        try:
            self.fn[self.grid](*tensors, **self.meta)
        except Exception as e:
            raise KernelCompileError(f"kernel {self.ks.name} ({', '.join(self.ks.prims)}) failed: "
                                     f"{type(e).__name__}: {e}") from e
