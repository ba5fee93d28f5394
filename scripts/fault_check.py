"""Was a candidate's GPU fault tessera's addressing or the compiler's? Rerun it on the CPU with every address checked.

A tuning log records a candidate that faulted on the GPU ("the GPU faulted running it": an illegal memory
access) with no time; the compile goes on without it. This replays the run's compile from its log
(`replay_tuning.py`), takes each faulted job, and runs its kernel in Triton's interpreter on the CPU with
every load and store of an active lane checked against the tensors the launch was given (its inputs,
outputs and workspace). It then compares the kernel's outputs with the reference interpreter's. An
address out of range names tessera's index arithmetic; none, with matching outputs, points at the GPU
compile of that schedule (the same source at other tiles or warps ran there).

    python scripts/fault_check.py RUN/tuning.jsonl.gz MODEL.onnx fp16 [--io precision] [--limit 3]
    python scripts/fault_check.py RUN/tuning.jsonl.gz MODEL.onnx fp16 --gpu   # on the GPU machine

`--gpu` runs each faulted kernel on the GPU instead, in a process of its own (a fault loses the CUDA
context), at its schedule and again with each of `--warps` warps, and says which faulted: one launch, then
three timings as the tuning's workers time (the faults of session 60 were in the timing).
"""
from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if "--gpu" not in sys.argv and "--run-one" not in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton.runtime.interpreter as interpreter  # noqa: E402
from replay_tuning import replay  # noqa: E402

from tessera.codegen import launch  # noqa: E402
from tessera.cost.profiler import _inputs, _time, kernel_graph  # noqa: E402
from tessera.ir import interp  # noqa: E402
from tessera.runtime.executable import Executable  # noqa: E402
from tessera.tolerance import rel_l2  # noqa: E402

FAULT = "GPU faulted"


class AddressCheck:
    """Counts active lanes whose address lies outside every tensor of the current launch."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.bad = {"load": 0, "store": 0}
        self.lanes = {"load": 0, "store": 0}

    def install(self) -> None:
        check = self
        call, load, store = (launch.TritonKernel.__call__, interpreter.InterpreterBuilder.create_masked_load,
                             interpreter.InterpreterBuilder.create_masked_store)

        def launched(kernel: Any, *tensors: torch.Tensor) -> None:
            check.ranges = [(t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in tensors]
            if kernel.ks.workspace:  # allocated by the first launch; its range joins from the second
                ws = kernel.workspace
                if ws is not None:
                    check.ranges.append((ws.data_ptr(), ws.data_ptr() + ws.untyped_storage().nbytes()))
            return call(kernel, *tensors)

        def masked_load(builder: Any, ptrs: Any, mask: Any, other: Any, *rest: Any) -> Any:
            check.count("load", ptrs, mask)
            return load(builder, ptrs, mask, other, *rest)

        def masked_store(builder: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
            check.count("store", ptrs, mask)
            return store(builder, ptrs, value, mask, *rest)

        launch.TritonKernel.__call__ = launched
        interpreter.InterpreterBuilder.create_masked_load = masked_load
        interpreter.InterpreterBuilder.create_masked_store = masked_store

    def count(self, kind: str, ptrs: Any, mask: Any) -> None:
        p = np.asarray(ptrs.data).astype(np.uint64)
        active = np.ones(p.shape, bool) if mask is None else np.asarray(mask.data).astype(bool)
        inside = np.zeros(p.shape, bool)
        for lo, hi in self.ranges:
            inside |= (p >= lo) & (p < hi)
        self.lanes[kind] += int(active.sum())
        self.bad[kind] += int((active & ~inside).sum())


def faulted(log: Path) -> set[tuple[str, str]]:
    opener = gzip.open if log.suffix == ".gz" else open
    with opener(log, "rt") as f:
        rows = [json.loads(line) for line in f]
    return {(r["signature"], r["schedule"]) for r in rows if r.get("seconds") is None and FAULT in r.get("reason", "")}


def run_one(path: Path) -> int:
    """In a process of its own: launch the pickled kernel on the GPU once, then time it as the tuning
    did (`profiler._time`: rotated input and weight copies, launches captured in a CUDA graph), where
    session 60's faults happened; exit 0, or 3 on a fault."""
    mini, plan = pickle.loads(path.read_bytes())
    exe = Executable(mini, plan, "cuda", cuda_graph=False)
    try:
        exe._launch(_inputs(mini, "cuda", 0))
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the fault is the answer
        print(f"    one launch: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return 3
    for _ in range(3):
        seconds, why, _stages = _time((mini, plan))
        if why:
            print(f"    timed: {why[:200]}")
            return 3
    print(f"    timed: {seconds * 1e6:.2f} us per launch")
    return 0


def on_gpu(jobs: list[Any], warps: list[int]) -> None:
    for job in jobs:
        mini, plan = kernel_graph(job)
        for w in [None, *warps]:
            p = copy.deepcopy(plan)
            if w is not None:
                p["kernels"][0]["schedule"]["num_warps"] = w
            with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
                f.write(pickle.dumps((mini, p)))
            rc = subprocess.run([sys.executable, __file__, "--run-one", f.name], timeout=300).returncode
            os.unlink(f.name)
            sched = p["kernels"][0]["schedule"]
            print(f"{job.key.signature} {job.key.schedule}{'' if w is None else f' at {w} warps'}: "
                  f"{'FAULT' if rc == 3 else 'ran' if rc == 0 else f'exit {rc}'} ({sched})", flush=True)


def main() -> int:
    if "--run-one" in sys.argv:
        return run_one(Path(sys.argv[sys.argv.index("--run-one") + 1]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("precision")
    ap.add_argument("--io", choices=["precision", "model"], default="precision")
    ap.add_argument("--device", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--limit", type=int, default=3, help="faulted jobs to run (each is an interpreted kernel)")
    ap.add_argument("--gpu", action="store_true", help="run them on the GPU, each launch in a process of its own")
    ap.add_argument("--warps", default="8", help="with --gpu: warps to try each kernel at besides its own")
    args = ap.parse_args()
    want = faulted(args.log)
    print(f"{len(want)} faulted job(s) in the log")
    if not want:
        return 0
    real_available, real_name = torch.cuda.is_available, torch.cuda.get_device_name
    _, prof = replay(args.log, args.model, args.precision, args.io, args.device)
    torch.cuda.is_available, torch.cuda.get_device_name = real_available, real_name
    jobs = list({(j.key.signature, j.key.schedule): j for j, t in prof.jobs
                 if math.isinf(t) and (j.key.signature, j.key.schedule) in want}.values())
    if args.gpu:
        on_gpu(jobs[:args.limit], [int(w) for w in args.warps.split(",") if w])
        return 0
    check = AddressCheck()
    check.install()
    for job in jobs[:args.limit]:
        mini, plan = kernel_graph(job)
        exe = Executable(mini, plan, "cpu", cuda_graph=False)
        feeds = _inputs(mini, "cpu", 0)
        check.bad, check.lanes = {"load": 0, "store": 0}, {"load": 0, "store": 0}
        got = exe._launch(feeds)
        ref = interp.run(mini, {k: v.float().numpy() if v.is_floating_point() else v.numpy()
                                for k, v in feeds.items()}, exact=True)
        errs = [rel_l2(got[o].float().numpy(), ref[o]) for o in mini.outputs]
        print(f"{job.key.schedule} ({len(job.prims)} primitives, {job.key.signature}): out-of-range lanes: "
              f"{check.bad['load']} of {check.lanes['load']} loaded, {check.bad['store']} of {check.lanes['store']} "
              f"stored; rel L2 to the reference {max(errs):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
