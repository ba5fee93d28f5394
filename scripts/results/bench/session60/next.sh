#!/bin/bash
# Session 60's device calls: `bash scripts/results/bench/session60/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders).
# 1: scripts/epilogue_prefetch_probe.py (epilogue operands loaded after or before the K loop), then
#    scripts/pdl_layer_probe.py (PDL and a weight prefetch over llama-shaped layers, replay wall time), then
#    zoo:gpt_neox fp16 beside eager (partial rotary; session 59's call 6 ran out of device time).
# 2 [LIMIT_S]: PDL on the GPU: its tests, then scripts/pdl_ab.py: one plan
#    per model replayed with and without PDL (wall, kernel sum, busy time), same process.
# 3: gpt_neox's three chain candidates that faulted in call 1, each on the GPU in a process of its own, at its
#    schedule and at 8 warps (scripts/fault_check.py --gpu; .pin16/carry/e2e_neox.tgz is call 1's folder).
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
    3)
        (cd .pin16 && tar xzf carry/e2e_neox.tgz -C /tmp && python3 -c "from tessera import zoo; from pathlib import Path; zoo.build('gpt_neox', Path('/tmp'))" \
            && timeout 400 python3 scripts/fault_check.py /tmp/e2e_neox/tuning.jsonl.gz /tmp/gpt_neox.onnx fp16 --gpu \
            2>&1 | tee "$OUT/fault_check.txt" | tail -12) ;;
    *) echo "next.sh: calls 1-3"; exit 2 ;;
esac
