#!/bin/bash
# Session 45's device calls: `bash scripts/results/bench/session45/next.sh N` on nvidia-h200-x2 (one runner per
# GPU, side by side), carrying .whl and .pin16 (rebuilt from HEAD first, as ../session34/next.sh says).
# 1: session 44's closed-form tables (eeef598, codegen 16: a whole-number Resize computes its index and weight
#    tables) and the fp16/bf16 cast fix (66ed5a4), at c1b1516: the gather probe, then segformer_b0 fp16 on
#    GPU 0 and tf32 on GPU 1, cold, profiled. Session 44's call 3 ran the W pass 9.2 us fp16, 13.6-14.0 tf32.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
case $1 in
    1)
        export PROFILE=1
        on_gpu 0 e2e_a.txt eval 'python3 scripts/gather_probe.py > "$OUT/gather.txt" 2>&1;
                                 gemms e2e_a segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 e2e_b.txt gemms e2e_b segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/gather.txt" "$OUT/e2e_a.txt" "$OUT/e2e_b.txt" ;;
    *) echo "next.sh: call 1"; exit 2 ;;
esac
