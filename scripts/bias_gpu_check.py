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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fuzzcheck  # noqa: E402
import test_bias_rounding as t  # noqa: E402
import test_fuzz  # noqa: E402


def main() -> int:
    failed = 0
    cases = [(f"C from an input, {p}", t.test_a_cancelling_bias_from_an_input_is_added_before_rounding, (c, p))
             for p in ("fp16", "bf16") for c in ((t.N,), (t.M, t.N), (t.M, 1), (1, 1))]
    cases += [("constant C, fp16", t.test_a_cancelling_constant_bias_along_the_rows_is_added_before_rounding, (c,))
              for c in ((t.M, 1), (1, 1), (t.M, t.N))]
    cases += [(f"alpha {al}, {'constant' if k else 'input'} C, fp16", t.test_a_gemms_alpha_scales_the_product_in_the_call,
               (al, k)) for al in (0.5, -2.0) for k in (False, True)]
    cases += [("C from an input, fp16, 17 columns padded to 24",
               t.test_a_bias_from_an_input_is_added_before_rounding_where_the_columns_are_padded, (c,))
              for c in ((512, 17), (512, 1), (17,))]
    cases += [("Conv B from an input, fp16", t.test_a_conv_bias_from_an_input_is_added_before_rounding, (layout,))
              for layout in ("nchw", "nhwc")]
    for what, test, args in cases:
        try:
            test(*args, "cuda")
            print(f"pass  cancelling bias, {what}, {args[0]}, on cuda")
        except AssertionError as e:
            failed += 1
            print(f"FAIL  cancelling bias, {what}, {args[0]}, on cuda: {str(e).splitlines()[0]}")
    outcome = fuzzcheck.check(test_fuzz.REGRESSIONS["fp16_gemm_bias_from_input"], device="cuda")
    print(f"{'pass' if outcome.status == 'pass' else 'FAIL'}  fuzzer regression fp16_gemm_bias_from_input on cuda:",
          outcome.status, outcome.detail, f"err {outcome.err:.2e}")
    return failed + (outcome.status != "pass")


if __name__ == "__main__":
    sys.exit(main())
