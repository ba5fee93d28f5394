#!/bin/bash
# Session 43's device calls: `bash scripts/results/bench/session43/next.sh N` on nvidia-h200-x2 (one runner per
# GPU, side by side), carrying .whl and .pin16 (rebuilt from HEAD first, as ../session34/next.sh says).
# The first runs with the h200 cost preset (0d09d10, `--gpu auto`).
# 1: segformer_b0 fp16 (GPU 0) and tf32 (GPU 1) cold, profiled: 899f6c6 tiles the decoder's transposes by
#    channel rows, adbb95b prices transposing candidates tiled before the solve (both untimed until now).
# 2: the GEMM chains not met in session 42: fp16 G4-G10 on GPU 0; tf32 G5, G6, G4, then G1, G7 on GPU 1.
# 3: as 1, after the tiled kernels' one tile a program (call 1's database: k119_add_transpose_reshape 29.2 us
#    flat, 149 us tiled, with 16 programs walking 16384 columns each).
# 4: after 32-bit gather positions with no wrap for constant indices (call 3's bilinear upsampling kernels,
#    `gather_mul_add`, ran 12-13 us, 4-5x their roofline): segformer_b0 fp16 on GPU 0; issue 15's other two
#    end-to-end rows, gpt2 and bert_base fp16, on GPU 1, at the same commit.
# Next session (rebuild .pin16 from HEAD first):
# 5: a6af258's concatenations that copy nothing (segformer_b0's decoder concat ran 15.6 us in call 3), cold and
#    profiled: segformer_b0 fp16 on GPU 0 after scripts/gather_probe.py (what bounds the bilinear upsampling
#    kernels, 12-13 us each), tf32 on GPU 1.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms` and `models`
on_gpu() {  # on_gpu GPU LOG COMMAND...: one runner on one GPU, in the background
    local gpu=$1 log=$2; shift 2
    (export CUDA_VISIBLE_DEVICES=$gpu; "$@") > "$OUT/$log" 2>&1 &
}
case $1 in
    1)
        export PROFILE=1
        on_gpu 0 e2e_a.txt gemms e2e_a segformer_b0 fp16 560 eager,inductor
        on_gpu 1 e2e_b.txt gemms e2e_b segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/e2e_a.txt" "$OUT/e2e_b.txt" ;;
    2)
        on_gpu 0 g2a.txt gemms gfp16 "$(echo gemm_g{4..10} | tr " " ,)" fp16 560
        on_gpu 1 g2b.txt gemms gtf32 gemm_g5,gemm_g6,gemm_g4,gemm_g1,gemm_g7 tf32 560
        wait; cat "$OUT/g2a.txt" "$OUT/g2b.txt" ;;
    3)
        export PROFILE=1
        on_gpu 0 e2e_c.txt gemms e2e_c segformer_b0 fp16 560 eager,inductor
        on_gpu 1 e2e_d.txt gemms e2e_d segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/e2e_c.txt" "$OUT/e2e_d.txt" ;;
    4)
        export PROFILE=1
        on_gpu 0 e2e_e.txt gemms e2e_e segformer_b0 fp16 560 eager,inductor
        on_gpu 1 e2e_f.txt eval 'gemms e2e_f gpt2 fp16 280 eager,inductor; gemms e2e_g bert_base fp16 270 eager,inductor'
        wait; cat "$OUT/e2e_e.txt" "$OUT/e2e_f.txt" ;;
    5)
        export PROFILE=1
        on_gpu 0 e2e_h.txt eval 'python3 scripts/gather_probe.py > "$OUT/gather.txt" 2>&1;
                                 gemms e2e_h segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 e2e_i.txt gemms e2e_i segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/gather.txt" "$OUT/e2e_h.txt" "$OUT/e2e_i.txt" ;;
    *) echo "next.sh: call 1-5"; exit 2 ;;
esac
