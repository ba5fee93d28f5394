"""The differential fuzzer: random ONNX graphs compiled by tessera and compared with onnxruntime.

    PYTHONPATH=. python scripts/fuzz.py --minutes 20 --out scripts/results/fuzz/fuzz_DATE_COMMIT.json
    PYTHONPATH=. python scripts/fuzz.py --graphs 500 --precisions fp16,bf16 --seed 7
    python scripts/fuzz.py --device cuda --tuning measured --minutes 10 --out ...   # on a GPU machine

Graphs come from `tests/fuzzgen.py` (a Hypothesis strategy; `tests/fuzzops*.py` hold the op
generators) and are judged by `tests/fuzzcheck.py` (see its docstring for the oracle and the
fp16/bf16 floor). The run is a sequence of Hypothesis runs of `--chunk` graphs, each with its own
seed (`--seed` + chunk index). When a graph fails (a crash or a mismatch), Hypothesis shrinks
it to the smallest graph that still fails the same way; the shrunk model is saved next to the
JSON summary (`<out>.fail<N>.onnx`, with its spec, outcome and inputs in `<out>.fail<N>.json`)
and the run goes on with the next chunk (or stops with `--stop-on-fail`).

The summary (`--out`) counts graphs, outcomes, op families, ops, precisions, layouts, kernel
forms, opaque (fallback) ops, skips by reason, and lists every distinct failure with its files.
It is written after every chunk too (`"partial": true`), and the graph being checked is kept in
`<out>.current.json` until the run ends by itself: a run the kernel kills (out of memory) leaves
both, the graph to reproduce with `GraphSpec.from_json`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings  # noqa: E402
from hypothesis.errors import Flaky  # noqa: E402

import fuzzcheck  # noqa: E402
from fuzzgen import FAMILIES, graph_specs  # noqa: E402
from fuzzspec import PRECISIONS, GraphSpec  # noqa: E402


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class Failed(Exception):
    """A failure, raised so that Hypothesis shrinks the graph."""


_KINDS: dict[str, type] = {}


def failure(sig: str) -> type:
    """One exception class per failure signature: Hypothesis shrinks a failure only to graphs that
    fail with the same class, so a crash does not shrink into another bug."""
    if sig not in _KINDS:
        _KINDS[sig] = type(f"Failed{len(_KINDS)}", (Failed,), {"__module__": __name__})
    return _KINDS[sig]


class Stats:
    def __init__(self) -> None:
        self.graphs = 0
        self.status: Counter = Counter()
        self.by_precision: dict[str, Counter] = {}
        self.families: Counter = Counter()  # graphs with at least one node of the family
        self.family_nodes: Counter = Counter()
        self.ops: Counter = Counter()
        self.layouts: Counter = Counter()
        self.opsets: Counter = Counter()
        self.strategies: Counter = Counter()
        self.skips: Counter = Counter()
        self.skip_examples: dict[str, str] = {}
        self.warnings: Counter = Counter()  # Triton warnings about generated code, by message
        self.opaque: Counter = Counter()
        self.opaque_reasons: dict[str, str] = {}
        self.forms: Counter = Counter()  # total kernels of each form
        self.form_graphs: Counter = Counter()  # graphs with at least one
        self.nodes_hist: Counter = Counter()
        self.max_numel = 0
        self.random_schedules = 0
        self.check_s = 0.0
        self.shrink_s = 0.0  # compiling the graphs Hypothesis tries while shrinking a failure
        self.shrink_steps = 0

    def add(self, spec: GraphSpec, o: fuzzcheck.Outcome) -> None:
        self.graphs += 1
        self.status[o.status] += 1
        self.by_precision.setdefault(spec.precision, Counter())[o.status] += 1
        self.by_precision[spec.precision]["graphs"] += 1
        for f in spec.families:
            self.families[f] += 1
        for n in spec.nodes:
            self.family_nodes[n.family] += 1
            self.ops[n.op] += 1
        self.layouts[spec.layout] += 1
        self.opsets[str(spec.opset)] += 1
        self.strategies[spec.strategy] += 1
        self.nodes_hist[str(len(spec.nodes))] += 1
        self.max_numel = max([self.max_numel] + [int(np.prod(s)) for s, _ in spec.types.values()])
        self.random_schedules += bool(spec.schedule_seed)
        if o.status == "skip":
            self.skips[o.reason] += 1
            self.skip_examples.setdefault(o.reason, o.detail)
        for w in o.warnings:
            self.warnings[w] += 1
        for op, why in o.opaque:
            self.opaque[op] += 1
            self.opaque_reasons.setdefault(op, why)
        for k, v in o.forms.items():
            self.forms[k] += v
            self.form_graphs[k] += 1 if v else 0
        self.check_s += o.seconds


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(device: str) -> str:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores visible), Triton interpreter"


def versions() -> dict[str, str]:
    import hypothesis
    import onnxruntime
    import triton
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "hypothesis": hypothesis.__version__,
            "numpy": np.__version__}


def save_failure(out: Path, k: int, spec: GraphSpec, outcome: fuzzcheck.Outcome | None, error: str) -> dict[str, Any]:
    """The shrunk graph as ONNX, plus its spec, outcome and the inputs it failed on."""
    stem = out.with_suffix("")
    onnx_path = Path(f"{stem}.fail{k}.onnx")
    json_path = Path(f"{stem}.fail{k}.json")
    try:
        onnx.save(fuzzcheck.to_onnx(spec), onnx_path)
    except Exception as e:  # noqa: BLE001 - a broken generator graph is still reported
        error += f" (model not saved: {e})"
    x = fuzzcheck.feeds(spec)
    row = {"status": outcome.status if outcome else error.split(":")[0],
           "reason": outcome.reason if outcome else error, "detail": outcome.detail if outcome else error,
           "err": outcome.err if outcome else None, "precision": spec.precision, "layout": spec.layout,
           "nodes": len(spec.nodes), "ops": [n.op for n in spec.nodes], "onnx": onnx_path.name,
           "spec_json": json_path.name}
    json_path.write_text(json.dumps({"failure": row, "spec": spec.to_json(), "spec_repr": repr(spec),
                                     "inputs": {k2: {"dtype": str(v.dtype), "shape": list(v.shape),
                                                     "values": v.reshape(-1).tolist()} for k2, v in x.items()}},
                                    indent=1))
    return row


def _write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: a run killed mid-write (the reason these files
    exist) leaves the last complete version, never a truncated one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked; `precisions` becomes a list and `random_schedules` a bool."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=None, help="stop after this much wall time")
    ap.add_argument("--graphs", type=int, default=None, help="stop after this many graphs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--tuning", choices=("analytical", "measured", "fake"), default="analytical",
                    help="measured: the compile times candidates on the GPU (CompileOptions(cost='measured')); "
                         "fake: a measured compile on the CPU whose profiler prices kernels by a hash, templates "
                         "a third less (tests/fake_profiler.RandomTemplateProfiler): plans with operand "
                         "prologues, norms and GEMM chains, which analytical compiles never form")
    ap.add_argument("--db", default=None, help="tuning database for --tuning measured (default: a fresh one in a temp dir)")
    ap.add_argument("--random-schedules", choices=("auto", "on", "off"), default="auto",
                    help="run generated kernels at random schedules of their space (auto: on unless measured)")
    ap.add_argument("--chunk", type=int, default=100, help="graphs per Hypothesis run (one seed each)")
    ap.add_argument("--max-steps", type=int, default=6, help="op steps per graph at most")
    ap.add_argument("--families", default=None,
                    help=f"draw only these op families, comma-separated (of {', '.join(FAMILIES)}; default all)")
    ap.add_argument("--big", type=float, default=0.15, help="share of graphs drawn with boundary-crossing sizes")
    ap.add_argument("--stop-on-fail", action="store_true")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("fuzz.json"))
    ap.add_argument("--progress", type=float, default=30.0, help="seconds between progress lines")
    args = ap.parse_args(argv)
    if args.minutes is None and args.graphs is None:
        args.graphs = 200
    args.precisions = [p for p in args.precisions.split(",") if p]
    if args.families is not None:
        args.families = [f for f in args.families.split(",") if f]
        if not args.families or any(f not in FAMILIES for f in args.families):
            ap.error(f"--families takes {', '.join(FAMILIES)}")
    if any(p not in PRECISIONS for p in args.precisions):
        ap.error(f"--precisions takes {', '.join(PRECISIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no GPU visible")
    if args.tuning == "measured" and args.device != "cuda":
        ap.error("--tuning measured times kernels on the GPU: use it with --device cuda")
    if args.out.is_dir():  # found only after minutes of fuzzing, when the summary is written
        ap.error(f"--out names a file (the JSON summary; failures go beside it), and {args.out} is a directory")
    args.random_schedules = args.random_schedules == "on" or (args.random_schedules == "auto"
                                                              and args.tuning != "measured")
    return args


class Run:
    """One fuzzing run: its budget, counts, distinct failures, and the graph being shrunk."""

    def __init__(self, args: argparse.Namespace, db: str) -> None:
        self.args, self.db = args, db
        self.commit = git_commit()  # at the start: the code that ran
        self.stats = Stats()
        self.failures: list[dict[str, Any]] = []
        self.seen: dict[str, dict[str, Any]] = {}
        self.chunks: list[int] = []
        self.start = self.last_print = time.perf_counter()
        self.cpu_start = time.process_time()
        self.interrupted = False
        # While Hypothesis shrinks a failure, the graphs it tries are not counted; `last` is the
        # latest failing (spec, outcome or None, error text).
        self.shrinking = False
        self.last: tuple[GraphSpec, fuzzcheck.Outcome | None, str] | None = None
        self.current = Path(f"{args.out.with_suffix('')}.current.json")

    def budget_left(self) -> bool:
        a = self.args
        if a.graphs is not None and self.stats.graphs >= a.graphs:
            return False
        return a.minutes is None or time.perf_counter() - self.start < a.minutes * 60

    def progress(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self.last_print >= self.args.progress:
            self.last_print = now
            mins = (now - self.start) / 60
            s = self.stats.status
            print(f"[{mins:6.1f} min] {self.stats.graphs} graphs: {s['pass']} pass, {s['skip']} skip, "
                  f"{s['mismatch']} mismatch, {s['crash']} crash; {self.stats.graphs / max(mins, 1e-9):.0f} graphs/min; "
                  f"{len(self.seen)} distinct failure(s)", flush=True)

    def check(self, spec: GraphSpec) -> None:
        """Hypothesis's test: check one graph; raise a failure's own class so that it shrinks."""
        if not self.shrinking and not self.budget_left():
            return
        a = self.args
        # The graph in hand, on disk before it runs: a run the kernel kills (out of memory: SIGKILL,
        # which nothing catches) leaves it to reproduce. Removed when the run ends by itself.
        _write_whole(self.current, json.dumps({"chunk_seed": self.chunks[-1], "shrinking": self.shrinking,
                                               "spec": spec.to_json(), "spec_repr": repr(spec)}))
        t_call = time.perf_counter()
        try:
            o = fuzzcheck.check(spec, a.device, a.tuning, self.db if a.tuning in ("measured", "fake") else None,
                                a.random_schedules)
        except Exception as e:  # noqa: BLE001 - the generator's or the oracle's own bug, not tessera's
            kind = "generator-error" if isinstance(e, fuzzcheck.GeneratorError) else "harness-error"
            if not self.shrinking:
                self.stats.status[kind] += 1
                self.stats.graphs += 1
            self.shrinking = True
            self.last = (spec, None, f"{kind}: {type(e).__name__}: {e}")
            raise failure(kind)(str(e)) from None
        if self.shrinking:
            self.stats.shrink_s += time.perf_counter() - t_call
            self.stats.shrink_steps += 1
        else:
            self.stats.add(spec, o)
            self.progress()
        if o.failed:
            self.shrinking = True
            self.last = (spec, o, "")
            raise failure(f"{o.status}: {o.reason}")(o.detail)

    def chunk(self, chunk_seed: int) -> bool:
        """One Hypothesis run of `--chunk` graphs from `chunk_seed`; True when the run should stop."""
        a = self.args
        self.chunks.append(chunk_seed)
        self.shrinking, self.last = False, None
        phases = [Phase.generate] + ([] if a.no_shrink else [Phase.shrink])

        @settings(max_examples=a.chunk, database=None, deadline=None, derandomize=False, phases=phases,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False, verbosity=Verbosity.quiet,
                  print_blob=False)
        @seed(chunk_seed)
        @given(graph_specs(precisions=a.precisions, max_steps=a.max_steps, big=a.big, families=a.families))
        def run_one(spec: GraphSpec) -> None:
            self.check(spec)

        try:
            run_one()
        except (Failed, Flaky) as e:
            # Flaky: the graph failed once and passed when Hypothesis ran it again (a GPU capture that
            # a garbage collection broke, session 48). It is recorded as found, unshrunk, and the run goes on.
            self.record(flaky=isinstance(e, Flaky))
            return a.stop_on_fail
        finally:
            self.write(partial=True)  # the counts so far survive a run that is killed
        return False

    def write(self, partial: bool = False) -> None:
        """The summary (`--out`); `partial`: written after a chunk, with the run still going."""
        _write_whole(self.args.out, json.dumps({**self.summary(), "partial": partial}, indent=1) + "\n")

    def record(self, flaky: bool = False, interrupted: bool = False) -> None:
        """The last failing graph as a distinct failure (files beside the summary), or one more hit of
        a failure already seen with the same signature and ops."""
        assert self.last is not None
        spec, o, err = self.last
        sig = f"{o.status}: {o.reason}" if o else err.split(":")[0]
        sig = f"flaky {sig}" if flaky else sig
        key = f"{sig} [{spec.precision}: {' '.join(sorted({n.op for n in spec.nodes}))}]"
        if key in self.seen and not interrupted:
            self.seen[key]["hits"] += 1
            return
        row = save_failure(self.args.out, len(self.failures) + 1, spec, o, err)
        row["signature"] = f"{sig} (interrupted while shrinking)" if interrupted else sig
        row["hits"], row["chunk_seed"] = 1, self.chunks[-1]
        self.failures.append(row)
        self.seen.setdefault(key, row)
        if not interrupted:
            print(f"FAILURE {len(self.failures)}: {sig}\n  {row['detail']}\n  shrunk to {row['nodes']} node(s) "
                  f"{row['ops']}: {row['onnx']}", flush=True)

    def summary(self) -> dict[str, Any]:
        a, stats = self.args, self.stats
        wall = time.perf_counter() - self.start
        cpu = time.process_time() - self.cpu_start
        return {
            "date": time.strftime("%Y-%m-%d"), "commit": self.commit, "device": device_name(a.device),
            "device_kind": a.device, "tuning": a.tuning, "random_schedules": a.random_schedules,
            "versions": versions(),
            "options": {"seed": a.seed, "precisions": a.precisions, "chunk": a.chunk, "max_steps": a.max_steps,
                        "big": a.big, "families": a.families, "minutes": a.minutes, "graphs": a.graphs, "shrink": not a.no_shrink},
            "seeds": self.chunks,
            "wall_s": round(wall, 1), "graphs": stats.graphs,
            "graphs_per_minute": round(stats.graphs / (wall / 60), 1) if wall else None,
            "check_s_per_graph": round(stats.check_s / max(stats.graphs, 1), 4),
            "shrink_s": round(stats.shrink_s, 1), "shrink_steps": stats.shrink_steps,
            "graphs_per_minute_excluding_shrinking": round(stats.graphs / max((wall - stats.shrink_s) / 60, 1e-9), 1),
            # The CPU machines' cores are shared: CPU time says what one core of our own would do.
            "cpu_s": round(cpu, 1), "graphs_per_cpu_minute": round(stats.graphs / max(cpu / 60, 1e-9), 1),
            "outcomes": dict(stats.status), "mismatches": stats.status["mismatch"], "crashes": stats.status["crash"],
            "generator_errors": stats.status["generator-error"], "harness_errors": stats.status["harness-error"],
            "skips": {"total": stats.status["skip"], "by_reason": dict(stats.skips), "examples": stats.skip_examples},
            "per_precision": {k: dict(v) for k, v in sorted(stats.by_precision.items())},
            "per_family_graphs": dict(sorted(stats.families.items())),
            "per_family_nodes": dict(sorted(stats.family_nodes.items())),
            "per_op_nodes": dict(sorted(stats.ops.items())),
            "layouts": dict(stats.layouts), "opsets": dict(stats.opsets), "strategies": dict(stats.strategies),
            "nodes_per_graph": dict(sorted(stats.nodes_hist.items(), key=lambda kv: int(kv[0]))),
            "graphs_with_random_schedules": stats.random_schedules, "max_tensor_numel": stats.max_numel,
            "kernel_forms": {"kernels": dict(sorted(stats.forms.items())),
                             "graphs_with": dict(sorted(stats.form_graphs.items()))},
            "triton_warnings": dict(stats.warnings),
            "opaque_fallback": {"nodes": dict(sorted(stats.opaque.items())), "reasons": stats.opaque_reasons},
            "failures": self.failures, "interrupted": self.interrupted,
        }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # NaN/inf in the interpreter's NumPy
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory(prefix="tessera_fuzz_")
    os.environ["TESSERA_CACHE"] = tmp.name  # generated kernel files: one throwaway cache per run
    os.environ["TESSERA_CAPTURE"] = "strict"  # a failed CUDA-graph capture is a crash, not a quiet fallback
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run = Run(args, args.db or str(Path(tmp.name) / "tuning.db"))
    signal.signal(signal.SIGTERM, _terminate)  # `timeout`, a job scheduler: stop as on Ctrl-C
    try:
        index = 0
        while run.budget_left() and not run.chunk(args.seed + index):
            index += 1
    except KeyboardInterrupt:
        # The summary is written, with a failure being shrunk saved as it stands: nothing is lost.
        run.interrupted = True
        print("interrupted: writing the summary of what ran", flush=True)
        if run.shrinking and run.last is not None:
            run.record(interrupted=True)
    run.progress(force=True)
    run.write()
    run.current.unlink(missing_ok=True)
    print(f"wrote {args.out}: {run.stats.graphs} graphs in {(time.perf_counter() - run.start) / 60:.1f} min, "
          f"{len(run.failures)} distinct failure(s)")
    tmp.cleanup()
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
