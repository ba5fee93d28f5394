#!/bin/bash
# Session 60's device calls: `bash scripts/results/bench/session60/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders).
# 1: scripts/epilogue_prefetch_probe.py (epilogue operands loaded after or before the K loop), then
#    scripts/pdl_layer_probe.py (PDL and a weight prefetch over llama-shaped layers, replay wall time), then
#    zoo:gpt_neox fp16 beside eager (partial rotary; session 59's call 6 ran out of device time).
# 2 [LIMIT_S]: PDL on the GPU: its tests, then scripts/pdl_ab.py: one plan
#    per model replayed with and without PDL (wall, kernel sum, busy time), same process.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        (cd .pin16 && timeout 100 python3 scripts/epilogue_prefetch_probe.py 2>&1 | tee "$OUT/prefetch_probe.txt" | tail -7)
        (cd .pin16 && timeout 120 python3 scripts/pdl_layer_probe.py 2>&1 | tee "$OUT/pdl_layer_probe.txt" | tail -12)
        export PROFILE=1; gemms e2e_neox gpt_neox fp16 280 eager ;;
    2)
        (cd .pin16 && timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_pdl.py 2>&1 | tail -3)
        (cd .pin16 && timeout ${2:-330} python3 scripts/pdl_ab.py --models llama,gemm_g7,gpt2 \
            --json "$OUT/pdl_ab.json" 2>&1 | tee "$OUT/pdl_ab.txt" | tail -14) ;;
    *) echo "next.sh: calls 1-2"; exit 2 ;;
esac
