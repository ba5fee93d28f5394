#!/bin/bash
# Session 57's device calls: `bash scripts/results/bench/session57/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel), .pin16 (a `git archive` of the commit measured, its hash in
# CODE, without scripts/results' session folders) and, for call 1, .pinold (the same of 3c75790).
# 1: the first GPU run of sessions 55-57's fusions in llama (rotary in the attention chain's loads, norms in
#    the projection's template, the merged gate/up product read through its two column slices with
#    silu(gate) * up in the epilogue): the gated template's tests on the GPU, then llama and gpt2 fp16 at HEAD,
#    then llama at 3c75790, each beside eager (session 54, H200: llama 0.334, gpt2 0.306 ms).
# 2: call 1 without the old llama, when device time is short.
# 3: issue 15's unmet GEMM-chain rows: the first product split over K and summed by float32 atomics
#    (scripts/atomic_pair_probe.py, session 54; checked only in the interpreter).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
gpu_tests() {
    (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -x -p no:cacheprovider \
        tests/test_gated_gemm.py 2>&1 | tail -4)
}
case $1 in
    1)
        gpu_tests
        export PROFILE=1; gemms e2e_llama_new llama fp16 165 eager; gemms e2e_gpt2_new gpt2 fp16 160 eager
        PIN=.pinold gemms e2e_llama_old llama fp16 160 eager ;;
    2)
        gpu_tests
        export PROFILE=1; gemms e2e_llama_new llama fp16 170 eager; gemms e2e_gpt2_new gpt2 fp16 165 eager ;;
    3)
        (cd .pin16 && PYTHONPATH=/tmp/site:$PWD timeout 500 python3 scripts/atomic_pair_probe.py \
            --cases "fp16:7,8,9,10,4,5,6;tf32:5,6" 2>&1 | tee $OUT/atomic_pair.txt | tail -30) ;;
    4)  # for session 58: the GPU tests of the column-slice and norm templates (the harness fix after
        # 4997f90), then llama fp16 at HEAD: replay its log (scripts/replay_tuning.py --grep
        # reduce_sum,matmul,sigmoid) for the one-walk RMSNorm with per-row sums against call 1's 6.27 us
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider \
            tests/test_gated_gemm.py tests/test_norm_prologue.py 2>&1 | tail -3)
        export PROFILE=1; gemms e2e_llama_head llama fp16 170 eager ;;
    5)  # for session 58: llama fp16 with windows of 4000 states (fewer cuts) beside eager
        export PROFILE=1 TESSERA_MAX_STATES=4000; gemms e2e_llama_s4000 llama fp16 230 eager ;;
    *) echo "next.sh: calls 1-5"; exit 2 ;;
esac
