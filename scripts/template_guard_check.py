"""Device check: a measured compile of the flat-K convolution that Triton 3.6 miscompiles on the H100.

Prints each tuning row (schedule, seconds, reason): miscompiled template candidates must fail with
"wrong result" (profiler.template_disagreement), and the compiled model must match onnxruntime.

    PYTHONPATH=. python scripts/template_guard_check.py
"""
import os, sqlite3, sys, tempfile
os.environ.setdefault("TESSERA_TEST_DEVICE", "cuda")  # else the test helpers pick Triton's interpreter
sys.path.insert(0, "tests")
from test_conv_template import conv_relu
import tessera
from tessera.compiler import CompileOptions
from tessera.tolerance import rel_l2
from tessera.verify import run_onnxruntime
import torch

for prec in ("fp32", "fp16"):
    m, feeds = conv_relu(1, 3, 13, 5, 17, (3, 3), seed=6, strides=[2, 1])
    db = tempfile.mktemp(suffix=".db")
    res = tessera.compile_model(m, CompileOptions(cost="measured", db=db, precision=prec, solver="highs"))
    print(prec, "backends", [k.backend for k in res.kernels], "tuning", {k: v for k, v in res.tuning.items() if k in ("measured", "templates_chosen")})
    con = sqlite3.connect(db)
    for row in con.execute("select * from measurements"):
        print("  ", [str(x)[:110] for x in row[-4:]])
    exe = tessera.compile(m, CompileOptions(cost="measured", db=db, precision=prec, solver="highs"), "cuda")
    out = exe(torch.from_numpy(feeds["x"]).cuda())[0].float().cpu().numpy()
    print(prec, "rel L2 vs onnxruntime", rel_l2(out, run_onnxruntime(m, feeds)["out"]))
