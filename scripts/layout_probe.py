"""Compare plan variants of one model on the GPU: what the layout and split choices really cost.

    PYTHONPATH=. python scripts/layout_probe.py --out $OUT \
        "candy fp16 auto" "candy fp16 auto tessera.orchestrate.layout.MIN_ROW=2048" \
        "efficientvit_b0 fp16 nhwc"

Each spec is `ZOO_MODEL PRECISION LAYOUT [module.ATTR=VALUE ...]`: the model is compiled with
measured tuning (one fresh database per model, shared by its variants, so a convolution is timed
once), checked against onnxruntime, timed by CUDA-graph replay (`tessera.bench.median_ms`) and
profiled kernel by kernel (`runtime/profile.py`). The overrides set module constants for that
variant only. Prints a table last and writes layout_probe.json.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _override(spec: str) -> tuple[object, str, object]:
    target, value = spec.split("=", 1)
    mod, attr = target.rsplit(".", 1)
    return importlib.import_module(mod), attr, json.loads(value)


def probe(model: str, precision: str, layout: str, overrides: list[str], db: str, built: dict[str, Path]) -> dict:
    import torch

    from tessera.bench import _check, _set_precision, median_ms
    from tessera.compiler import CompileOptions, compile_model, plan_document
    from tessera.frontend import load as frontend_load
    from tessera.runtime.executable import Executable
    from tessera.runtime.profile import profile_executable
    from tessera.verify import random_inputs, run_onnxruntime
    from tessera.zoo import build

    if model not in built:
        built[model] = build(model, Path(tempfile.mkdtemp()))
    path = built[model]
    saved = []
    for spec in overrides:
        mod, attr, value = _override(spec)
        saved.append((mod, attr, getattr(mod, attr)))
        setattr(mod, attr, value)
    try:
        _set_precision(precision)
        t0 = time.perf_counter()
        result = compile_model(path, CompileOptions(precision=precision, cost="measured", db=db, layout=layout))
        compile_s = time.perf_counter() - t0
        exe = Executable(result.graph, plan_document(result), torch.device("cuda"))
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)
    loaded = frontend_load(path)
    feeds_np = random_inputs(loaded.graph, 0)
    ref = run_onnxruntime(loaded.model, feeds_np)
    feeds = exe.prepare_inputs(**{k: torch.from_numpy(v) for k, v in feeds_np.items()})
    got = exe.run_static(feeds)
    err, ok = _check([got[n] for n in exe.output_names], ref, exe.output_names, precision)
    ms = median_ms(lambda: exe.run_static(feeds), torch.device("cuda"))
    prof = profile_executable(exe, feeds, 30).to_json()
    return {"model": model, "precision": precision, "layout": layout, "overrides": overrides, "ms": ms,
            "rel_l2": err, "passed": ok, "compile_s": round(compile_s, 1), "kernels": len(exe.steps),
            "layout_summary": result.layouts.summary(), "run_profile": prof}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, built, dbs = [], {}, {}
    for spec in args.specs:
        model, precision, layout, *overrides = spec.split()
        db = dbs.setdefault(model, str(Path(tempfile.mkdtemp()) / "tuning.db"))
        try:
            rows.append(probe(model, precision, layout, overrides, db, built))
        except Exception as e:  # noqa: BLE001 - one failed variant must not lose the others
            rows.append({"model": model, "precision": precision, "layout": layout, "overrides": overrides,
                         "error": f"{type(e).__name__}: {e}"[:400]})
        (args.out / "layout_probe.json").write_text(json.dumps(rows, indent=1))
        r = rows[-1]
        print(json.dumps({k: v for k, v in r.items() if k != "run_profile"}), flush=True)
    print("\n| variant | ms | check | kernels | generated µs | conv µs | gemm µs | copies µs | misaligned µs |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        name = " ".join([r["model"], r["precision"], r["layout"], *r["overrides"]])
        if "error" in r:
            print(f"| {name} | error: {r['error'][:80]} |")
            continue
        k = r["run_profile"]["by_kind"]
        print(f"| {name} | {r['ms']:.3f} | {'ok' if r['passed'] else 'FAIL'} {r['rel_l2']:.1e} | {r['kernels']} | "
              f"{k.get('generated', 0):.1f} | {k.get('library conv', 0):.1f} | {k.get('library GEMM', 0):.1f} | "
              f"{r['run_profile']['layout_copy_us']:.1f} | {r['run_profile']['misaligned_gemm_us']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
