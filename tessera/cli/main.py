"""The `tessera` command line."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from tessera import cache
from tessera.codegen.gemm import column_slices
from tessera.codegen.kernels import ChainSchedule
from tessera.compiler import CompileOptions, compile_model, write_artifacts
from tessera.cost import DEVICES, PRECISIONS
from tessera.cost.db import TuningDB, default_db_path
from tessera.errors import TesseraError
from tessera.frontend import load as frontend_load
from tessera.ir.indices import check_feeds
from tessera.orchestrate import DEFAULT_SOLVER, SOLVERS, STRATEGIES
from tessera.orchestrate.candidates import MAX_KERNEL_NODES
from tessera.orchestrate.layout import LAYOUT_POLICIES
from tessera.orchestrate.plan import Plan
from tessera.rewrite import IO_CHOICES
from tessera.rewrite.search import REWRITE_MODES
from tessera.summary import format_summary, summarize
from tessera.runtime.artifact import read_meta
from tessera.runtime.buckets import MANIFEST, load
from tessera.runtime.profile import format_profile, profile_executable
from tessera.tolerance import TOLERANCE, passes, rel_l2, weak_reference
from tessera.runtime import plan_cache
from tessera.verify import STAGES, precision_floor, random_inputs, run_onnxruntime, verify, verify_kernels
from tessera.log import configure as configure_logging
from tessera.version import __version__


def parse_input_shapes(specs: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """`name=1x3x224x224` pairs -> {name: shape}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise TesseraError(f"--input-shape '{spec}' is not NAME=DIMS, e.g. x=1x3x224x224") from None
    return shapes


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="fix an input's shape, e.g. x=1x3x224x224 (repeatable)")


def _count(lowest: int):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        v = int(text)
        if v < lowest:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lowest}, not {text}")
        return v
    parse.__name__ = "int"
    return parse


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return v


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each option's default, except None: those options say in words what happens
    without them ("default: fresh")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


