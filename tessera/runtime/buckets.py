"""Shape buckets (issue 16): one artifact holds a plan per bucket of dynamic sizes.

A dynamic dimension (`DynamicDim`) is a symbol, such as "batch" or "seq", that one or more inputs
carry on one axis each. The compile chose its buckets (powers of two by default) and compiled one
static plan per combination of buckets. A call:
1. reads each symbol's size from the inputs (every input that carries it must agree);
2. picks, per symbol, the smallest bucket that holds the size;
3. pads each input with zeros up to the bucket (a copy into the plan's input buffers, which a
   CUDA-graph replay makes anyway);
4. runs that bucket's plan and cuts every output back to the call's sizes.

Padding is used only for a symbol whose compile checked, against the reference, that zero padding
leaves the real part of every output unchanged (`DynamicDim.pad`). A causal decoder's sequence and
any batch pass that check; a bidirectional encoder's sequence without an attention-mask input does
not, and then only the bucket sizes themselves run. Each bucket is an ordinary artifact in its own
folder; `buckets.json` lists them, sealed like `artifact.json`. A bucket's executable is built at its
first call (`warmup` builds them all).

    OUT/buckets.json          symbols, their uses and buckets, output axes, the padding checks
    OUT/bucket_seq32/...      one artifact per bucket (plan.json, kernels, model.onnx, artifact.json)
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from tessera.errors import ModelLoadError, ShapeError
from tessera.runtime.artifact import load_artifact
from tessera.runtime.executable import Executable
from tessera.version import __version__

FORMAT = 1
MANIFEST = "buckets.json"


@dataclass(frozen=True)
class DynamicDim:
    """A dynamic size: `symbol`, carried by each (input, axis) of `uses`, compiled for `buckets`
    (ascending) and accepted from `low` up to the largest bucket. Without `pad`, only the bucket
    sizes themselves run."""
    symbol: str
    uses: tuple[tuple[str, int], ...]
    buckets: tuple[int, ...]
    low: int
    pad: bool = True

    @property
    def high(self) -> int:
        return self.buckets[-1]

    def inside(self, bucket: int) -> int:
        """A size that runs padded into `bucket` (`size_inside`; `bucket` itself where this dim does not pad)."""
        return size_inside(self.buckets, self.low, bucket) if self.pad else bucket

    def bucket_for(self, size: int) -> int:
        """The smallest bucket that holds `size`; a ShapeError names the input, axis and range."""
        name, axis = self.uses[0]
        if size < self.low or size > self.high:
            raise ShapeError(f"input '{name}' axis {axis} ({self.symbol}) is {size}; this artifact runs "
                             f"{self.low}..{self.high} (compile with a wider --dynamic range)")
        if not self.pad and size not in self.buckets:
            raise ShapeError(f"input '{name}' axis {axis} ({self.symbol}) is {size}; this artifact runs only "
                             f"the sizes {list(self.buckets)}, since zero padding changes the model's outputs "
                             "along it (tessera compile checked)")
        return next(b for b in self.buckets if b >= size)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "DynamicDim":
        return DynamicDim(d["symbol"], tuple((u[0], int(u[1])) for u in d["uses"]), tuple(int(b) for b in d["buckets"]),
                          int(d["low"]), bool(d["pad"]))


def power_of_two_buckets(low: int, high: int) -> tuple[int, ...]:
    """Powers of two from the one that holds `low` up to below `high`, then `high` itself."""
    if low < 1 or high < low:
        raise ValueError(f"a dynamic range needs 1 <= MIN <= MAX, got {low}..{high}")
    b, out = 1, []
    while b < low:
        b *= 2
    while b < high:
        out.append(b)
        b *= 2
    return (*out, high)


def size_inside(buckets: Sequence[int], low: int, bucket: int) -> int:
    """A size that runs padded into `bucket`: halfway from the bucket below (or from `low`), or
    `bucket` itself where no size lies between them."""
    i = list(buckets).index(bucket)
    below = buckets[i - 1] if i else low - 1
    return (below + 1 + bucket) // 2 if bucket - below >= 2 else bucket


def bucket_keys(dims: Sequence[DynamicDim]) -> list[tuple[int, ...]]:
    """Every combination of the dims' buckets, in order."""
    keys: list[tuple[int, ...]] = [()]
    for d in dims:
        keys = [k + (b,) for k in keys for b in d.buckets]
    return keys


