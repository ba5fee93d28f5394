"""GPU check of shape buckets (issue 16): GPT-2 at sequence lengths 32, 100 and 128 from one artifact.

    python3 scripts/dynamic_check.py --out OUT [--db tuning.db] [--precision fp16] [--solver highs] \
        [--torch-path]

1. The zoo's GPT-2 (seed 0) is exported to ONNX with a dynamic sequence axis.
2. `tessera compile --dynamic input_ids=1:32..128` (buckets 32, 64, 128, measured cost) writes
   one artifact (in a temporary folder; its buckets.json is copied to OUT); the compile time of
   each bucket is recorded.
3. The artifact is loaded once and run at 32, 100 (padded into 128) and 128; each output is
   checked against onnxruntime on the dynamic model at that length.
4. GPU time per call (CUDA events around 50 calls, launch included): the bucketed call, and the
   bucket's own static plan run at the bucket size, to show what padding and the cut cost.
5. With --torch-path: torch.compile(gpt2, backend="tessera", dynamic=True) at the same lengths,
   against eager in float32.

Prints a table last and writes OUT/dynamic_gpt2.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera import zoo  # noqa: E402
from tessera.compiler import CompileOptions  # noqa: E402
from tessera.dynamic import compile_buckets, parse_dynamic, write_buckets  # noqa: E402
from tessera.runtime.buckets import load  # noqa: E402
from tessera.tolerance import TOLERANCE, rel_l2  # noqa: E402
from tessera.verify import run_onnxruntime  # noqa: E402

LENGTHS = (32, 100, 128)


def export_dynamic(model: torch.nn.Module, ids: torch.Tensor, path: Path) -> None:
    seq = torch.export.Dim("seq", min=2, max=1024)
    with torch.no_grad(), zoo._quiet_exporter():
        prog = torch.onnx.export(model, (ids,), dynamo=True, optimize=True, verbose=False,
                                 dynamic_shapes={"input_ids": {1: seq}})
    prog.save(str(path), external_data=False)


def tiny_gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50257, bos_token_id=0, eos_token_id=0,
                                  use_cache=False)
    torch.manual_seed(0)
    return zoo._LastHidden(transformers.GPT2Model(cfg)).eval(), (torch.randint(0, 50257, (1, 128)),)


def per_call_ms(fn, reps: int = 50) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--db")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--torch-path", action="store_true")
    ap.add_argument("--budget-s", type=float, default=380.0, help="skip the torch path after this many seconds")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer GPT-2, analytical cost, CPU: a smoke run")
    a = ap.parse_args()
    start = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tessera-dynamic-"))  # the artifact (GPT-2's weights) stays here
    model, (ids,) = tiny_gpt2() if a.tiny else zoo.make("gpt2", 0)
    onnx_path = work / "gpt2_dynamic.onnx"
    t = time.perf_counter()
    export_dynamic(model, ids, onnx_path)
    export_s = time.perf_counter() - t
    opts = CompileOptions(precision=a.precision, solver=a.solver, db=a.db, cost="analytical" if a.tiny else "auto")
    bucket_s: dict[str, float] = {}
    last = [time.perf_counter()]

    def on_bucket(sizes: dict[str, int], result) -> None:
        now = time.perf_counter()
        bucket_s[str(sizes["seq"])] = round(now - last[0], 1)
        last[0] = now
        print(f"bucket seq={sizes['seq']}: {len(result.plan.kernels)} kernels, {bucket_s[str(sizes['seq'])]} s",
              flush=True)

    compiled = compile_buckets(onnx_path, opts, parse_dynamic(["input_ids=1:32..128"]), on_bucket)
    write_buckets(compiled, work / "gpt2_dynamic")
    shutil.copy(work / "gpt2_dynamic" / "buckets.json", a.out / "buckets.json")
    exe = load(work / "gpt2_dynamic", dev)
    source = compiled.model
    rows = []
    vocab = 50257
    for n in LENGTHS:
        x = torch.randint(0, vocab, (1, n))
        got = exe.run(input_ids=x)
        name = next(iter(got))
        ref = run_onnxruntime(source, {"input_ids": x.numpy()})[name]
        err = rel_l2(got[name].float().cpu().numpy(), ref)
        xd = x.to(dev)
        ms = per_call_ms(lambda: exe.run(input_ids=xd))
        _, key = exe.pick({"input_ids": (1, n)})
        inner = exe.executable(key)
        feeds = inner.prepare_inputs(input_ids=torch.nn.functional.pad(xd, (0, key[0] - n)))
        static_ms = per_call_ms(lambda: inner.run_static(feeds))
        rows.append({"path": "onnx --dynamic", "seq": n, "bucket": key[0], "rel_l2": err,
                     "passed": err < TOLERANCE[a.precision], "ms_call": round(ms, 3), "ms_bucket_plan": round(static_ms, 3)})
        print(json.dumps(rows[-1]), flush=True)
    torch_rows = []
    if a.torch_path and time.perf_counter() - start > a.budget_s:
        print(f"torch path skipped: {time.perf_counter() - start:.0f} s spent (budget {a.budget_s:.0f} s)")
        a.torch_path = False
    if a.torch_path:
        from tessera.torch_backend import register

        register()
        half = (tiny_gpt2() if a.tiny else zoo.make("gpt2", 0))[0].to(dev)
        half = half.half() if a.precision == "fp16" else half
        ref_model = model.to(dev).float()
        t = time.perf_counter()
        f = torch.compile(half, backend="tessera", dynamic=True,
                          options={"precision": a.precision, "solver": a.solver, "db": a.db, "io": "precision",
                                   "cost": opts.cost})
        for n in LENGTHS:
            x = torch.randint(0, vocab, (1, n), device=dev)
            with torch.no_grad():
                t1 = time.perf_counter()
                got = f(x).float()
                first_s = time.perf_counter() - t1
                want = ref_model(x)
                err = rel_l2(got.double().cpu().numpy(), want.double().cpu().numpy())
                ms = per_call_ms(lambda: f(x))
            torch_rows.append({"path": "torch.compile dynamic=True", "seq": n, "rel_l2": err,
                               "passed": err < TOLERANCE[a.precision], "first_call_s": round(first_s, 1),
                               "ms_call": round(ms, 3)})
            print(json.dumps(torch_rows[-1]), flush=True)
        torch_s = time.perf_counter() - t
    doc = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "precision": a.precision, "export_s": round(export_s, 1), "bucket_compile_s": bucket_s,
           "checks": [c.as_dict() for c in compiled.checks], "pads": [d.pad for d in compiled.dims],
           "rows": rows + torch_rows}
    if a.torch_path:
        doc["torch_path_s"] = round(torch_s, 1)
    (a.out / "dynamic_gpt2.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{doc['device']}, {a.precision}; bucket compile s {bucket_s}; padding allowed: {doc['pads']}")
    print(f"{'path':28} {'seq':>4} {'bucket':>6} {'rel L2':>9} check {'ms/call':>8} {'bucket plan ms':>14}")
    for r in rows + torch_rows:
        print(f"{r['path']:28} {r['seq']:4d} {r.get('bucket', '-'):>6} {r['rel_l2']:9.2e} "
              f"{'PASS' if r['passed'] else 'FAIL':5} {r['ms_call']:8.3f} {r.get('ms_bucket_plan', '-'):>14}")
    return 0 if all(r["passed"] for r in rows + torch_rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