class _CommandParser(argparse.ArgumentParser):
    """Every command's --help states each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="A compiler for deep-learning inference on NVIDIA GPUs.")
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log the passes, partitions, solver and tuning to stderr (-vv: more); or TESSERA_LOG=info")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)

    p = sub.add_parser("inspect", help="operator and primitive counts, opaque ops, folded constants")
    _add_model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("verify", help="compare a stage with onnxruntime on random inputs; --per-kernel: a compiled "
                       "artifact's kernels one by one against the reference interpreter")
    p.add_argument("model", help="an .onnx file; with --per-kernel also an artifact directory (tessera compile -o)")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="fix an input's shape, e.g. x=1x3x224x224 (repeatable)")
    p.add_argument("--stage", choices=STAGES, help="frontend: the folded operator graph in onnxruntime; fission: the "
                   "primitive graph in the reference interpreter (default: fission); rewrites: that graph after "
                   "the rewrite search (compile --rewrites on), priced by the analytical cost model")
    p.add_argument("--seed", type=_count(0), help="random seed (default: fresh)")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="run the primitive graph at this precision and apply its tolerance: fp32 computes in float64; "
                   "tf32 rounds conv/matmul operands to TF32; fp16/bf16 round every stored tensor to that type after "
                   "the precision pass (default: fp32; with --per-kernel, the artifact's precision)")
    p.add_argument("--per-kernel", action="store_true",
                   help="run a compiled artifact (or the model compiled with the defaults) kernel by kernel and "
                   "compare each kernel's outputs with the float64 reference; names the first kernel that diverges")
    p.add_argument("--propagate", action="store_true",
                   help="with --per-kernel: feed each kernel the executable's own earlier outputs (errors accumulate) "
                   "instead of the reference's values (each kernel isolated)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="with --per-kernel: where the kernels run")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("compile", help="split a model and choose its kernels; writes OUT/plan.json and OUT/report.html")
    _add_model_args(p)
    p.add_argument("-o", "--out", required=True, type=Path, help="output directory")
    p.add_argument("--cost", choices=["auto", "analytical", "measured"], default="auto",
                   help="cost model: measured on a GPU (tuning), analytical otherwise (auto picks)")
    p.add_argument("--db", help="tuning database (default: $TESSERA_CACHE/tuning.db, ~/.cache/tessera/tuning.db)")
    p.add_argument("--tune-workers", type=_count(1), help="parallel kernel builds while tuning (default: cores - 2)")
    p.add_argument("--tune", choices=["all", "lazy"], default="all",
                   help="measure every candidate, or only those the solver picks (re-solving until exact)")
    p.add_argument("--gpu", default="auto", choices=["auto", *sorted(DEVICES)],
                   help="device preset for the cost model (auto: the visible GPU's, else h100)")
    p.add_argument("--strategy", choices=STRATEGIES, default="optimal")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--io", choices=IO_CHOICES, default="model",
                   help="float inputs and outputs: model (the dtypes the model declares) or precision "
                        "(an fp16/bf16 plan takes and returns that type, with no boundary casts)")
    p.add_argument("--layout", choices=LAYOUT_POLICIES, default="auto",
                   help="storage layouts: auto (by cost), nchw (all row-major), nhwc (conv regions channels-last)")
    p.add_argument("--templates", choices=["auto", "off", "force"], default="auto",
                   help="GEMM and convolution templates for matmul and 2-D conv kernels: auto (a measured "
                        "compile times them beside the library call and keeps the faster), off, or force "
                        "(every such kernel that has one)")
    p.add_argument("--prologues", choices=["on", "off"], default="on",
                   help="with measured templates, let elementwise primitives that feed a matmul or "
                        "convolution operand join its kernel (off: epilogues only)")
    p.add_argument("--chains", choices=["on", "off"], default="on",
                   help="with measured or forced templates, let two matmuls joined through memory-bound "
                        "primitives (attention, MLPs) form one GEMM-chain kernel (codegen/chain.py)")
    p.add_argument("--merge-matmuls", choices=["on", "off"], default="on",
                   help="with measured or forced templates, merge matmuls that read one left operand through "
                        "constant weights into one over the weights side by side (BERT's QKV projections)")
    p.add_argument("--rewrites", choices=list(REWRITE_MODES), default=CompileOptions.rewrites,
                   help="primitive-graph rewrites before orchestration (rewrite/rules/), each kept only where "
                        "the cost model prices its window's plan cheaper (rewrite/search.py): on, every rule; "
                        "regroup (default), only chains of two matmuls grouped the cheaper way; off, none")
    p.add_argument("--rewrite-budget", type=_positive, default=30.0, metavar="S",
                   help="seconds the rewrite search may price new windows for")
    p.add_argument("--solver", choices=SOLVERS, default=DEFAULT_SOLVER)
    p.add_argument("--time-limit", type=_positive, default=60.0, help="seconds per subgraph solve")
    p.add_argument("--max-states", type=_count(1), help="execution states per subgraph (default 2000, or "
                                                          "$TESSERA_MAX_STATES)")
    p.add_argument("--max-kernel-nodes", type=_count(1), default=MAX_KERNEL_NODES, help="primitives per candidate kernel")
    p.add_argument("--dynamic", action="append", metavar="NAME=DIM:MIN..MAX",
                   help="a dynamic input axis: one plan per bucket of sizes (powers of two from MIN, then MAX; "
                        "or NAME=DIM:S1,S2,... for these buckets), all in one artifact (repeatable)")
    p = sub.add_parser("bench", help="time tessera against PyTorch eager and torch.compile, same process and inputs")
    p.add_argument("model", help="an ONNX file (tessera alone), zoo:NAME or FILE.py:FUNC (FUNC returns a PyTorch "
                                 "(module, example_inputs): the PyTorch peers too)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="as every command's default")
    p.add_argument("--vs", default="eager,inductor,inductor-cudagraphs",
                   help="peers: eager, inductor, inductor-cudagraphs, inductor-max-autotune, sdpa "
                        "(the flash kernel; zoo attention cases only); tessera-dynamo adds tessera through "
                        "torch.compile(backend='tessera') on the PyTorch model (not a peer)")
    p.add_argument("--strategy", default="optimal,greedy",
                   help="tessera strategies to time; NAME-notemplates times NAME with templates off, "
                        "NAME-noprologues with templates but no operand prologues, NAME-precisionio taking "
                        "and returning the precision's type (no boundary casts), NAME-nochains with no "
                        "GEMM-chain kernels, NAME-rewrites searching every rewrite rule, NAME-norewrites none "
                        "(the default searches the matmul regrouping only); suffixes combine "
                        "(optimal-precisionio-rewrites)")
    p.add_argument("--cost", choices=["auto", "analytical", "measured"], default="auto")
    p.add_argument("--db", help="tuning database")
    p.add_argument("--solver", choices=SOLVERS, default=DEFAULT_SOLVER)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=_count(0), default=0)
    p.add_argument("--batch", type=_count(1), default=1,
                   help="items per call of a zoo model (tessera.zoo.BATCHED: the whole models; default 1)")
    p.add_argument("--json", type=Path, help="also write the results to this JSON file")
    p.add_argument("--timing", choices=["wall", "gpu"], default="wall",
                   help="wall: median time of a call; gpu: the GPU time of its kernels (profiler), for "
                        "kernels of a few µs that launch overhead would hide")
    p.add_argument("--profile", action="store_true",
                   help="also profile each contender's kernels by kind (extra.run_profile in --json)")
    p.add_argument("--guards", choices=["all", "skip-modules"], default="all",
                   help="dynamo's guards for every torch.compile contender: skip-modules drops those on "
                        "nn.Module state (torch.compiler.skip_guard_on_all_nn_modules_unsafe), as frozen "
                        "inference may")
    p = sub.add_parser("db", help="move tuning results between machines")
    p.add_argument("action", choices=["export", "import", "stats"])
    p.add_argument("file", nargs="?", type=Path, help="JSON-lines file to write (export) or read (import)")
    p.add_argument("--db", help="tuning database (default: $TESSERA_CACHE/tuning.db)")
    p = sub.add_parser("run", help="run a compiled artifact; --check compares with onnxruntime")
    p.add_argument("artifact", type=Path, help="directory written by tessera compile -o")
    p.add_argument("--check", action="store_true", help="compare every output with onnxruntime")
    p.add_argument("--inputs", type=Path, help=".npz file of inputs by name (default: fresh random inputs)")
    p.add_argument("--seed", type=_count(0), help="seed for random inputs (default: fresh)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--save-outputs", type=Path, help="write the outputs to this .npz file")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="an artifact with shape buckets: run at this shape (default: one size per bucket, "
                        "padded where the artifact pads)")
    p = sub.add_parser("profile", help="what really runs: each CUDA kernel's time per call, by kind and plan kernel")
    p.add_argument("target", type=Path, help="an artifact directory (tessera compile -o) or an .onnx file")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, help="calls profiled (default: 30 on cuda, 1 on cpu)")
    p.add_argument("--json", type=Path, help="also write the profile to this JSON file")
    p.add_argument("--precision", choices=PRECISIONS, help="compile an .onnx file at this precision (default fp32)")
    p.add_argument("--top", type=int, default=15, help="kernels and plan kernels to list")
    p = sub.add_parser("cache", help="the kernel cache: where, how big, its cap; clear it")
    p.add_argument("action", choices=["info", "clear"])
    p.add_argument("--triton", action="store_true",
                   help="clear: also empty Triton's cache of compiled kernels (never capped by tessera)")
    p.add_argument("--json", action="store_true", help="info: print JSON")
    return parser


def _check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise TesseraError("--device cuda: no GPU is visible to torch here; run with --device cpu")


@contextlib.contextmanager
def _open_target(target: Path, device: str, precision: str | None,
                 input_shape: list[str] | None = None) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """(executable, frontend model, artifact metadata) of TARGET: an artifact directory, or a model
    compiled first with the default options (into a temporary artifact, gone on exit)."""
    if not target.exists():
        raise TesseraError(f"{target}: no such artifact directory or model file")
    _check_device(device)
    with tempfile.TemporaryDirectory(prefix="tessera-") as tmp:
        if target.is_dir():
            meta = read_meta(target)
            if input_shape:
                raise TesseraError(f"{target} was compiled for input shapes {meta['input_shapes']}; "
                                   "--input-shape applies to an .onnx file")
            if precision and precision != meta.get("precision", "fp32"):
                raise TesseraError(f"{target} was compiled for {meta.get('precision', 'fp32')}; "
                                   "--precision applies to an .onnx file, compile again to change it")
            artifact = target
        else:
            artifact = Path(tmp) / "artifact"
            opts = CompileOptions(precision=precision or "fp32", input_shapes=parse_input_shapes(input_shape))
            write_artifacts(compile_model(target, opts), artifact)
            meta = read_meta(artifact)
        exe = load(artifact, device)
        yield exe, frontend_load(artifact / "model.onnx", meta["input_shapes"]), meta


def cmd_run(args: argparse.Namespace) -> int:
    _check_device(args.device)
    if (args.artifact / MANIFEST).is_file():
        return _run_buckets(args)
    if args.input_shape:
        raise TesseraError(f"{args.artifact} was compiled for fixed input shapes; --input-shape applies to an "
                           "artifact with shape buckets (tessera compile --dynamic)")
    meta = read_meta(args.artifact)
    exe = load(args.artifact, args.device)
    model = frontend_load(args.artifact / "model.onnx", meta["input_shapes"])
    seed = int.from_bytes(os.urandom(4), "little") if args.seed is None else args.seed
    feeds = _typed_feeds(_read_npz(args.inputs), model.graph) if args.inputs else random_inputs(model.graph, seed)
    outs = _host_outputs(exe.run(**feeds))
    if args.save_outputs:
        np.savez(args.save_outputs, **outs)
    backends = ", ".join(f"{n} {b}" for b, n in sorted(exe.backends.items()))
    print(f"{args.artifact}: ran {len(exe.steps)} kernels ({backends}) on {args.device}"
          + (", launch by launch (its CUDA-graph capture failed)" if exe.capture_error else "")
          + ("" if args.inputs else f", random inputs (seed {seed})"))
    if not args.check:
        _print_outputs(outs)
        return 0
    precision = meta.get("precision", "fp32")
    ref = run_onnxruntime(model.model, feeds)
    if _check_outputs(outs, ref, precision):
        return 0
    if precision in ("fp16", "bf16"):  # say whether the precision itself is past the tolerance here
        _print_floor(precision_floor(model, feeds, ref, precision), precision)
    return 1


def _print_floor(floor: dict[str, float], precision: str) -> None:
    worst = max(floor.values(), default=0.0)
    print(f"  the reference interpreter storing every tensor in {precision} is off by {worst:.3e} "
          f"(the precision's floor for this model)")
    if worst >= TOLERANCE[precision]:
        print(f"  {precision} itself cannot hold this model within {TOLERANCE[precision]:g}: "
              f"compile at a wider precision (fp32 or tf32) for a check that can pass")


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Named arrays from a .npz file."""
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        raise TesseraError(f"{path}: not a .npz file of named arrays (numpy.savez writes one)") from None


