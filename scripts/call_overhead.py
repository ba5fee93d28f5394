"""Where the host time of a compiled call goes: the ONNX path's bound replay against each layer of
`torch.compile(backend="tessera")` (issue 16: the backend within 5% of the ONNX path).

    PYTHONPATH=. python3 scripts/call_overhead.py --models resnet50,gpt2 [--cost analytical] [--db DB] \
        [--precision fp16] [--out DIR]

Per model, one plan compiled through dynamo; then the time per call, in steady state (200 calls,
then one synchronize; the median of 5 such runs), of:
- `replay`: `Executable.run_static` on inputs already in the graph's buffers (the bench's ONNX row);
- `exe(*inputs)`: the executable's user call (input checks, the copy into the graph's buffers,
  output clones);
- `CompiledModule`: the backend's callable, as dynamo calls it (picks the graph's inputs);
- `torch.compile`: the whole call, dynamo's guards included.
With --stub-replay (for a CPU: the plan's kernels would run in Triton's interpreter) the replay
returns the plan's output buffers without running anything. The `trivial backend` rows time dynamo
and the model's Python around a graph that returns a precomputed output (host time alone), with
dynamo's guards on module state and without (`bench --guards skip-modules`), and the
`torch.compile, skip-modules` rows the backend's call without them.
Each layer's cost is its difference from the one before. The two latency columns synchronize
after every call, so host time adds to GPU time as in the bench's wall time per call. With --out, a cProfile of the last
(`profile_MODEL.txt`, and `profile_MODEL_skip-modules.txt` without the module guards; cumulative
time) says which Python functions take the rest. The `bench:` rows time the ONNX path's replay and the
backend's call (skip-modules) with the bench's own clock, `tessera.bench.median_ms`.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera import zoo  # noqa: E402
from tessera.bench import guard_options, median_ms  # noqa: E402
from tessera.runtime.profile import profile_executable  # noqa: E402
from tessera.torch_backend import tessera_backend  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], Any], calls: int = 200, runs: int = 5, sync_each: bool = False) -> float:
    """Steady state (the host runs ahead of the GPU), or with `sync_each` the latency of one call
    (host work and GPU work add up, as the bench's wall time per call counts them)."""
    for _ in range(10):
        fn()
    _sync()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
            if sync_each:
                _sync()
        _sync()
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--cost", default="analytical")
    ap.add_argument("--db")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--stub-replay", action="store_true", help="time host work only (a CPU)")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if a.stub_replay:
        from tessera.runtime.executable import Executable

        def stub(self: Any, feeds: Any) -> Any:  # the plan's outputs, computed by nothing
            if "_stub" not in self.__dict__:
                self._stub = {t: torch.zeros(self.graph.types[t].shape, device=self.device) for t in self.graph.outputs}
            return self._stub
        Executable.run_static = stub  # type: ignore[method-assign]
    os.environ.setdefault("TESSERA_CACHE", tempfile.mkdtemp(prefix="tessera-cache-"))
    options = {"precision": a.precision, "cost": a.cost, "solver": a.solver, "io": "precision",
               **({"db": a.db} if a.db else {})}
    rows = []
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, args = getattr(zoo, name)()
        model = model.eval().to(dev)
        args = tuple(x.to(dev) for x in args)
        got: list[Any] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            got.append((tessera_backend(gm, example_inputs, options=options), list(example_inputs)))
            return got[-1][0]

        torch._dynamo.reset()
        fn = torch.compile(model, backend=backend)
        with torch.no_grad():
            fn(*args)
            if len(got) != 1:
                print(f"{name}: {len(got)} graphs; the layers are timed for one graph only")
                continue
            cm, example = got[0]
            exe = cm.exe
            ins = [example[j] for j in cm.bridge.inputs]
            bound = exe.bind_inputs(exe.prepare_inputs(*ins))
            row: dict[str, Any] = {"model": name,
                   "replay": per_call_us(lambda: exe.run_static(bound)),
                   "exe(*inputs)": per_call_us(lambda: exe(*ins)),
                   "CompiledModule": per_call_us(lambda: cm(*example)),
                   "torch.compile": per_call_us(lambda: fn(*args)),
                   "replay, latency": per_call_us(lambda: exe.run_static(bound), sync_each=True),
                   "torch.compile, latency": per_call_us(lambda: fn(*args), sync_each=True)}
            # dynamo and the model's Python around a graph that returns a precomputed output (host
            # time alone), and the same two calls without guards on module state (bench --guards)
            out = cm(*example)
            skip = guard_options("skip-modules")
            unguarded = torch.compile(model, backend=lambda gm, ex: cm, options=skip)
            unguarded(*args)
            row["torch.compile, skip-modules"] = per_call_us(lambda: unguarded(*args))
            row["torch.compile, skip-modules, latency"] = per_call_us(lambda: unguarded(*args), sync_each=True)
            # the bench's own clock (do_bench: an L2 flush before each call, no synchronize between calls)
            row["bench: replay"] = median_ms(lambda: exe.run_static(bound), torch.device(dev)) * 1e3
            row["bench: torch.compile, skip-modules"] = median_ms(lambda: unguarded(*args), torch.device(dev)) * 1e3
            gc.disable()  # is it the collector, in a process whose heap holds a whole compile?
            row["bench: torch.compile, skip-modules, gc off"] = median_ms(lambda: unguarded(*args), torch.device(dev)) * 1e3
            gc.enable()
            if dev == "cuda":  # does a torch.profiler session before (the bench's --profile) slow the host?
                profile_executable(exe, dict(zip(exe.graph.inputs, ins)))
                row["bench: torch.compile, skip-modules, after a profile"] = \
                    median_ms(lambda: unguarded(*args), torch.device(dev)) * 1e3
                row["bench: replay, after a profile"] = median_ms(lambda: exe.run_static(bound), torch.device(dev)) * 1e3
            for guards, opts in (("all", {}), ("skip-modules", skip)):
                trivial = torch.compile(model, backend=lambda gm, ex: (lambda *x: out), **({"options": opts} if opts else {}))
                trivial(*args)
                row[f"trivial backend, {guards}"] = per_call_us(lambda: trivial(*args))
            rows.append(row)
            print(name, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
            if a.out:
                a.out.mkdir(parents=True, exist_ok=True)
                for suffix, call in (("", fn), ("_skip-modules", unguarded)):
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(200):
                        call(*args)
                    _sync()
                    prof.disable()
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
                    (a.out / f"profile_{name}{suffix}.txt").write_text(s.getvalue())
    where = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    print(f"\n{where}, {a.cost} cost, {a.precision}; µs per call in steady state"
          + (", the replay stubbed out (host time only)" if a.stub_replay else ""))
    print("| model | replay | exe(*inputs) | CompiledModule | torch.compile | replay, latency | torch.compile, latency |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['replay']:.1f} | {r['exe(*inputs)']:.1f} | {r['CompiledModule']:.1f} | "
              f"{r['torch.compile']:.1f} | {r['replay, latency']:.1f} | {r['torch.compile, latency']:.1f} |"
              )
    extra = [k for r in rows for k in r if k.startswith(("trivial", "torch.compile, skip", "bench:"))]
    for k in dict.fromkeys(extra):
        print(f"{k}: " + ", ".join(f"{r['model']} {r[k]:.1f}" for r in rows if k in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
