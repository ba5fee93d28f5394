#!/bin/bash
# Session 56's device calls (session 55's, none of which ran):
# `bash scripts/results/bench/session55/next.sh N` from the repository root on one nvidia-h200, carrying .whl
# (the highspy wheel; TESSERA_SOLVER=highs), .pin16 (a `git archive` of the commit measured, its hash in CODE,
# without scripts/results' session folders) and, for calls 1-2, .pinold: a `git archive` of branch
# ab-greedy-timing2 (the greedy partition of ce921fe with d32a46e's and 767b73a's cold-weight timing; the
# branch lives only in the checkout that made it: README.md here says how to make it again, then
# `rm -rf .pinold && mkdir .pinold && git archive ab-greedy-timing2 | tar -x -C .pinold` and its hash in
# .pinold/CODE). Nothing ran in session 55 (no machine started); the calls carried over to session 56.
# 1-2: the partition A/B (gpt2, then llama) that session 54 could not settle: with the old timing the greedy partition won (gpt2
#    0.306 against 0.318 ms, llama 0.345 against 0.356) because one schedule's weight was timed hot; with the
#    cold-weight timing the DP partition ran gpt2 0.306 and llama 0.334. This runs both partitions under the
#    new timing, alternating which compiles first.
# 3: issue 15's end-to-end rows at HEAD after the cold-weight timing and the float32 internal sums: bert_base
#    and gpt2 at 8 items beside eager and Inductor (session 53: 0.331 ms, 1.69x; 0.605 ms, 1.11x).
# 5: a new form for issue 15's GEMM chains (atomic_pair_probe.py); run it first if device time is short.
# 6: fp16 G4-G10 and tf32 G5-G6 at HEAD (written in session 55, when an H100 was lent for the first time since
#    session 41).
# 7: llama with the rotary fusion (ae92e34) against 3c75790 (.pinold rebuilt from 3c75790 for this call).
# 4: llama at 8 items beside eager and Inductor (session 53: 0.576 ms, 1.38x) and segformer_b0 (0.383 ms).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        export PROFILE=1; PIN=.pinold gemms e2e_gpt2_greedy gpt2 fp16 170 eager; gemms e2e_gpt2_dp gpt2 fp16 170 eager ;;
    2)
        export PROFILE=1; gemms e2e_llama_dp llama fp16 160 eager; PIN=.pinold gemms e2e_llama_greedy llama fp16 160 eager ;;
    3)
        export PROFILE=1; gemms e2e_bert bert_base fp16 200 eager,inductor
        BATCH=8 gemms e2e_gpt2_b8 gpt2 fp16 250 eager,inductor ;;
    4)
        export PROFILE=1; BATCH=8 gemms e2e_llama_b8 llama fp16 220 eager,inductor
        gemms e2e_segformer segformer_b0 fp16 300 eager,inductor ;;
    5)  # issue 15's unmet GEMM-chain rows: the first product split over K and summed by float32 atomics into
        # buffers the calls keep zeroed (scripts/atomic_pair_probe.py, written in session 54, checked only in
        # the interpreter). A row under 0.67 of eager is worth a template form; else it joins the forms tried.
        (cd .pin16 && PYTHONPATH=/tmp/site:$PWD timeout 540 python3 scripts/atomic_pair_probe.py \
            --cases "fp16:7,8,9,10,4,5,6;tf32:5,6" 2>&1 | tee $OUT/atomic_pair.txt | tail -30) ;;
    6)  # the unmet GEMM-chain rows at HEAD on whatever card comes (the last H100 table is session 41's)
        gemms gfp16 "$(echo gemm_g{4..10} | tr ' ' ,)" fp16 330
        gemms gtf32 gemm_g5,gemm_g6 tf32 150 ;;
    7)  # ae92e34's rotary fusion (GEMM chains compute their operands' prologue): llama at HEAD, then at
        # 3c75790 (.pinold rebuilt from it), each beside eager
        export PROFILE=1; gemms e2e_llama_new llama fp16 170 eager; PIN=.pinold gemms e2e_llama_old llama fp16 170 eager ;;
    9)  # session 56: the norm prologue (1040977) with the rotary fusion: llama and gpt2 at HEAD, then llama
        # at 3c75790 (.pinold), each beside eager (gpt2 against session 54's 0.306 ms at 3865c9e)
        export PROFILE=1; gemms e2e_llama_new llama fp16 165 eager; gemms e2e_gpt2_new gpt2 fp16 165 eager
        PIN=.pinold gemms e2e_llama_old llama fp16 165 eager ;;
    10)  # call 9 without the old llama (set against session 54's H200 rows: llama 0.334, gpt2 0.306 ms)
        export PROFILE=1; gemms e2e_llama_new llama fp16 165 eager; gemms e2e_gpt2_new gpt2 fp16 165 eager ;;
    11)  # call 8 in less device time
        export PROFILE=1; gemms e2e_llama_new llama fp16 160 eager ;;
    8)  # call 7's first half alone, when little device time is left: llama at HEAD beside eager (set
        # against session 54's 0.334 ms at d32a46e, the same protocol on an H200)
        export PROFILE=1; gemms e2e_llama_new llama fp16 200 eager ;;
    *) echo "next.sh: calls 1-11"; exit 2 ;;
esac