def _typed_feeds(feeds: dict[str, np.ndarray], graph: Any) -> dict[str, np.ndarray]:
    """Inputs checked against the model and cast to its declared dtypes (float64 arrays for
    float32 inputs, say), as onnxruntime wants them."""
    check_feeds(graph, feeds)
    return {k: v.astype(graph.types[k].dtype.to_numpy()) if k in graph.types else v for k, v in feeds.items()}


def _host_outputs(outs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    # NumPy has no bfloat16: a bf16 output (`--io precision`) is saved and checked as float32.
    return {k: (v.float() if v.dtype is torch.bfloat16 else v).cpu().numpy() for k, v in outs.items()}


def _print_outputs(outs: dict[str, np.ndarray]) -> None:
    for name, v in outs.items():
        print(f"  {name:<24} {str(list(v.shape)):<20} {v.dtype}")


def _check_outputs(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray], precision: str) -> bool:
    ok = True
    for name, v in outs.items():
        err = rel_l2(v, ref[name])
        good = passes(err, precision)
        ok &= good
        print(f"  {name:<24} {str(list(v.shape)):<20} rel L2 {err:.3e}  {'PASS' if good else 'FAIL'}")
        if note := weak_reference(ref[name]):
            print(f"    note: {note}")
    print(f"{'PASS' if ok else 'FAIL'} (tolerance {TOLERANCE[precision]:g}, {precision}, vs onnxruntime)")
    return ok


