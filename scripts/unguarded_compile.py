# A user's script as written without `if __name__ == "__main__":` (issue 13): a measured compile on
# the GPU, whose profiler workers must start from tessera's own entry point and never import this
# file again. Every top-level line runs once per import, so the marker below printed more than
# once would mean a worker re-ran the script.
#
#     PYTHONPATH=. python scripts/unguarded_compile.py MODEL.onnx   (on a GPU machine)
import os
import sys
import tempfile

import onnx
import torch

import tessera
from tessera.frontend import load
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime

print(f"UNGUARDED-TOP-LEVEL pid={os.getpid()}", flush=True)
model = sys.argv[1]
db = os.path.join(tempfile.mkdtemp(), "tuning.db")
run = tessera.compile(model, tessera.CompileOptions(cost="measured", db=db, precision="fp32"), device="cuda")
feeds = random_inputs(load(model).graph, seed=3)
got = run(*[torch.from_numpy(v) for v in feeds.values()])
ref = run_onnxruntime(onnx.load(model), feeds)
errs = [rel_l2(g.cpu().numpy(), r) for g, r in zip(got, ref.values())]
ok = all(e < TOLERANCE["fp32"] for e in errs)
print(f"measured compile on {torch.cuda.get_device_name()}: rel L2 {max(errs):.2e} -> {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
