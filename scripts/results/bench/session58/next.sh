#!/bin/bash
# Session 58's device calls: `bash scripts/results/bench/session58/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders); call 3 also .pinold (the same of 70caa64).
# 1: session 57's call 4: the GPU tests of the column-slice and norm templates (the harness fix after 4997f90),
#    then llama fp16 at HEAD (replay its log with scripts/replay_tuning.py --grep reduce_sum,matmul,sigmoid for
#    the one-walk RMSNorm with per-row sums, against session 57's 6.27 us).
# 2: session 57's call 5: llama fp16 with windows of 4000 states (fewer partition cuts) beside eager.
# 3: the rotary epilogue (q's and k's rotation in the QKV projection's template): its tests on the GPU, then
#    llama fp16 at HEAD beside eager (call 1: 0.330 ms, 121 kernels), then at 70caa64 (.pinold), the same card.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider \
            tests/test_gated_gemm.py tests/test_norm_prologue.py 2>&1 | tail -3)
        export PROFILE=1; gemms e2e_llama_head llama fp16 200 eager ;;
    2)
        export PROFILE=1 TESSERA_MAX_STATES=4000; gemms e2e_llama_s4000 llama fp16 260 eager ;;
    12)  # both, in one call (the machine goes back after 30 s idle)
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 110 python3 -m pytest -q -p no:cacheprovider \
            tests/test_gated_gemm.py tests/test_norm_prologue.py 2>&1 | tail -3)
        export PROFILE=1; gemms e2e_llama_head llama fp16 190 eager
        TESSERA_MAX_STATES=4000 gemms e2e_llama_s4000 llama fp16 250 eager ;;
    3)  # the rotary epilogue (codegen/rotary.py): its GPU tests, then llama fp16 at HEAD beside eager
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider \
            tests/test_rotary_epilogue.py 2>&1 | tail -3)
        export PROFILE=1; gemms e2e_llama_rot llama fp16 220 eager
        PIN=.pinold gemms e2e_llama_base llama fp16 200 eager ;;
    4)  # call 3 with shorter limits, when little device time is left
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 80 python3 -m pytest -q -p no:cacheprovider \
            tests/test_rotary_epilogue.py 2>&1 | tail -3)
        export PROFILE=1; gemms e2e_llama_rot llama fp16 185 eager
        PIN=.pinold gemms e2e_llama_base llama fp16 185 eager ;;
    5)  # call 4 without the tests (the llama run's check covers the rotary template on the GPU)
        export PROFILE=1; gemms e2e_llama_rot llama fp16 170 eager
        PIN=.pinold gemms e2e_llama_base llama fp16 170 eager ;;
    6)  # call 5 without the baseline, when even less is left (an H100's baseline: call 12)
        export PROFILE=1; gemms e2e_llama_rot llama fp16 170 eager ;;
    *) echo "next.sh: calls 1, 2, 12, 3, 4, 5, 6"; exit 2 ;;
esac