def _run_buckets(args: argparse.Namespace) -> int:
    """`run` on an artifact with shape buckets: at the shapes given (--input-shape, --inputs), or
    once per bucket at a size that runs padded into it where the artifact pads."""
    from tessera.runtime.buckets import bucket_dir, bucket_keys, padded_shape, sizes_of

    exe = load(args.artifact, args.device)  # reads and checks buckets.json
    dims = exe.dims
    seed = int.from_bytes(os.urandom(4), "little") if args.seed is None else args.seed
    arrays = _read_npz(args.inputs) if args.inputs else None
    if arrays is not None or args.input_shape:
        given = {k: v.shape for k, v in arrays.items()} if arrays is not None else parse_input_shapes(args.input_shape)
        unknown = sorted(set(given) - set(exe.input_names))
        if unknown:
            raise TesseraError(f"{args.artifact}: no input(s) {unknown}; the model's inputs are {exe.input_names}")
        cases = [sizes_of(dims, given)]
    else:
        cases = [tuple(d.inside(b) for d, b in zip(dims, key)) for key in bucket_keys(dims)]
    if args.save_outputs and len(cases) > 1:
        raise TesseraError("--save-outputs writes one run's outputs: give the shapes with --input-shape or --inputs")
    ok = True
    outs: dict[str, np.ndarray] = {}
    for sizes in cases:
        key = tuple(d.bucket_for(s) for d, s in zip(dims, sizes))
        sub = args.artifact / bucket_dir(dims, key)
        meta = read_meta(sub)
        shapes = {n: padded_shape(dims, n, shape, sizes) for n, shape in meta["input_shapes"].items()}
        model = frontend_load(sub / "model.onnx", shapes)
        feeds = _typed_feeds(arrays, model.graph) if arrays is not None else random_inputs(model.graph, seed)
        outs = _host_outputs(exe.run(**feeds))
        at = ", ".join(f"{d.symbol}={s}" for d, s in zip(dims, sizes))
        bucket = ", ".join(f"{d.symbol}={k}" for d, k in zip(dims, key))
        print(f"{args.artifact}: {at} ran in the bucket {bucket} on {args.device}"
              + ("" if args.inputs else f", random inputs (seed {seed})"))
        if args.check:
            ok &= _check_outputs(outs, run_onnxruntime(model.model, feeds), meta.get("precision", "fp32"))
        else:
            _print_outputs(outs)
    if args.save_outputs:
        np.savez(args.save_outputs, **outs)
    return 0 if ok else 1


