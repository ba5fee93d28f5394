#!/bin/bash
# Session 53's device calls, planned at the end of session 52:
# `bash scripts/results/bench/session53/next.sh N` from the repository root on one nvidia-h200, carrying .whl
# (the highspy wheel; TESSERA_SOLVER=highs), .pin16 (a `git archive` of the commit measured, its hash in CODE,
# without scripts/results' session folders) and, for call 1, carry/e (gemm_g1, gpt2_tiny, bert_tiny).
# 1: session 52's orchestration change (`candidates.starts_short`: a memory-bound kernel takes in the
#    lookups, reshapes, broadcasts and slices of outside values it reads) under measured costs: CANINE and
#    three embedding models exported there, compiled cold with the measured cost and checked in fp16, with
#    each compile's seconds (CANINE compiled in 30.5 s in session 52's call 2, with the analytical cost).
# 2: gpt2 and bert_base fp16 cold beside eager and Inductor, to set beside session 48 (0.318 and 0.331 ms
#    at baba24b): the same plans or better after the candidate rule.
# 3: larger batches (session 52 added `--batch`; bert_base at 8 ran 1.26x the best peer): gpt2 and llama
#    at 8 items, fp16.
# 4: resnet50 at 32 items, fp16.
# 5: llama fp16 with the partition's state bound at 2000 and at 4000 (TESSERA_MAX_STATES): on the CPU's
#    analytical estimate 4000 is 13% cheaper (one subgraph a decoder layer, docs/orchestration.md).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        rm -rf /tmp/az53 && python3 scripts/arch_zoo.py /tmp/az53 --models canine,bert,xlm_roberta,llama \
            > "$OUT/arch_export.txt" 2>&1; echo "export rc=$?"
        timeout 480 python3 scripts/check_models.py /tmp/az53 --precision fp16 --cost measured --timeout 200 \
            --budget-s 450 --out "$OUT/arch_check_fp16.json" > "$OUT/arch_check_fp16.txt" 2>&1; echo "check rc=$?"
        grep "^|" "$OUT/arch_check_fp16.txt" ;;
    2)
        export PROFILE=1; gemms e2e_gpt2 gpt2 fp16 270 eager,inductor; gemms e2e_bert bert_base fp16 270 eager,inductor ;;
    3)
        export PROFILE=1 BATCH=8; gemms e2e_gpt2_b8 gpt2 fp16 280 eager,inductor; gemms e2e_llama_b8 llama fp16 280 eager,inductor ;;
    4)
        export PROFILE=1 BATCH=32; gemms e2e_resnet50_b32 resnet50 fp16 500 eager,inductor ;;
    5)  # the state bound: llama fp16 at 2000 (the default) and at 4000, one after the other
        export PROFILE=1; gemms e2e_llama_2000 llama fp16 280 eager,inductor
        TESSERA_MAX_STATES=4000 gemms e2e_llama_4000 llama fp16 280 eager,inductor ;;
    *) echo "next.sh: calls 1-5"; exit 2 ;;
esac
