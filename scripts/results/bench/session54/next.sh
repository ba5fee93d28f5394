#!/bin/bash
# Session 54's device calls, planned at the end of session 53:
# `bash scripts/results/bench/session54/next.sh N` from the repository root on one nvidia-h200, carrying .whl
# (the highspy wheel; TESSERA_SOLVER=highs), .pin16 (a `git archive` of the commit measured, its hash in CODE,
# without scripts/results' session folders) and, for calls 1-2, .pinold (a `git archive` of ce921fe, the
# greedy partition).
# (Session 54 regrouped the calls to fit its 30 minutes: call 1 = segformer_b0 + gpt2 DP, 2 = gpt2 greedy +
#  resnet50 at 32 items, 3 = llama DP then greedy.)
# 1-2: session 53's partition by dynamic programming against the greedy one, in alternating order so that
#    neither always finds the Triton cache warm (session 53's call 5 compiled the new one first on a cold
#    machine and ran out of time): gpt2 and llama fp16, tessera beside eager only (the A/B is tessera's).
#    On the CPU's analytical cost with templates priced, gpt2 was 2.8% cheaper and llama the same; with
#    measured costs gpt2's estimate was 0.3% dearer (294.2 against 293.3 us).
# 3: resnet50 at 32 items, fp16, beside eager and Inductor (planned in session 53, not run).
# 4: segformer_b0 fp16 beside eager and Inductor: session 53 keeps a Resize's blend weights float32 in
#    fp16/bf16 plans (7b81870); its bilinear upsampling computed them from their closed form in fp16 before
#    (session 46: 0.380 ms, Inductor 0.708).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)  # session 54 ran segformer_b0 first (issue 15's end-to-end row), then the new partition's gpt2
        export PROFILE=1; gemms e2e_segformer segformer_b0 fp16 300 eager,inductor
        gemms e2e_gpt2_dp gpt2 fp16 200 eager ;;
    2)
        export PROFILE=1; PIN=.pinold gemms e2e_gpt2_greedy gpt2 fp16 200 eager
        BATCH=32 gemms e2e_resnet50_b32 resnet50 fp16 360 eager,inductor ;;
    3)
        export PROFILE=1; gemms e2e_llama_dp llama fp16 220 eager; PIN=.pinold gemms e2e_llama_greedy llama fp16 220 eager ;;
    4)  # after d32a46e (weights timed cold whatever the kernel's size): gpt2 and llama again, and the GPU profiler tests
        export PROFILE=1; gemms e2e_gpt2_cold gpt2 fp16 190 eager,inductor; gemms e2e_llama_cold llama fp16 210 eager
        (cd .pin16 && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m pytest -q -x tests/test_profiler_gpu.py \
            tests/test_timing_rotation.py 2>&1 | tail -5) ;;
    *) echo "next.sh: calls 1-4"; exit 2 ;;
esac
