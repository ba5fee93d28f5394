"""Run the CUDA cases of tests/test_bias_rounding.py and the fuzzer's fp16 Gemm regression on a GPU
machine that has highspy but not pulp (the GPU machine of docs/benchmarks.md): both compile with the
default solver (CBC through pulp), so this makes HiGHS the default (TESSERA_SOLVER, read when tessera
is imported).

    PYTHONPATH=.:tests python3 scripts/bias_gpu_check.py
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TESSERA_SOLVER", "highs")  # before tessera is imported
tests = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(tests))

import fuzzcheck  # noqa: E402
import pytest  # noqa: E402
import fuzzregressions  # noqa: E402


def main() -> int:
    # every CUDA case of the test module, as its own parametrization names them
    failed = pytest.main(["-q", "-p", "no:cacheprovider", "-k", "cuda", str(tests / "test_bias_rounding.py")])
    outcome = fuzzcheck.check(fuzzregressions.REGRESSIONS["fp16_gemm_bias_from_input"], device="cuda")
    print(f"{'pass' if outcome.status == 'pass' else 'FAIL'}  fuzzer regression fp16_gemm_bias_from_input on cuda:",
          outcome.status, outcome.detail, f"err {outcome.err:.2e}")
    return int(failed != 0) + (outcome.status != "pass")


if __name__ == "__main__":
    sys.exit(main())
