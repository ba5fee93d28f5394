"""How long `torch.compile(model, backend="tessera")` takes, cold and warm (issue 16: a warm
recompile with the tuning cache takes <= 10 s).

    PYTHONPATH=. python3 scripts/recompile_time.py [--models bert_base,gpt2,resnet50] [--cost measured] \
        [--db tuning.db] [--precision fp16] [--compile-only] [--json OUT.json]

Per model, from an empty plan cache (a fresh $TESSERA_CACHE): a first compile ("cold": the tuning
database may already hold its kernels), then `torch._dynamo.reset()` and the same again ("warm":
the plan comes from the plan cache, as after a guard failure, a reset or in a new process). Each
row is the wall time from `torch.compile` to the first output, split into tessera's backend (its
stages, `CompiledModule.stages`), the first call of the compiled graph (kernel loads, the CUDA
graph's capture) and the rest (dynamo's capture and guards). `--compile-only` answers the first
call with eager PyTorch: on a CPU the compiled graph would run through Triton's interpreter, which
says nothing about a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera import zoo  # noqa: E402
from tessera.torch_backend import tessera_backend  # noqa: E402


def one_compile(model: torch.nn.Module, args: tuple, options: dict[str, Any], compile_only: bool) -> dict[str, Any]:
    """torch.compile with tessera as its backend, timed to the first output."""
    row: dict[str, Any] = {"backend_s": 0.0, "first_call_s": 0.0, "graphs": 0, "stages": {}, "plan_cache": []}

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        t = time.perf_counter()
        compiled = tessera_backend(gm, example_inputs, options=options)
        row["backend_s"] += time.perf_counter() - t
        row["graphs"] += 1
        for k, v in getattr(compiled, "stages", {}).items():
            row["stages"][k] = row["stages"].get(k, 0.0) + v
        row["plan_cache"].append(getattr(compiled, "result", 0) is None)
        first = [True]

        def call(*a: Any) -> Any:
            if not first[0]:
                return compiled(*a)
            first[0] = False
            t = time.perf_counter()
            out = gm(*a) if compile_only else compiled(*a)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            row["first_call_s"] += time.perf_counter() - t
            return out
        return call

    torch._dynamo.reset()
    t = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*args)
    row["total_s"] = time.perf_counter() - t
    row["dynamo_s"] = row["total_s"] - row["backend_s"] - row["first_call_s"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert_base,gpt2,resnet50")
    ap.add_argument("--cost", default="analytical")
    ap.add_argument("--db", help="tuning database (measured cost)")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--compile-only", action="store_true", help="answer the first call with eager PyTorch")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    os.environ["TESSERA_CACHE"] = tempfile.mkdtemp(prefix="tessera-cache-")  # an empty plan cache
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    options = {"precision": a.precision, "cost": a.cost, "solver": a.solver, **({"db": a.db} if a.db else {})}
    rows = []
    for name in a.models.split(","):
        torch.manual_seed(0)
        model, args = getattr(zoo, name)()
        model = model.eval().to(dev)
        args = tuple(x.to(dev) for x in args)
        for kind in ("cold", "warm"):
            row = {"model": name, "kind": kind, **one_compile(model, args, options, a.compile_only)}
            rows.append(row)
            print(f"{name} {kind}: {row['total_s']:.1f} s ({'; '.join(f'{k} {v:.2f}' for k, v in row['stages'].items())})",
                  flush=True)
    device = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"\n{device}, torch {torch.__version__}, {a.cost} cost, {a.precision}"
          + (", first call in eager" if a.compile_only else ""))
    print("| model | compile | total s | dynamo s | tessera backend s | first call s | plan cache hit |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['kind']} | {r['total_s']:.1f} | {r['dynamo_s']:.1f} | {r['backend_s']:.1f} | "
              f"{r['first_call_s']:.1f} | {all(r['plan_cache']) if r['plan_cache'] else '-'} |")
    if a.json:
        a.json.write_text(json.dumps({"device": device, "torch": torch.__version__, "options": options,
                                      "compile_only": a.compile_only, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
