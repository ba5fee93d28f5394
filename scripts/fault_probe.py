"""Find the kernel of a plan that faults on the GPU, and keep what reproduces it.

    PYTHONPATH=. python3 scripts/fault_probe.py --model gpt2 --db DB --out DIR \
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
from tessera.runtime.executable import KernelFaultError  # noqa: E402
from tessera.torch_backend import tessera_backend  # noqa: E402


def probe(exe: Any, feeds: dict[str, torch.Tensor], out: Path) -> str | None:
    """Run `exe`'s steps once, synchronizing after each (`Executable._run_steps`, as the capture's
    warm-up does); the name of the kernel that faults, with its files under `out`, or None."""
    env = exe._feed_env({k: v.clone() for k, v in feeds.items()})
    try:
        exe._run_steps(range(len(exe.steps)), env, sync_each=True)
    except KernelFaultError as e:
        (out / "error.txt").write_text(f"{e}\n")
        step = next(s for s in exe.steps if s.impl.name == e.kernel)
        if step.kernel is not None:  # its inputs are still in env: a step's are freed after it runs
            ks = step.kernel.ks
            (out / f"{e.kernel}.py").write_text(ks.source)
            args = {t: {"shape": list(v.shape), "stride": list(v.stride()), "dtype": str(v.dtype)}
                    for t, v in env.items() if t in (step.args or ks.inputs)}
            (out / f"{e.kernel}.json").write_text(json.dumps({
                "schedule": ks.schedule.to_json() if hasattr(ks.schedule, "to_json") else str(ks.schedule),
                "launches": [str(x) for x in ks.launches], "inputs": args, "outputs": ks.outputs,
                "prims": ks.prims}, indent=1))
        return e.kernel
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
