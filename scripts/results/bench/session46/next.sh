#!/bin/bash
# Session 46's device calls: `bash scripts/results/bench/session46/next.sh N` from the repository root on the
# GPU machine, carrying .whl and .pin16 (rebuilt from HEAD first, as ../session34/next.sh says).
# 1: ../session45/next.sh 7 (README).
# 2: scripts/flag_chain_probe.py on nvidia-h200-x2, fp16 G4-G10 split over the two GPUs.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
case $1 in
    2)
        TRITON_INTERPRET=1 timeout 60 python3 scripts/flag_chain_probe.py --check > "$OUT/check.txt" 2>&1; tail -n 2 "$OUT/check.txt"
        CUDA_VISIBLE_DEVICES=0 timeout 420 python3 scripts/flag_chain_probe.py --cases 7,8,9,4 --jobs 14 > "$OUT/flag0.txt" 2>&1 &
        CUDA_VISIBLE_DEVICES=1 timeout 420 python3 scripts/flag_chain_probe.py --cases 10,5,6 --jobs 14 > "$OUT/flag1.txt" 2>&1 &
        wait; tail -n 20 "$OUT/flag0.txt" "$OUT/flag1.txt" ;;
    *) echo "next.sh: call 2"; exit 2 ;;
esac
