"""Find the kernel of a plan that faults on the GPU, and keep what reproduces it.

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python3 scripts/fault_probe.py --model gpt2 --db DB --out DIR \
        [--precision fp16] [--io model]

Compiles the zoo model's PyTorch module through `torch.compile(backend="tessera")` with the given
options (as `scripts/recompile_time.py` does), then runs the plan kernel by kernel, synchronizing
after each one, so a fault is reported by the kernel that made it and not by a later launch (CUDA
reports an illegal address at the next call into the driver). On a fault it writes the plan
(`plan.json`), the faulting kernel's Triton source, its schedule and the shapes and strides of its
arguments under --out, and exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera import zoo  # noqa: E402
from tessera.torch_backend import tessera_backend  # noqa: E402


def probe(exe: Any, feeds: dict[str, torch.Tensor], out: Path) -> str | None:
    """Run `exe`'s steps one at a time; the name of the first that fails, with its files under `out`."""
    env = exe._feed_env({k: v.clone() for k, v in feeds.items()})
    for step in exe.steps:
        try:
            exe.run_step(step, env)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - the point is to record whatever it was
            name = step.impl.name
            (out / "error.txt").write_text(f"{name}: {type(e).__name__}: {e}\n")
            if step.kernel is not None:
                ks = step.kernel.ks
                (out / f"{name}.py").write_text(ks.source)
                args = {t: {"shape": list(v.shape), "stride": list(v.stride()), "dtype": str(v.dtype)}
                        for t, v in env.items() if t in (step.args or ks.inputs)}
                (out / f"{name}.json").write_text(json.dumps({
                    "schedule": ks.schedule.to_json() if hasattr(ks.schedule, "to_json") else str(ks.schedule),
                    "launches": [str(x) for x in ks.launches], "inputs": args, "outputs": ks.outputs,
                    "prims": ks.prims}, indent=1))
            return name
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--db", required=True)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--io", default="model")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ["TESSERA_CACHE"] = tempfile.mkdtemp(prefix="tessera-cache-")
    torch.manual_seed(0)
    model, args = getattr(zoo, a.model)()
    model = model.eval().cuda()
    args = tuple(x.cuda() for x in args)
    options = {"precision": a.precision, "cost": "measured", "solver": a.solver, "db": a.db, "io": a.io}
    compiled: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        compiled.append((tessera_backend(gm, example_inputs, options=options), list(example_inputs)))
        return lambda *x: gm(*x)  # eager answers; the plan runs below, step by step

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(*args)
        for i, (c, example) in enumerate(compiled):
            exe = c.exe
            (a.out / f"plan_{i}.json").write_text(json.dumps(exe.plan, indent=1, default=str))
            ins = [example[j] for j in c.bridge.inputs]
            with exe.precision_flags():
                bad = probe(exe, exe.prepare_inputs(*ins), a.out)
            print(f"graph {i}: {len(exe.steps)} kernels, " + (f"FAULT in {bad}" if bad else "every kernel ran"))
            if bad:
                print((a.out / "error.txt").read_text())
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
