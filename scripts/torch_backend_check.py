"""GPU check of the PyTorch entry points (issue 16): torch.compile(backend="tessera") and
tessera.compile(module, inputs) on real models, against eager on fresh random inputs.

    python3 scripts/torch_backend_check.py [--models bert_base,gpt2,resnet50] [--cost analytical] \
        [--precision fp16] [--solver highs] [--json OUT.json]

Correctness only, with the analytical cost by default (no tuning): the compile time and the
GPU time of one replay are printed for orientation, not as a benchmark (bench_suite does that).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tessera  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2  # noqa: E402
from tessera.torch_backend import register  # noqa: E402


def build(name: str) -> tuple[torch.nn.Module, tuple, callable]:
    """(module, example inputs, output -> tensor)."""
    if name == "bert_base":
        from transformers import BertConfig, BertModel
        m = BertModel(BertConfig()).eval()
        ids = torch.randint(0, 30522, (1, 128))
        return m, (ids, torch.ones_like(ids)), lambda o: o.last_hidden_state
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model
        m = GPT2Model(GPT2Config()).eval()
        return m, (torch.randint(0, 50257, (1, 128)),), lambda o: o.last_hidden_state
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50().eval(), (torch.randn(1, 3, 224, 224),), lambda o: o
    raise SystemExit(f"unknown model {name}")


def gpu_ms(fn, args, reps: int = 20) -> float:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn(*args)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="bert_base,gpt2,resnet50")
    ap.add_argument("--cost", default="analytical")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--solver", default="cbc")
    ap.add_argument("--json")
    a = ap.parse_args()
    register()  # tessera from the source tree: no installed entry point
    rows = []
    for name in a.models.split(","):
        torch.manual_seed(0)
        m, ex, pick = build(name)
        m = m.cuda()
        ex = tuple(x.cuda() for x in ex)
        opts = {"cost": a.cost, "precision": a.precision, "solver": a.solver}
        for entry in ("torch.compile", "tessera.compile"):
            torch._dynamo.reset()
            t = time.perf_counter()
            with torch.no_grad():
                f = (torch.compile(m, backend="tessera", options=opts) if entry == "torch.compile"
                     else tessera.compile(m, opts, example_inputs=ex))
                f(*ex)
            compile_s = time.perf_counter() - t
            fresh = tuple(torch.randint_like(x, 0, 1000) if not x.is_floating_point() else torch.randn_like(x)
                          for x in ex)
            if name == "bert_base":
                fresh = (fresh[0], torch.ones_like(fresh[0]))
            with torch.no_grad():
                got, want = pick(f(*fresh)).float(), pick(m(*fresh)).float()
                err = rel_l2(got.double().cpu().numpy(), want.double().cpu().numpy())
                ms = gpu_ms(f, fresh)
                eager = gpu_ms(m, fresh)
            ok = err < TOLERANCE[a.precision]
            rows.append({"model": name, "entry": entry, "compile_s": round(compile_s, 1), "rel_l2": err,
                         "passed": ok, "ms_with_launch": round(ms, 3), "eager_ms_with_launch": round(eager, 3)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'model':10} {'entry':16} {'compile s':>9} {'rel L2':>9} check {'ms':>7} {'eager ms':>8}")
    for r in rows:
        print(f"{r['model']:10} {r['entry']:16} {r['compile_s']:9.1f} {r['rel_l2']:9.1e} "
              f"{'PASS' if r['passed'] else 'FAIL':5} {r['ms_with_launch']:7.3f} {r['eager_ms_with_launch']:8.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
