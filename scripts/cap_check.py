"""Plans under two candidate caps (primitives per kernel), analytical cost, on the CPU.

    python scripts/cap_check.py --models ../shared/models/candy_small.onnx,zoo:gpt2 --caps 12,16

For each model and cap: kernels, candidates, subgraphs and cuts (a subgraph with too many
candidates is split), the analytical estimate and the compile time. What a larger cap buys
in fusion, and what it costs in candidates (tuning time) and in cuts.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="comma-separated ONNX paths or zoo:NAME")
    ap.add_argument("--caps", default="12,16")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--zoo-dir", type=Path, default=Path(tempfile.gettempdir()) / "tessera-zoo")
    a = ap.parse_args()
    from tessera.compiler import CompileOptions, compile_model
    from tessera.zoo import build

    a.zoo_dir.mkdir(parents=True, exist_ok=True)
    print("| model | cap | kernels | candidates | subgraphs | cuts | estimated us | compile s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in a.models.split(","):
        path = Path(spec)
        if spec.startswith("zoo:"):
            path = a.zoo_dir / f"{spec[4:]}.onnx"
            if not path.exists():
                build(spec[4:], a.zoo_dir)
        for cap in (int(c) for c in a.caps.split(",")):
            t = time.perf_counter()
            plan = compile_model(path, CompileOptions(cost="analytical", max_kernel_nodes=cap,
                                                      precision=a.precision)).plan
            print(f"| {path.stem} | {cap} | {len(plan.kernels)} | {sum(s.candidates for s in plan.subgraphs)} | "
                  f"{len(plan.subgraphs)} | {len(plan.cuts)} | {plan.estimated_total_s * 1e6:.1f} | "
                  f"{time.perf_counter() - t:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
