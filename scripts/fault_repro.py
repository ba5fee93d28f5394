"""Which part of the tuning's timing makes a chain candidate fault? One pickled kernel job, several ways.

`scripts/fault_check.py --gpu` showed (session 62) that gpt_neox's chain candidate dfe24d15 faults when
timed at 4 warps (an illegal memory access) but runs one launch, and runs timed at 8 warps. This runs
the job (`(mini graph, plan)` pickled by `fault_check.py --save`) in a process per mode, on the GPU:

- `launch-pdl`, `launch-off`: 300 direct launches over three input seeds, with and without PDL;
- `time-pdl`, `time-off`: the tuning's timing (`profiler._time`) with and without PDL;
- `graph-same`: the timing's CUDA graph of launches on one input copy, PDL on.

    python scripts/fault_repro.py JOB.pkl [--configs 4/64/32/128/64/2,8/64/32/128/64/2]  # warps/M/N/L/K/stages
"""
from __future__ import annotations

import argparse
import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

MODES = ["launch-pdl", "launch-off", "time-pdl", "time-off", "graph-same"]


FIELDS = ("num_warps", "block_m", "block_n", "block_l", "block_k", "num_stages")


def one(path: str, mode: str, config: str) -> int:
    os.environ["TESSERA_PDL"] = "0" if mode.endswith("-off") else "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from tessera.cost.profiler import _inputs, _time
    from tessera.runtime.executable import Executable

    mini, plan = pickle.loads(Path(path).read_bytes())
    plan = copy.deepcopy(plan)
    plan["kernels"][0]["schedule"].update(zip(FIELDS, map(int, config.split("/"))))
    try:
        if mode.startswith("time"):
            seconds, why, _ = _time((mini, plan))
            if why:
                print(f"  {mode} {config}: {why[:160]}")
                return 3
            print(f"  {mode} {config}: ran, {seconds * 1e6:.2f} us per launch")
            return 0
        exe = Executable(mini, plan, "cuda", cuda_graph=False)
        feeds = [_inputs(mini, "cuda", s) for s in range(3)]
        if mode == "graph-same":
            exe._launch(feeds[0])
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    exe._launch(feeds[0])
            for _ in range(20):
                g.replay()
        else:
            for i in range(300):
                exe._launch(feeds[i % 3])
        torch.cuda.synchronize()
        print(f"  {mode} {config}: ran (pdl {exe.steps[0].kernel.pdl})")
        return 0
    except Exception as e:  # noqa: BLE001 - the fault is the answer
        print(f"  {mode} {config}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return 3


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        return one(sys.argv[2], sys.argv[3], sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job")
    ap.add_argument("--configs", default="4/64/32/128/64/2,8/64/32/128/64/2,4/32/32/128/64/2",
                    help="warps/BLOCK_M/BLOCK_N/BLOCK_L/BLOCK_K/stages, comma-separated")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    for config in args.configs.split(","):
        for mode in args.modes.split(","):
            r = subprocess.run([sys.executable, __file__, "--one", args.job, mode, config], timeout=300,
                               capture_output=True, text=True)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")]
            print(lines[-1] if lines else f"  {mode} {config}: exit {r.returncode} {r.stderr.strip()[-200:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
