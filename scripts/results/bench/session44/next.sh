#!/bin/bash
# Session 44's device calls: `bash scripts/results/bench/session44/next.sh N` on nvidia-h200-x2 (one runner per
# GPU, side by side), carrying .whl and .pin16 (rebuilt from HEAD first, as ../session34/next.sh says).
# 1: a6af258's concatenations that copy nothing (segformer_b0's decoder concat ran 15.6 us in session 43's
#    call 3), cold and profiled: segformer_b0 fp16 on GPU 0 after scripts/gather_probe.py (what bounds the
#    bilinear upsampling kernels, 12-13 us each), tf32 on GPU 1.
# 2: as 1 after 963a5ba (gathering kernels tile from the gathered axis; the probe then also times
#    tessera's own upsampling kernels flat and tiled).
# 3: segformer_b0 fp16 (GPU 0) and tf32 (GPU 1) cold, profiled, after 089fc40 (a kernel gathering along
#    a contiguous axis ranks 4 elements a thread first; the tiled gathers of call 2 dropped).
# 4s: (the session's last 246 s of device time) the gather probe's second table alone after eeef598, on one
#    GPU: tessera's upsampling kernels computing their closed-form tables.
# Next session (rebuild .pin16 from HEAD first):
# 4: eeef598's closed-form tables (a whole-number Resize computes its index and weight tables, codegen 16):
#    the gather probe (its second table: tessera's own kernels) then segformer_b0 fp16 on GPU 0, tf32 on
#    GPU 1, cold, profiled. The W pass ran 9.2 us fp16 and 13.6-14.0 tf32 in call 3.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
case $1 in
    1)
        export PROFILE=1
        on_gpu 0 e2e_a.txt eval 'python3 scripts/gather_probe.py > "$OUT/gather.txt" 2>&1;
                                 gemms e2e_a segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 e2e_b.txt gemms e2e_b segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/gather.txt" "$OUT/e2e_a.txt" "$OUT/e2e_b.txt" ;;
    2)
        export PROFILE=1
        on_gpu 0 e2e_c.txt eval 'python3 scripts/gather_probe.py > "$OUT/gather.txt" 2>&1;
                                 gemms e2e_c segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 e2e_d.txt gemms e2e_d segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/gather.txt" "$OUT/e2e_c.txt" "$OUT/e2e_d.txt" ;;
    3)
        export PROFILE=1
        on_gpu 0 e2e_e.txt gemms e2e_e segformer_b0 fp16 520 eager,inductor
        on_gpu 1 e2e_f.txt gemms e2e_f segformer_b0 tf32 520 eager,inductor
        wait; cat "$OUT/e2e_e.txt" "$OUT/e2e_f.txt" ;;
    4s)
        CUDA_VISIBLE_DEVICES=0 timeout 150 python3 scripts/gather_probe.py --generated > "$OUT/gather.txt" 2>&1
        cat "$OUT/gather.txt" ;;
    4)
        export PROFILE=1
        on_gpu 0 e2e_g.txt eval 'python3 scripts/gather_probe.py > "$OUT/gather.txt" 2>&1;
                                 gemms e2e_g segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 e2e_h.txt gemms e2e_h segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/gather.txt" "$OUT/e2e_g.txt" "$OUT/e2e_h.txt" ;;
    *) echo "next.sh: call 1-4"; exit 2 ;;
esac