def bucket_dir(dims: Sequence[DynamicDim], key: Sequence[int]) -> str:
    """The folder name of one bucket: bucket_batch4_seq128 (symbols reduced to safe characters)."""
    parts = ["".join(c if c.isalnum() else "-" for c in d.symbol) + str(b) for d, b in zip(dims, key)]
    return "bucket_" + "_".join(parts)


def sizes_of(dims: Sequence[DynamicDim], shapes: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
    """Each symbol's size in a call, from the inputs that carry it (all must agree)."""
    sizes = []
    for d in dims:
        seen = {(name, axis): int(shapes[name][axis]) for name, axis in d.uses if name in shapes}
        values = set(seen.values())
        if not values:
            raise ShapeError(f"no input given carries {d.symbol} (" + ", ".join(
                f"'{n}' axis {a}" for n, a in d.uses) + ")")
        if len(values) > 1:
            raise ShapeError(f"the inputs disagree on {d.symbol}: " + ", ".join(
                f"'{n}' axis {a} is {v}" for (n, a), v in seen.items()))
        sizes.append(values.pop())
    return tuple(sizes)


def padded_shape(dims: Sequence[DynamicDim], name: str, shape: Sequence[int], key: Sequence[int]) -> list[int]:
    out = list(shape)
    for d, b in zip(dims, key):
        for n, axis in d.uses:
            if n == name:
                out[axis] = b
    return out


def pad_to(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`x` in the leading corner of a zero tensor of `shape` (x itself where the shapes match)."""
    if list(x.shape) == list(shape):
        return x
    out = x.new_zeros(shape)
    out[tuple(slice(0, s) for s in x.shape)] = x
    return out


class BucketedExecutable:
    """Runs the bucket that fits each call (see the module doc). `loaders[key]` builds the
    executable of bucket `key` (a tuple of sizes, in `dims` order)."""

    def __init__(self, dims: Sequence[DynamicDim], outputs: Mapping[str, Sequence[tuple[int, str]]],
                 input_names: Sequence[str], output_names: Sequence[str],
                 loaders: Mapping[tuple[int, ...], Callable[[], Executable]]) -> None:
        self.dims = list(dims)
        self.output_axes = {k: [(int(a), s) for a, s in v] for k, v in outputs.items()}
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.loaders = dict(loaders)
        self.executables: dict[tuple[int, ...], Executable] = {}
        self._loading = threading.Lock()

    def executable(self, key: tuple[int, ...]) -> Executable:
        exe = self.executables.get(key)
        if exe is None:
            with self._loading:  # two threads' first calls of a bucket build it once
                exe = self.executables.get(key)
                if exe is None:
                    exe = self.executables[key] = self.loaders[key]()
        return exe

    def warmup(self) -> None:
        """Build every bucket's executable now, rather than at its first call."""
        for key in self.loaders:
            self.executable(key)

    def pick(self, shapes: Mapping[str, Sequence[int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the call's sizes, its bucket) for inputs of these shapes."""
        sizes = sizes_of(self.dims, shapes)
        return sizes, tuple(d.bucket_for(s) for d, s in zip(self.dims, sizes))

    def run(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Outputs by name (fresh tensors, at the call's sizes), for inputs by position or by name."""
        if args and kwargs:
            raise TypeError("pass inputs by position or by name, not both")
        named = dict(zip(self.input_names, args)) if args else dict(kwargs)
        if set(named) != set(self.input_names):
            raise ShapeError(f"the model takes inputs {self.input_names}, got {list(named) or len(args)}")
        tensors = {k: torch.as_tensor(v) for k, v in named.items()}
        sizes, key = self.pick({k: tuple(v.shape) for k, v in tensors.items()})
        exe = self.executable(key)
        for k, v in tensors.items():  # the static axes, named before padding hides the call's shape
            want = self._declared(exe, k)
            if v.dim() != len(want) or any(isinstance(w, int) and w != s for w, s in zip(want, v.shape)):
                raise ShapeError(f"input '{k}' has shape {list(v.shape)}, the model takes "
                                 f"[{', '.join(str(w) for w in want)}]")
        padded = {k: pad_to(v, padded_shape(self.dims, k, v.shape, key)) for k, v in tensors.items()}
        real = dict(zip((d.symbol for d in self.dims), sizes))
        result = {}
        with exe.exclusive():  # another thread's call would overwrite the outputs before they are copied
            outs = exe.run_static(exe.prepare_inputs(**padded))
            for name in self.output_names:
                y = outs[name]
                for axis, sym in self.output_axes.get(name, []):
                    y = y.narrow(axis, 0, real[sym])
                result[name] = y.clone()  # the plan's buffers are overwritten by the next call
        return result

    def _declared(self, exe: Executable, name: str) -> list[int | str]:
        """Input `name`'s shape with each dynamic axis as its symbol."""
        shape: list[int | str] = list(exe.graph.types[name].shape)
        for d in self.dims:
            for n, axis in d.uses:
                if n == name:
                    shape[axis] = d.symbol
        return shape

    def __call__(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        outs = self.run(*args, **kwargs)
        return [outs[t] for t in self.output_names]

    @property
    def backends(self) -> dict[str, int]:
        """Kernel counts by backend over the buckets built so far."""
        out: dict[str, int] = {}
        for exe in self.executables.values():
            for b, n in exe.backends.items():
                out[b] = out.get(b, 0) + n
        return out


def _seal(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in doc.items() if k != "seal"}, sort_keys=True).encode()).hexdigest()


def write_manifest(out: Path, dims: Sequence[DynamicDim], outputs: Mapping[str, Sequence[tuple[int, str]]],
                   input_names: Sequence[str], output_names: Sequence[str], checks: Sequence[Mapping[str, Any]],
                   extra: Mapping[str, Any] | None = None) -> None:
    """buckets.json, after every bucket's artifact is written under OUT/bucket_*."""
    keys = bucket_keys(dims)
    dirs = [bucket_dir(dims, k) for k in keys]
    files = {}
    for d in dirs:
        f = out / d / "artifact.json"
        if not f.is_file():
            raise ModelLoadError(f"{out / d}: the bucket's artifact is missing")
        files[f"{d}/artifact.json"] = hashlib.sha256(f.read_bytes()).hexdigest()
    doc = {"format": FORMAT, "tessera": __version__, "dims": [asdict(d) for d in dims],
           "outputs": {k: [list(p) for p in v] for k, v in outputs.items()},
           "inputs": list(input_names), "output_names": list(output_names),
           "buckets": [{"sizes": dict(zip((d.symbol for d in dims), k)), "dir": d} for k, d in zip(keys, dirs)],
           "checks": list(checks), **dict(extra or {}), "files": files}
    doc["seal"] = _seal(doc)
    (out / MANIFEST).write_text(json.dumps(doc, indent=1))


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: {MANIFEST} is damaged ({e}); compile the model again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelLoadError(f"{path}: {MANIFEST} has format {doc.get('format') if isinstance(doc, dict) else None}, "
                             f"not {FORMAT}; compile the model again")
    if doc.get("seal") != _seal(doc):
        raise ModelLoadError(f"{path}: {MANIFEST} was changed after the compile wrote it; compile the model again")
    for name, digest in doc["files"].items():
        f = path / name
        if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            raise ModelLoadError(f"{path}: {name} is missing or was changed after the compile; compile the model again")
    return doc


def load_buckets(path: str | Path, device: str | torch.device = "cpu") -> BucketedExecutable:
    """The bucketed artifact in `path`: each bucket is loaded (and checked) at its first call."""
    path = Path(path)
    doc = read_manifest(path)
    dims = [DynamicDim.from_json(d) for d in doc["dims"]]
    loaders = {}
    for b in doc["buckets"]:
        key = tuple(int(b["sizes"][d.symbol]) for d in dims)
        loaders[key] = (lambda sub=path / b["dir"]: load_artifact(sub, device))
    return BucketedExecutable(dims, doc["outputs"], doc["inputs"], doc["output_names"], loaders)


def load(path: str | Path, device: str | torch.device = "cpu") -> Executable | BucketedExecutable:
    """The artifact in `path` (`tessera compile -o`): one plan, or one per shape bucket."""
    if (Path(path) / MANIFEST).is_file():
        return load_buckets(path, device)
    return load_artifact(path, device)