def cmd_profile(args: argparse.Namespace) -> int:
    target: Path = args.target
    if args.reps is not None and args.reps < 1:
        raise TesseraError(f"--reps {args.reps}: profile at least one call")
    with _open_target(target, args.device, args.precision) as (exe, model, meta):
        feeds = {k: torch.from_numpy(v) for k, v in random_inputs(model.graph, 0).items()}
        prof = profile_executable(exe, feeds, args.reps or (30 if args.device == "cuda" else 1))
    if args.json:
        args.json.write_text(json.dumps({"target": str(target), "precision": meta.get("precision", "fp32"),
                                         **prof.to_json()}, indent=1))
    print(f"{target}: {len(exe.steps)} plan kernels, {meta.get('precision', 'fp32')}")
    print(format_profile(prof, args.top))
    return 0


class _Bar:
    """A progress callback `(done, total)` that draws a tqdm bar on stderr. A bar is opened when its
    total is first known and never changes it, so its rate and ETA are right from the start; a call
    whose count restarts or whose total differs (the next batch of measurements) opens a new bar."""

    def __init__(self, desc: str, unit: str, quiet: bool) -> None:
        self.desc, self.unit, self.quiet = desc, unit, quiet
        self.bar: Any = None
        self.batches = 0
        self.done = self.total = 0

    def __call__(self, done: int, total: int) -> None:
        # A new batch: the first call, another total, a count that restarts, or a finished bar counting on.
        if self.bar is None or total != self.total or done < self.done or (self.done >= self.total and done > 0):
            self.close()
            self.batches += 1
            desc = self.desc if self.batches == 1 else f"{self.desc} ({self.batches})"
            self.bar = tqdm(total=total, desc=desc, unit=self.unit, file=sys.stderr, leave=False, disable=self.quiet)
            self.done, self.total = 0, total
        self.bar.update(done - self.done)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "_Bar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def cmd_compile(args: argparse.Namespace) -> int:
    opts = CompileOptions(strategy=args.strategy, cost=args.cost, gpu=args.gpu, precision=args.precision, io=args.io,
                          solver=args.solver, time_limit=args.time_limit,
                          **({"max_states": args.max_states} if args.max_states else {}),  # else the options' default
                          max_kernel_nodes=args.max_kernel_nodes, input_shapes=parse_input_shapes(args.input_shape),
                          db=args.db, tune_workers=args.tune_workers, tune=args.tune, layout=args.layout,
                          templates=args.templates, prologues=args.prologues == "on",
                          chains=args.chains == "on", merge_matmuls=args.merge_matmuls == "on",
                          rewrites=args.rewrites, rewrite_budget_s=args.rewrite_budget)
    quiet = not sys.stderr.isatty()
    if args.dynamic:
        return _compile_buckets(args, opts, quiet)
    # Each bar opens once its total is known and keeps it: orchestration counts primitives (known
    # once partitioned; a split subgraph changes no total), tuning one bar per batch of measurements.
    with _Bar("orchestrate", "prim", quiet) as progress, _Bar("tune", "kernel", quiet) as tune_progress:
        result = compile_model(args.model, opts, progress, tune_progress)
    write_artifacts(result, args.out)
    _print_compile(result)
    print(f"  wrote the artifact {args.out} (plan.json, report.html; run it with tessera run {args.out} --check)")
    return 0


def _compile_buckets(args: argparse.Namespace, opts: CompileOptions, quiet: bool) -> int:
    """`compile --dynamic`: one plan per shape bucket, in one artifact (tessera/dynamic.py)."""
    from tessera.dynamic import compile_buckets, parse_dynamic, write_buckets

    def on_bucket(sizes: dict[str, int], result: Any) -> None:
        print("bucket " + ", ".join(f"{k}={v}" for k, v in sizes.items()) + ":")
        _print_compile(result)

    requests = parse_dynamic(args.dynamic)
    with _Bar("orchestrate", "prim", quiet) as progress, _Bar("tune", "kernel", quiet) as tune_progress:
        compiled = compile_buckets(args.model, opts, requests, on_bucket, progress=progress,
                                   tune_progress=tune_progress)
    write_buckets(compiled, args.out)
    for d in compiled.dims:
        how = "pads to the next bucket" if d.pad else "runs only at its buckets (zero padding changes the outputs)"
        print(f"  {d.symbol} ({', '.join(f'{n} axis {a}' for n, a in d.uses)}): sizes {d.low}..{d.high}, "
              f"buckets {list(d.buckets)}; {how}")
    for c in compiled.checks:
        if c.reason:
            print(f"    {c.reason}")
    print(f"  wrote the artifact {args.out} ({len(compiled.results)} buckets, {MANIFEST}; run it with "
          f"tessera run {args.out} --check)")
    return 0


