"""Turning generated source into a launchable kernel.

Triton's `@jit` reads a kernel's source through `inspect` (at decoration on a GPU, at the first
launch in the interpreter), and names it by file and line. Each kernel is written to the kernel
cache (`tessera/cache.py`: a content hash names the file; the folder is capped, least recently
used files evicted) and run from the source held in memory, registered in `linecache` under the
file's name: a file that another process evicts or clears, even before this one loaded it, breaks
nothing, and the next load writes it again.
"""
from __future__ import annotations

import hashlib
import linecache
import os
import threading
import types
import weakref
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tessera import cache
from tessera.errors import TesseraError
from tessera.codegen.interpreter import match_gpu_semantics
from tessera.codegen.kernels import KernelSource, Schedule


_SET_BY_US = False
_INTERPRETER_LOCK = threading.Lock()


@contextmanager
def _interpreted() -> Any:
    """Around an interpreted launch. Triton's interpreter keeps the launch's grid in process-wide
    state, so two threads' kernels (two executables' on the CPU) must not interleave. And its NumPy
    arithmetic warns where a GPU computes silently: lanes a mask leaves unstored (a softmax row past
    the tensor's end sums to 0, and `1 / 0` is inf) would print "divide by zero" to a user."""
    with _INTERPRETER_LOCK, np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        yield


def use_interpreter(device: torch.device) -> None:
    """On a CPU, generated kernels run in Triton's interpreter (read when a kernel is loaded).

    A GPU executable made later in the same process must not inherit that choice. One that the
    user's environment sets is refused for a GPU: Triton would run every kernel on the host,
    copying each tensor there and back, which fails inside a CUDA graph with torch's "Cannot copy
    between CPU and CUDA tensors during CUDA graph capture", naming neither the cause nor the fix.
    """
    global _SET_BY_US
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        _remember_language()
        os.environ["TRITON_INTERPRET"] = "1"
        _SET_BY_US = True
    elif device.type == "cuda" and _SET_BY_US:
        os.environ.pop("TRITON_INTERPRET", None)
        _SET_BY_US = False
        _restore_language()
        _language_for(interpreted=False)  # Triton's own functions as GPU functions again
    elif device.type == "cuda" and os.environ.get("TRITON_INTERPRET") == "1":
        raise TesseraError("TRITON_INTERPRET=1 is set, so Triton would run tessera's kernels on the CPU "
                           "interpreter; unset it to run on the GPU")
    if device.type == "cpu":  # after the switch: it imports Triton's interpreter
        _language_for(interpreted=True)
        match_gpu_semantics()  # the interpreter as the GPU computes: bf16 rounding, boolean masks


# triton.language as it stood before this process first ran the interpreter: (object, its attributes).
_PRISTINE: list[tuple[Any, dict[str, Any]]] = []
_RESTORED_DUNDERS = ("__repr__", "__str__", "__index__", "__bool__")


def _remember_language() -> None:
    """Record triton.language's modules and core classes once, before the first interpreted run.

    The interpreter swaps Triton's builtins for its own while a kernel runs and puts them back after,
    but a jit function called from a kernel (tl.sum, a kernel's own helpers) swaps them in the modules
    it sees and never puts them back (Triton 3.9: 64 of triton.language.core's names). A GPU build in
    the same process then fails ("'block_argument' object has no attribute 'dtype'")."""
    if _PRISTINE or os.environ.get("TRITON_INTERPRET") == "1":
        return
    import inspect

    import triton.language as tl

    objects: list[Any] = [tl, tl.core, tl.math]
    objects += [v for v in vars(tl.core).values()
                if inspect.isclass(v) and getattr(v, "__module__", "").startswith("triton.language")]
    _PRISTINE.extend((o, dict(vars(o))) for o in objects)


def _restore_language() -> None:
    """Put back what interpreted runs left swapped (`_remember_language`)."""
    for obj, attrs in _PRISTINE:
        now = vars(obj)
        for name in [n for n in now if n not in attrs and (not n.startswith("__") or n in _RESTORED_DUNDERS)]:
            delattr(obj, name)
        for name, value in attrs.items():
            if now.get(name) is not value and (not name.startswith("__") or name in _RESTORED_DUNDERS):
                setattr(obj, name, value)


def _language_for(interpreted: bool) -> None:
    """Triton's language functions written in Triton (tl.sum, tl.max, tl.cdiv, ...) are decorated
    once, when triton.language is imported: as interpreted functions only if TRITON_INTERPRET was
    set by then. `import torch._dynamo` imports Triton, so in a process that used torch.compile
    (tessera's dynamo backend among them) they are GPU functions, and the interpreter refuses to
    call them ("Cannot call @triton.jit'd outside of the scope of a kernel"); after a CPU run they
    are interpreted functions, and a GPU compile fails (Triton 3.9: an assertion importing Gluon).
    Re-import those modules with the variable as it now stands."""
    import importlib
    import sys

    std = sys.modules.get("triton.language.standard")
    if std is None:
        return  # not imported yet: it will be decorated for the mode in force
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(getattr(std, "sum", None), InterpretedFunction) == interpreted:
        return
    for name in ("triton.language.standard", "triton.language.math", "triton.language.random", "triton.language"):
        importlib.reload(sys.modules[name])


def cache_dir() -> Path:
    """Where generated kernel files live: $TESSERA_CACHE/kernels (default ~/.cache/tessera/kernels)."""
    return cache.kernel_dir()


# Sources registered in linecache, by file name, with the number of live kernels that need them:
# the entry goes when the last kernel loaded from it does (tuning workers load thousands).
_lines_lock = threading.Lock()
_lines_refs: dict[str, int] = {}


