#!/bin/bash
# The tests that need CUDA, on a GPU machine: each file with CUDA cases in a pytest process of its own (a file's
# failures are printed even if a later one hangs), then the generated-kernel tests compiled for the GPU
# (tests/kernelcheck.py picks CUDA where there is one). Writes one log a file to DIR and prints a summary.
#
#     bash scripts/gpu_tests.sh [DIR] [SECONDS_PER_FILE]        # defaults: /tmp/gpu_tests, 150
#
# Tests read ../shared/models; TESSERA_SOLVER=highs where CBC (pulp) is missing.
out=${1:-/tmp/gpu_tests}
limit=${2:-150}
mkdir -p "$out"
unset TESSERA_LOG  # its handler would outlive pytest's captured streams
for f in test_runtime_gpu test_profiler_gpu test_bias_rounding test_tf32_rounding test_workers test_profile \
         test_runtime test_bad_inputs test_torch_prims test_layout test_graphs test_cli test_bench test_rewrite_search \
         test_fuzz "test_gemm_template test_gemm_template_wiring test_conv_template test_chain test_codegen_kernels test_tables"; do
    name=${f%% *}
    files=$(printf 'tests/%s.py ' $f)
    timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short $files > "$out/$name.txt" 2>&1
    echo "$name (rc $?): $(tail -n 1 "$out/$name.txt")"
done
grep -h "^FAILED\|^ERROR" "$out"/*.txt | cut -c1-200 | head -40
