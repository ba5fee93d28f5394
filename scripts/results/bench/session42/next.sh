#!/bin/bash
# Session 42's device calls: `bash scripts/results/bench/session42/next.sh N` on nvidia-h200-x2 (two GPUs: one
# precision or model set each, run side by side), carrying .whl and .pin16 (rebuilt from HEAD first, as
# ../session34/next.sh says). The first H200 runs of issue 15's table.
# 1: the twelve GEMM chains, then attention S1-S9 (beside eager, SDPA and Inductor): fp16 on GPU 0, tf32 on GPU 1.
#    Times 67f1f20 (rewrite windows priced tuned) and 3198f55 (the chain walk moves row and column blocks);
#    attention fp16 last ran in session 14.
# 2: issue 15's end-to-end rows, fp16, cold, beside eager and Inductor, kernels profiled: bert_base and gpt2 on
#    GPU 0, segformer_b0 on GPU 1 (session 18's form).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms` and `models`
on_gpu() {  # on_gpu GPU LOG COMMAND...: one runner on one GPU, in the background
    local gpu=$1 log=$2; shift 2
    (export CUDA_VISIBLE_DEVICES=$gpu; "$@") > "$OUT/$log" 2>&1 &
}
case $1 in
    1)
        on_gpu 0 fp16.txt eval 'gemms gfp16 "$(echo gemm_g{1..12} | tr " " ,)" fp16 270;
                                gemms afp16 "$(echo attn_s{1..9} | tr " " ,)" fp16 250 eager,sdpa,inductor'
        on_gpu 1 tf32.txt eval 'gemms gtf32 "$(echo gemm_g{1..12} | tr " " ,)" tf32 270;
                                gemms atf32 "$(echo attn_s{1..9} | tr " " ,)" tf32 250 eager,sdpa,inductor'
        wait; cat "$OUT/fp16.txt" "$OUT/tf32.txt" ;;
    2)
        export PROFILE=1
        on_gpu 0 e2e_a.txt gemms e2e_a bert_base,gpt2 fp16 480 eager,inductor
        on_gpu 1 e2e_b.txt gemms e2e_b segformer_b0 fp16 480 eager,inductor
        wait; cat "$OUT/e2e_a.txt" "$OUT/e2e_b.txt" ;;
    *) echo "next.sh: call 1 or 2"; exit 2 ;;
esac
