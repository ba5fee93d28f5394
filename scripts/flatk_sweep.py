"""The convolution template on the GPU, the flat-K case that fails under many schedules, then
every generator case of tests/test_conv_template.py under its ranked schedule (fp32, fp16).

    TESSERA_TEST_DEVICE=cuda PYTHONPATH=. python scripts/flatk_sweep.py
Result: scripts/results/templates_gpu/flatk_sweep_ec093a5.txt.
"""
import sys, itertools
sys.path.insert(0, "tests")
import numpy as np
from test_conv_template import conv_relu, conv_kernel, run_template, CASES
from tessera.codegen.kernels import ConvSchedule
from tessera.codegen.select import implement
from tessera.cost.schedule_model import rank_templates
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.graph import TensorType
from tessera.rewrite import convert_precision
from tessera.tolerance import rel_l2

def err(model, feeds, s, precision="fp32", layouts=None, show=False):
    g32 = fission(load(model).graph).graph
    g = convert_precision(g32, precision)
    for t, lay in (layouts or {}).items():
        g.types[t] = TensorType(g.types[t].shape, g.types[t].dtype, lay)
    prims, pro, outputs = conv_kernel(g)
    if s is None:
        s = rank_templates(g, pro + prims, outputs, precision)[0]
    ks = implement(g, prims, pro, outputs, "k0_test", ("Conv_0",), s, precision).triton
    env = {**g.constants, **interp.run(g, feeds, keep_all=True)}
    got = run_template(g, ks, env)
    ref = interp.run(g32, feeds, exact=True)
    e = max(rel_l2(got[t], ref[o]) for o, t in zip(g32.outputs, outputs))
    if show:
        bad = np.abs(got[outputs[0]] - ref[g32.outputs[0]]) > 1e-2 * np.abs(ref[g32.outputs[0]]).max()
        print("bad positions (n,o,oh,ow) sample:", np.argwhere(bad)[:20].tolist(), "count", bad.sum(), "of", bad.size)
    return s, e

m, f = conv_relu(1, 3, 13, 5, 17, (3, 3), seed=6, strides=[2, 1])
print(err(m, f, None, "fp32", show=True))
for bm, bn, bk, w, st in itertools.product((16, 32, 64), (16, 32), (16, 32), (1, 2, 4), (1, 2, 3)):
    try:
        s, e = err(m, f, ConvSchedule(bm, bn, bk, w, st, 1), "fp32")
        print(f"m{bm} n{bn} k{bk} w{w} s{st}: {e:.2e}" + ("  BAD" if e > 1e-4 else ""))
    except Exception as ex:
        print(f"m{bm} n{bn} k{bk} w{w} s{st}: ERROR {type(ex).__name__}: {str(ex)[:200]}")
# every generator case under its ranked schedule, fp32 and fp16
for case in CASES:
    n, c, h, w, o, k, attrs, lay, form = case
    mm, ff = conv_relu(n, c, h, w, o, k, seed=3, **attrs)
    for prec in ("fp32", "fp16"):
        try:
            s, e = err(mm, ff, None, prec, layouts={"x": lay, "out": lay} if lay else None)
            print(case[:6], attrs, form, prec, s, f"{e:.2e}", "BAD" if e > (1e-4 if prec == "fp32" else 1e-2) else "")
        except Exception as ex:
            print(case[:6], form, prec, "ERROR", type(ex).__name__, str(ex)[:300])
