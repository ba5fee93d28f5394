"""GPU: does a collection inside a capture still break it? (session 48, the GPU fuzzer's flaky failure)

Runs fuzz spec `opaque_between_gpu` (a plan with host steps, so a piecewise CUDA graph) on CUDA, drops it, then
runs it again with `gc.collect()` forced inside the second capture. Twice: with the executable held strongly by
its piecewise graph (the cycle before 0daef58) and as the code is now. Also re-checks the fuzzer's failing spec.

    PYTHONPATH=.:tests python3 scripts/results/bench/session48/capture_gc_check.py [SPEC_REPR_FILE]
"""
from __future__ import annotations

import copy
import gc
import sys

import fuzzcheck
import test_fuzz
import torch
from fuzzspec import ConstSpec, GraphSpec, NodeSpec, TensorSpec  # noqa: F401 - the spec's repr names them
from tessera.runtime import executable
from tessera.runtime.executable import Executable, _PiecewiseGraph

SPEC = test_fuzz.GPU_REGRESSIONS["opaque_between_gpu"]
run_steps, init = Executable._run_steps, _PiecewiseGraph.__init__


def trial(strong: bool) -> str:
    def cyclic(self, exe, pieces):  # the executable held back, as before the fix
        init(self, exe, pieces)
        self.exe = lambda: exe

    executable._PiecewiseGraph.__init__ = cyclic if strong else init
    Executable._run_steps = run_steps
    gc.collect()
    first = fuzzcheck.check(copy.deepcopy(SPEC), "cuda")

    def collecting(self, *args, **kwargs):  # the warm-up's steps run before the capture: no collection there
        if torch.cuda.is_current_stream_capturing():
            gc.collect()
        return run_steps(self, *args, **kwargs)

    Executable._run_steps = collecting
    again = fuzzcheck.check(copy.deepcopy(SPEC), "cuda")
    Executable._run_steps, executable._PiecewiseGraph.__init__ = run_steps, init
    return f"first {first.status}; with a collection inside the next capture: {again.status} {again.reason} {again.detail[:120]}"


print("piecewise graph holding its executable (before):", trial(True))
gc.collect()
print("piecewise graph referring weakly (now):        ", trial(False))
if len(sys.argv) > 1:
    spec = eval(open(sys.argv[1]).read())
    print("the fuzzer's spec, 5 runs:", [fuzzcheck.check(copy.deepcopy(spec), "cuda").status for _ in range(5)])
