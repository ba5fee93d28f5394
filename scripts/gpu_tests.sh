#!/bin/bash
# The tests that need CUDA, on a GPU machine: each file with CUDA cases in a pytest process of its own (a file's
# failures are printed even if another one hangs), JOBS files at a time, the last group being the generated-kernel
# tests compiled for the GPU (tests/kernelcheck.py picks CUDA where there is one). Writes one log a file to DIR and
# prints a summary.
#
#     bash scripts/gpu_tests.sh [DIR] [SECONDS_PER_FILE] [JOBS] [GROUP...]  # defaults: /tmp/gpu_tests, 150, 4, all
#
# A GROUP is a quoted list of test module names run in one process ("test_runtime", "test_chain test_tables").
#
# Tests read ../shared/models; TESSERA_SOLVER=highs where CBC (pulp) is missing. No timing is asserted, so files
# sharing the GPU only slows them.
out=${1:-/tmp/gpu_tests}
limit=${2:-150}
jobs=${3:-4}
mkdir -p "$out"
unset TESSERA_LOG  # its handler would outlive pytest's captured streams
one() {  # one group of test files: "name file..."
    name=${1%% *}
    files=$(printf 'tests/%s.py ' $1)
    timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short $files > "$out/$name.txt" 2>&1
    echo "$name (rc $?): $(tail -n 1 "$out/$name.txt")"
}
export -f one; export out limit
groups=("${@:4}")
[ ${#groups[@]} -gt 0 ] || groups=("test_gemm_template test_gemm_template_wiring test_conv_template test_chain test_codegen_kernels test_tables" \
    test_runtime test_fuzz test_cli test_runtime_gpu test_profiler_gpu test_bias_rounding test_tf32_rounding \
    test_workers test_profile test_bad_inputs test_torch_prims test_layout test_graphs test_bench test_rewrite_search)
printf '%s\n' "${groups[@]}" | xargs -P "$jobs" -I{} bash -c 'one "{}"'
grep -h "^FAILED\|^ERROR" "$out"/*.txt | cut -c1-200 | head -40
