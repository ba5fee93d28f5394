"""What a graph's integer inputs may hold: the index ranges its gathers imply.

Works on operator graphs (ONNX op types) and primitive graphs (`Prim` values) alike. A token id
past an embedding's size is no error to a GPU gather, which reads whatever memory is there
(GPT-2 then returns NaN); onnxruntime rejects it, and so does tessera, before running.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from tessera.errors import ShapeError
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph

_GATHERS = {"Gather", "GatherElements", "gather", "gather_elements"}
# Ops whose output holds the same index values as their input, rearranged.
_INDEX_PRESERVING = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Slice",
                     "Transpose", "Concat", "Tile", "cast", "reshape", "slice", "transpose", "concat", "broadcast"}


def index_bounds(graph: Graph) -> dict[str, int]:
    """For each integer graph input used as gather indices, the size it indexes (the smallest if several)."""
    consumers = graph.consumers()
    bounds: dict[str, int] = {}
    for name in graph.inputs:
        if graph.types[name].dtype.is_float or graph.types[name].dtype is DType.BOOL:
            continue
        best: int | None = None
        todo, seen = [name], set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for n in consumers.get(t, []):
                if n.op in _GATHERS and len(n.inputs) > 1 and n.inputs[1] == t:
                    data = graph.types[n.inputs[0]]
                    axis = int(n.attrs.get("axis", 0)) % max(data.rank, 1)
                    best = data.shape[axis] if best is None else min(best, data.shape[axis])
                elif n.op in _INDEX_PRESERVING:
                    todo.extend(o for o in n.outputs if o)
        if best is not None:
            bounds[name] = best
    return bounds


def check_feeds(graph: Graph, feeds: Mapping[str, Any], bounds: Mapping[str, int] | None = None,
                device_checked: bool = False) -> None:
    """Raise ShapeError for an input of the wrong kind (floats for integer indices, integers for
    floats, anything for booleans but booleans) or holding an index out of its gather's range.
    `bounds` is `index_bounds(graph)` where the caller keeps it (it walks the whole graph).
    `device_checked`: GPU tensors' ranges are left to the caller's CUDA graph, which checks its own
    input buffers (`runtime/index_check.py`)."""
    unknown = sorted(set(feeds) - set(graph.inputs))
    missing = [t for t in graph.inputs if t not in feeds]
    if unknown or missing:
        raise ShapeError(f"the model takes inputs {list(graph.inputs)}; "
                         + (f"unknown: {unknown}" if unknown else "") + ("; " if unknown and missing else "")
                         + (f"missing: {missing}" if missing else ""))
    for name, v in feeds.items():
        want = graph.types[name].dtype
        kind = "float" if want.is_float else "bool" if want is DType.BOOL else "integer"
        if _kind(v) != kind:
            raise ShapeError(f"input '{name}' holds {_dtype_name(v)} values; the model takes {want.value}")
    for name, n in (index_bounds(graph) if bounds is None else bounds).items():
        v = feeds.get(name)
        if v is None or not _numel(v):
            continue
        if getattr(v, "is_cuda", False):  # a GPU tensor: checked on the GPU, no wait for it
            if not device_checked:
                assert_in_range_async(v, n, name)
            continue
        check_range_now(v, n, name)


def check_range_now(v: Any, n: int, name: str) -> None:
    """ShapeError, naming the input, if `v` holds an index outside [-n, n) (reads a GPU tensor's
    bounds back: one wait)."""
    if not _numel(v):
        return
    lo, hi = int(v.min()), int(v.max())
    if lo < -n or hi >= n:
        bad = hi if hi >= n else lo
        raise ShapeError(f"input '{name}' holds index {bad}, outside [{-n}, {n}): the size of the dim it "
                         f"gathers from")


def assert_in_range_async(v: Any, n: int, name: str) -> None:
    """Check a torch tensor's indices against [-n, n) where it lives, as PyTorch's own gathers do:
    reading the bounds back would make every call wait for the GPU to finish the call before (no
    overlap of the host's next call with the GPU's work; not timed here). An index out of range
    stops the stream with a device-side assert, which the next synchronization reports, before
    any kernel reads past the end (a CPU tensor fails at once, with the same message)."""
    import torch

    ok = ((v >= -n) & (v < n)).all()
    torch._assert_async(ok, f"input '{name}' holds an index outside [{-n}, {n}): the size of the dim it gathers from")


def _dtype(v: Any) -> Any:
    return v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype


def _dtype_name(v: Any) -> str:
    return str(_dtype(v)).replace("torch.", "")


def _kind(v: Any) -> str:
    """float, integer or bool, for a NumPy array or a torch tensor, without copying it."""
    dt = _dtype(v)
    if isinstance(dt, np.dtype):
        return {"f": "float", "b": "bool", "i": "integer", "u": "integer"}.get(dt.kind, dt.kind)
    if dt.is_floating_point or dt.is_complex:  # a torch.dtype (ir does not import torch)
        return "float" if dt.is_floating_point else "complex"
    return "bool" if str(dt) == "torch.bool" else "integer"


def _numel(v: Any) -> int:
    return int(v.numel()) if callable(getattr(v, "numel", None)) else int(np.asarray(v).size)
