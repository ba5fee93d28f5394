#!/bin/bash
# Session 42's device calls: `bash scripts/results/bench/session42/next.sh N` on nvidia-h200-x2 (two GPUs: one
# precision or model set each, run side by side), carrying .whl and .pin16 (rebuilt from HEAD first, as
# ../session34/next.sh says). The first H200 runs of issue 15's table.
# 1: the twelve GEMM chains, then attention S1-S9 (beside eager, SDPA and Inductor): fp16 on GPU 0, tf32 on GPU 1.
#    Times 67f1f20 (rewrite windows priced tuned) and 3198f55 (the chain walk moves row and column blocks);
#    attention fp16 last ran in session 14.
# 2: issue 15's end-to-end rows, fp16, cold, beside eager and Inductor, kernels profiled (session 18's form):
#    gpt2 on GPU 0, bert_base on GPU 1. (Call 1's compiles took about twice the H100's: one model a GPU.)
# 3: what call 1's timeouts left (G10-G12, attention S7-S9, both precisions) on GPU 1; segformer_b0 as 2 on GPU 0.
# 4: after the chain cores' warp twins (call 1's attn_s6 tf32 lost its chain kernel in the solve): attention
#    S6, S2, S9 tf32 on GPU 0; S9 (not reached in calls 1 and 3), S6, S3 fp16 on GPU 1.
# 5: the same code on the GEMM chains whose plans hold a chain kernel (G1-G3, G7, G9), fp16 on GPU 0, tf32 on 1.
# Next session (rebuild .pin16 from HEAD first):
# 6: segformer_b0 fp16 (GPU 0) and tf32 (GPU 1) cold, profiled: 899f6c6 tiles the decoder's transposes by
#    channel rows (call 3's k123_add_transpose_reshape ran 29 us flat for 17 MB, 7.5x its roofline).
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
        on_gpu 0 e2e_a.txt gemms e2e_a gpt2 fp16 560 eager,inductor
        on_gpu 1 e2e_b.txt gemms e2e_b bert_base fp16 560 eager,inductor
        wait; cat "$OUT/e2e_a.txt" "$OUT/e2e_b.txt" ;;
    3)
        on_gpu 0 e2e_c.txt eval 'export PROFILE=1; gemms e2e_c segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 rest.txt eval 'gemms gfp16b gemm_g10,gemm_g11,gemm_g12 fp16 130; gemms gtf32b gemm_g10,gemm_g11,gemm_g12 tf32 130;
                                gemms afp16b attn_s7,attn_s8,attn_s9 fp16 120 eager,sdpa,inductor;
                                gemms atf32b attn_s7,attn_s8,attn_s9 tf32 120 eager,sdpa,inductor'
        wait; cat "$OUT/e2e_c.txt" "$OUT/rest.txt" ;;
    4)
        on_gpu 0 a4.txt eval 'gemms atf32c attn_s6,attn_s2,attn_s9 tf32 200 eager,sdpa,inductor'
        on_gpu 1 b4.txt eval 'gemms afp16c attn_s9,attn_s6,attn_s3 fp16 200 eager,sdpa,inductor'
        wait; cat "$OUT/a4.txt" "$OUT/b4.txt" ;;
    5)
        on_gpu 0 a5.txt eval 'gemms gfp16c gemm_g9,gemm_g1,gemm_g2,gemm_g3,gemm_g7 fp16 170'
        on_gpu 1 b5.txt eval 'gemms gtf32c gemm_g7,gemm_g1,gemm_g2,gemm_g3,gemm_g9 tf32 170'
        wait; cat "$OUT/a5.txt" "$OUT/b5.txt" ;;
    6)
        export PROFILE=1
        on_gpu 0 e2e_d.txt gemms e2e_d segformer_b0 fp16 560 eager,inductor
        on_gpu 1 e2e_e.txt gemms e2e_e segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/e2e_d.txt" "$OUT/e2e_e.txt" ;;
    *) echo "next.sh: call 1-6"; exit 2 ;;
esac