def _print_compile(result: Any) -> None:
    """What a compile chose: kernels, tuning, layouts, chains and templates, the solver."""
    plan = result.plan
    solved = [s.solver for s in plan.subgraphs]
    optimal = sum(1 for s in solved if s.get("optimal"))
    print(f"{plan.model}: {len(plan.kernels)} kernels from {plan.primitives} primitives "
          f"({plan.strategy}, {plan.cost_model} cost, {plan.device}, {plan.precision})")
    if result.tuning:
        t = result.tuning
        print(f"  tuning: {t['candidates']} candidates, {t['measured']} measured now ({t['failed']} failed), "
              f"the rest from {t['db']}; {t['seconds']:.1f} s")
        if "schedules_tuned" in t:
            print(f"  after the solve: {t['schedules_tuned']} kernel schedules tuned; "
                  f"{t.get('schedule_measured', 0)} measured, {t.get('schedule_s', 0.0):.1f} s")
        stages = t.get("profiler_stages_s") or {}
        if stages:
            print("  profiler seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    if result.merged:
        print(f"  merged: {result.merged} pair(s) of matmuls reading one left operand through constant weights "
              "(one matmul over the weights side by side; --merge-matmuls off keeps them apart)")
    if result.rewrite_search and result.rewrite_search["sites"]:  # (the default search finds none in most models)
        r = result.rewrite_search
        kept: dict[str, int] = {}
        for a in r["applied"]:
            kept[a["rule"]] = kept.get(a["rule"], 0) + 1
        print(f"  rewrites: {len(r['applied'])} {'kept' if r.get('kept', True) else 'found'}" + (f" ({', '.join(f'{k} x{v}' for k, v in kept.items())})"
                                                        if kept else "")
              + f" from {r['sites']} site(s) tried, {r['evaluated']} window(s) orchestrated, {r['seconds']:.1f} s"
              + (f"; stopped: {r['stopped']}" if r["stopped"] else ""))
        if r.get("plan_us"):
            with_us, without_us = r["plan_us"]
            print(f"  rewrites {'applied' if r.get('kept', True) else 'dropped'}: the tuned plan takes "
                  f"{with_us:.1f} us with them, {without_us:.1f} us without (planned again in "
                  f"{r.get('guard_s', 0.0):.1f} s)")
        elif r["applied"] and not r.get("kept", True):
            print(f"  rewrites dropped without planning again: their windows save {r.get('saved_us', 0.0):.2f} us, "
                  "too little of the plan to measure the kernels they change")
    if result.layouts is not None and result.layouts.regions:
        lay = result.layouts.summary()
        print(f"  layout: {lay['convs_channels_last']} of {lay['convs']} convolutions channels-last "
              f"({lay['channels_last_regions']} of {lay['regions']} regions), {lay['conversions']} conversions")
    chains = [k for k in result.kernels if k.triton is not None and isinstance(k.triton.schedule, ChainSchedule)]
    templates = [k.linear.op for k in result.kernels if k.backend == "template" and k.linear is not None
                 and k not in chains]
    if chains:
        print(f"  {len(chains)} GEMM chain(s) run as one kernel each (codegen/chain.py): "
              + ", ".join(k.name for k in chains))
    if plan.absorbed:
        saved = sum(a["before_us"] - a["after_us"] for a in plan.absorbed)
        print(f"  {len(plan.absorbed)} kernel(s) that only fed a GEMM chain joined it after the solve, "
              f"across the partition's cuts (orchestrate/post_fusion.py): {saved:.1f} us saved")
    if templates.count("matmul"):
        sliced = sum(1 for k in result.kernels if k.backend == "template" and k.linear is not None
                     and k.linear.op == "matmul" and column_slices(result.graph, k.nodes, k.outputs, k.linear))
        print(f"  {templates.count('matmul')} matmul kernel(s) run as GEMM templates (codegen/gemm.py)"
              + (f", {sliced} reading their product through column slices (a gated MLP's gate and up)"
                 if sliced else ""))
    if templates.count("conv"):
        print(f"  {templates.count('conv')} convolution kernel(s) run as convolution templates (codegen/conv.py)")
    print(f"  estimated {plan.estimated_total_s * 1e6:.1f} us; {greedy_baselines(plan)}")
    repeats = sum("solution_of" in s for s in solved)
    print(f"  {len(plan.subgraphs)} subgraph(s), {optimal} solved to proven optimality"
          + (f" ({repeats} by repeating an earlier one's answer)" if repeats else "")
          + f", {sum(s.get('seconds', 0.0) for s in solved):.2f} s in the solver; {len(plan.cuts)} cut(s)")


def greedy_baselines(plan: Plan) -> str:
    """The greedy plan's estimate beside the optimal one: within the same subgraphs (what the binary
    program improved on), and, where the partition cut the graph, over the whole graph too. The
    second can be the lower: the cuts forbid fusions across them that the whole-graph greedy makes."""
    est = max(plan.estimated_total_s, 1e-30)
    whole = f"{plan.greedy_total_s * 1e6:.1f} us ({plan.greedy_total_s / est:.2f}x)"
    if not plan.cuts:
        return f"greedy baseline {whole}"
    within = plan.greedy_in_subgraphs_s
    return (f"greedy baseline {within * 1e6:.1f} us in the same subgraphs ({within / est:.2f}x), "
            f"{whole} over the whole graph, without the {len(plan.cuts)} cut(s)")


def cmd_inspect(args: argparse.Namespace) -> int:
    s = summarize(args.model, parse_input_shapes(args.input_shape))
    print(json.dumps(s, indent=2) if args.json else format_summary(s))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    if args.per_kernel:
        return _verify_per_kernel(args)
    if args.propagate:
        raise TesseraError("--propagate applies to --per-kernel")
    if Path(args.model).is_dir():
        raise TesseraError(f"{args.model} is a directory; to check an artifact's kernels pass --per-kernel")
    precision = args.precision or "fp32"
    r = verify(args.model, stage=args.stage or "fission", input_shapes=parse_input_shapes(args.input_shape),
               seed=args.seed, precision=precision)
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
    else:
        print(f"{r.model}: stage {r.stage} vs onnxruntime, seed {r.seed}, "
              f"tolerance {TOLERANCE[r.precision]:g} ({r.precision}), {r.seconds:.1f}s")
        print(f"  computed in {r.arithmetic}")
        for o in r.outputs:
            print(f"  {o.name:<24} {str(list(o.shape)):<20} rel L2 {o.rel_l2:.3e}  {'PASS' if o.passed else 'FAIL'}")
            if o.note:
                print(f"    note: {o.note}")
        if r.opaque:
            print(f"  {len(r.opaque)} opaque node(s) ran through the fallback (onnxruntime; torch for ATen calls): "
                  + ", ".join(f"{o.node} ({o.op_type})" for o in r.opaque))
        print("PASS" if r.passed else "FAIL")
    return 0 if r.passed else 1


def _verify_per_kernel(args: argparse.Namespace) -> int:
    """`verify TARGET --per-kernel`: TARGET is an artifact, or a model compiled first with the defaults."""
    target = Path(args.model)
    if args.stage:
        raise TesseraError("--stage does not apply to --per-kernel, which checks a compiled plan's kernels")
    with _open_target(target, args.device, args.precision, args.input_shape) as (exe, model, meta):
        seed = int.from_bytes(os.urandom(4), "little") if args.seed is None else args.seed
        r = verify_kernels(exe, random_inputs(model.graph, seed), meta.get("precision", "fp32"), args.propagate,
                           str(target), seed)
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0 if r.passed else 1
    feeding = ("each kernel reads the executable's own earlier outputs" if r.propagate
               else "each kernel reads the reference's inputs")
    print(f"{r.model}: {len(r.kernels)} kernels vs the float64 reference interpreter on {r.device}, seed {r.seed}, "
          f"tolerance {r.tolerance:g} ({r.precision}); {r.mode}: {feeding}; {r.seconds:.1f}s")
    width = max([len(k.name) for k in r.kernels] + [6])
    for k in r.kernels:
        w = k.worst
        err = "-" if w is None else f"{w.rel_l2:.3e}"
        where = "" if w is None or len(k.tensors) == 1 else f"  ({w.name})"
        print(f"  {k.index:>4}  {k.name:<{width}}  {k.backend:<6}  {len(k.prims):>3} prims  max rel L2 {err:>9}  "
              f"{'PASS' if k.passed else 'FAIL'}{where}")
    first = r.first_failure
    if first is None:
        print(f"PASS: every kernel's outputs within {r.tolerance:g} of the reference")
        return 0
    w = first.worst
    assert w is not None
    failing = sum(1 for k in r.kernels if not k.passed)
    print(f"FAIL: first diverging kernel {first.name} (#{first.index}, {first.backend}): tensor '{w.name}' "
          f"rel L2 {w.rel_l2:.3e} >= tolerance {r.tolerance:g}; {failing} kernel(s) fail in all")
    print(f"  its primitives: {', '.join(first.prims)}")
    print(f"  its ONNX nodes: {', '.join(first.source_nodes) or '-'}")
    return 1


def cmd_cache(args: argparse.Namespace) -> int:
    if args.action == "clear":
        if args.json:
            raise TesseraError("--json applies to tessera cache info")
        d = cache.kernel_dir(create=False)
        files, freed = cache.clear()
        print(f"cleared {d}: removed {files} kernel files, freed {_size(freed)} (the tuning database is kept)")
        plans, pbytes = plan_cache.clear()
        print(f"cleared {plan_cache.plan_dir(create=False)}: removed {plans} cached plans, freed {_size(pbytes)}")
        if args.triton:
            files, freed = cache.clear_triton()
            print(f"cleared Triton's cache {cache.triton_cache_dir()}: removed {files} files, freed {_size(freed)}")
        return 0
    if args.triton:
        raise TesseraError("--triton applies to tessera cache clear (info always reports Triton's cache)")
    u = cache.usage()
    tdir, tfiles, tbytes = cache.triton_usage()
    plans, pbytes = plan_cache.usage()
    db = default_db_path()
    if args.json:
        print(json.dumps({"dir": str(u.directory), "files": u.files, "bytes": u.nbytes, "cap_bytes": u.cap,
                          "triton": {"dir": str(tdir), "files": tfiles, "bytes": tbytes},
                          "plans": {"dir": str(plan_cache.plan_dir(create=False)), "files": plans, "bytes": pbytes},
                          "tuning_db": {"path": str(db), "bytes": db.stat().st_size if db.is_file() else 0}},
                         indent=2))
        return 0
    cap = "none (TESSERA_CACHE_MAX_MB=0)" if u.cap is None else f"{_size(u.cap)} (TESSERA_CACHE_MAX_MB; least " \
        "recently used files go first)"
    print(f"kernel cache   {u.directory}")
    print(f"  {u.files} files, {_size(u.nbytes)}; cap {cap}")
    print(f"triton cache   {tdir}")
    print(f"  {tfiles} files, {_size(tbytes)}; not capped by tessera (tessera cache clear --triton empties it)")
    print(f"plan cache     {plan_cache.plan_dir(create=False)}")
    print(f"  {plans} plans, {_size(pbytes)} (PyTorch graphs compiled before; cache clear empties it)")
    print(f"tuning db      {db}" + (f"  ({_size(db.stat().st_size)}; kept by cache clear)" if db.is_file() else
                                    "  (none yet)"))
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cmd_bench(args: argparse.Namespace) -> int:
    from tessera.bench import bench, format_table

    doc = bench(args.model, args.precision, [p for p in args.vs.split(",") if p],
                [s for s in args.strategy.split(",") if s], args.cost, args.db, args.device, args.seed, args.solver,
                args.profile, args.timing, args.guards, batch=args.batch)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    print(format_table(doc))
    return 0 if all(e["passed"] for e in doc["entries"]) else 1


def cmd_db(args: argparse.Namespace) -> int:
    path = Path(args.db) if args.db else default_db_path()
    if args.action != "stats" and args.file is None:
        raise TesseraError(f"tessera db {args.action} needs a FILE")
    if args.action == "import" and not args.file.is_file():
        raise TesseraError(f"{args.file}: no such file to import")
    with TuningDB(path) as db:
        if args.action == "export":
            print(f"exported {db.export(args.file)} measurements from {path} to {args.file}")
        elif args.action == "import":
            print(f"imported {db.import_(args.file)} new measurements from {args.file} into {path}")
        else:
            print(f"{path}: {len(db)} measurements")
    return 0


COMMANDS = {"inspect": cmd_inspect, "verify": cmd_verify, "compile": cmd_compile, "run": cmd_run, "db": cmd_db, "bench": cmd_bench,
            "profile": cmd_profile, "cache": cmd_cache}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        if args.command in ("compile", "run", "bench", "profile", "cache") or getattr(args, "per_kernel", False):
            cache.cap_bytes()  # TESSERA_CACHE_MAX_MB, checked before any kernel is written
        return COMMANDS[args.command](args)
    except TesseraError as e:
        print(f"tessera: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path the user gave: missing, a directory, unwritable, on a read-only disk
        where = f"{e.filename}: " if e.filename else ""
        print(f"tessera: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except sqlite3.DatabaseError as e:
        print(f"tessera: error: the tuning database cannot be read ({e}); pass another with --db", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tessera: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