def _hold_source(filename: str, source: str) -> None:
    with _lines_lock:
        _lines_refs[filename] = _lines_refs.get(filename, 0) + 1
        # mtime None: linecache.checkcache never drops it for a missing or changed file.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def _release_source(filename: str) -> None:
    with _lines_lock:
        n = _lines_refs.get(filename, 0) - 1
        if n > 0:
            _lines_refs[filename] = n
            return
        _lines_refs.pop(filename, None)
        entry = linecache.cache.get(filename)
        if entry is not None and len(entry) == 4 and entry[1] is None:
            del linecache.cache[filename]


# Whether PDL is on where TESSERA_PDL is unset. On since session 61: llama fp16 on an H100, one plan
# replayed with and without it, computed the same bits and took 323 against 343 µs per call
# (scripts/pdl_ab.py; scripts/results/bench/session61/).
PDL_DEFAULT = True


def pdl_requested() -> bool:
    """TESSERA_PDL=1 (or unset, with `PDL_DEFAULT`); TESSERA_PDL=0 turns PDL off, to compare."""
    return os.environ.get("TESSERA_PDL", "1" if PDL_DEFAULT else "0") != "0"


def pdl_supported(device: torch.device) -> bool:
    """Whether generated kernels on `device` launch with programmatic dependent launch: where it is
    requested, on a GPU of compute capability 9.0 or later (Hopper)."""
    return device.type == "cuda" and pdl_requested() and torch.cuda.get_device_capability(device)[0] >= 9


class KernelCompileError(Exception):
    """A generated kernel failed to import or compile."""


class TritonKernel:
    """A generated kernel bound to its launch configuration."""

    def __init__(self, ks: KernelSource, directory: Path | None = None) -> None:
        self.ks = ks
        digest = hashlib.sha1(ks.source.encode()).hexdigest()[:12]
        path = cache.store(f"{ks.name}_{digest}.py", ks.source, directory)
        self.path = path
        filename = str(path)
        module = types.ModuleType(f"tessera_kernels.{path.stem}")
        module.__file__ = filename
        _hold_source(filename, ks.source)
        weakref.finalize(self, _release_source, filename)
        try:
            exec(compile(ks.source, filename, "exec"), module.__dict__)
        except Exception as e:  # a generator bug: name the kernel and what it computes
            raise KernelCompileError(f"kernel {ks.name} ({', '.join(ks.prims)}) failed to load: {e}") from e
        self.fn = getattr(module, ks.name)
        # (function, grid, meta) per launch: one for a generated kernel, one or two for a template.
        self.launches: list[tuple[Any, tuple[int, ...], dict[str, Any]]] = []
        if ks.launches:
            self.launches = [(getattr(module, ln.fn), ln.grid, dict(ln.meta)) for ln in ks.launches]
        else:
            s = ks.schedule
            assert isinstance(s, Schedule)
            self.launches = [(self.fn, (ks.grid,), {"XBLOCK": s.xblock, "RBLOCK": s.rblock, "num_warps": s.num_warps})]
        self.workspace: torch.Tensor | None = None  # split-K partial sums: allocated at the first launch
        # Launched with programmatic dependent launch (the executable sets it where `pdl_supported`,
        # the profiler's timing executables too, so a candidate is timed as it runs in the model and
        # its binary is the one the model's executable loads): the kernel's PDL prologue is compiled
        # in, and the next kernel may launch while this one runs (1), or as it ends (2: the next one's
        # schedule launches late, `runtime/executable.pdl_modes`); 0 (False): launched without PDL.
        self.pdl: int = 0

    def __call__(self, *tensors: torch.Tensor) -> None:
        """Launch on tensors in argument order: the inputs, then the outputs to write (a kernel with a
        workspace gets it between the two; it is allocated once, before any CUDA graph capture,
        since every executable launches once before it captures)."""
        args = self._arguments(tensors, launch=True)
        with _interpreted() if os.environ.get("TRITON_INTERPRET") == "1" else nullcontext():
            self._each_launch(lambda fn, grid, meta: fn[grid](*args, **meta))

    def compile_only(self, *tensors: torch.Tensor) -> None:
        """Compile every launch for these arguments (as `__call__` takes them) without running
        anything on the GPU: the profiler's builders compile in parallel while another process
        times kernels, and take the GPU only to run what they compiled. The arguments' contents
        are never read (`torch.empty` will do); the first real launch finds the binary compiled."""
        args = self._arguments(tensors, launch=False)
        self._each_launch(lambda fn, grid, meta: fn.warmup(*args, grid=grid, **meta))

    def _arguments(self, tensors: tuple[torch.Tensor, ...], launch: bool) -> list[torch.Tensor]:
        """The kernel's arguments: the tensors, with the workspace between inputs and outputs. A
        launch allocates the kept, zeroed workspace (a split chain's arrival counters start at 0,
        and its last program resets them); a compile only needs one of its type and place."""
        args = list(tensors)
        if self.ks.workspace:
            dev = tensors[0].device
            ws = self.workspace
            if ws is None or ws.device != dev:
                ws = (torch.zeros if launch else torch.empty)(self.ks.workspace, dtype=torch.float32, device=dev)
                if launch:
                    self.workspace = ws
            args.insert(len(self.ks.inputs), ws)
        return args

    def _each_launch(self, go: Any) -> None:
        try:
            for fn, grid, meta in self.launches:
                # launch_pdl is a compile option too (a binary of its own), so a warmup compiles what runs
                go(fn, grid, {**meta, "PDL": int(self.pdl), "launch_pdl": True} if self.pdl else meta)
        except Exception as e:
            raise KernelCompileError(f"kernel {self.ks.name} ({', '.join(self.ks.prims)}) failed: "
                                     f"{type(e).__name__}: {e}") from e
