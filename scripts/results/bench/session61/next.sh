#!/bin/bash
# Session 61's device calls: `bash scripts/results/bench/session61/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders; carry/e2e_neox.tgz is session 60's call-1 folder).
# 1: PDL's GPU tests, then issue 15's unmet GEMM-chain rows (fp16 G4-G10, tf32 G5-G6) beside eager with
#    TESSERA_PDL=1 and, in the same call, without it (GPU time = busy time since session 60).
# 2 [LIMIT_S]: scripts/pdl_ab.py on llama and gpt2: one plan replayed with and without PDL (wall, sum, busy).
# 3: gpt_neox's three chain candidates that faulted in session 60's call 1, each on the GPU in a process of
#    its own, at its schedule and at 8 warps (scripts/fault_check.py --gpu).
# 4 (for session 62; PDL on by default since session 61): PDL's GPU tests (their output cut off in call 1)
#    into a file, then scripts/pdl_ab.py on gemm_g7 and gemm_g5 (fp16) and gemm_g5 (tf32): one plan with and
#    without PDL, whether the G5 losses of call 1 are the launch or the tiles,
#    then the fault check again, now also timing each kernel as the tuning did. Also the rotary tests on the
#    GPU (session 61's interleaved pairs and the RotaryEmbedding fission).
# 5 (for session 62): scripts/pdl_ab.py on gpt2 (call 2 ran out of time after llama).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
rows() {  # rows TAG: the unmet GEMM-chain rows at the current TESSERA_PDL
    gemms g16_$1 gemm_g4,gemm_g5,gemm_g6,gemm_g7,gemm_g8,gemm_g9,gemm_g10 fp16 170 eager
    gemms g32_$1 gemm_g5,gemm_g6 tf32 70 eager
}
case $1 in
    1)
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
            tests/test_pdl.py 2>&1 | tail -3)
        TESSERA_PDL=1 rows pdl; TESSERA_PDL=0 rows off ;;
    2)
        (cd .pin16 && timeout ${2:-330} python3 scripts/pdl_ab.py --models llama,gpt2 \
            --json "$OUT/pdl_ab.json" 2>&1 | tee "$OUT/pdl_ab.txt" | tail -14) ;;
    3)
        (cd .pin16 && tar xzf carry/e2e_neox.tgz -C /tmp && python3 -c "from tessera import zoo; from pathlib import Path; zoo.build('gpt_neox', Path('/tmp'))" \
            && timeout 400 python3 scripts/fault_check.py /tmp/e2e_neox/tuning.jsonl.gz /tmp/gpt_neox.onnx fp16 --gpu \
            2>&1 | tee "$OUT/fault_check.txt" | tail -12) ;;
    4)
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
            tests/test_pdl.py > "$OUT/test_pdl.txt" 2>&1; tail -3 "$OUT/test_pdl.txt")
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
            tests/test_rotary_epilogue.py tests/test_ops_rotary.py > "$OUT/test_rotary.txt" 2>&1; tail -3 "$OUT/test_rotary.txt")
        (cd .pin16 && timeout 100 python3 scripts/pdl_ab.py --models gemm_g7,gemm_g5 \
            --json "$OUT/pdl_ab.json" 2>&1 | grep -v Warn | tee "$OUT/pdl_ab.txt" | tail -6
         timeout 60 python3 scripts/pdl_ab.py --models gemm_g5 --precision tf32 \
            --json "$OUT/pdl_ab_tf32.json" 2>&1 | grep -v Warn | tee "$OUT/pdl_ab_tf32.txt" | tail -4)
        (cd .pin16 && tar xzf carry/e2e_neox.tgz -C /tmp && python3 -c "from tessera import zoo; from pathlib import Path; zoo.build('gpt_neox', Path('/tmp'))" \
            && timeout 150 python3 scripts/fault_check.py /tmp/e2e_neox/tuning.jsonl.gz /tmp/gpt_neox.onnx fp16 --gpu \
            2>&1 | tee "$OUT/fault_check.txt" | tail -12) ;;
    5)
        (cd .pin16 && timeout 330 python3 scripts/pdl_ab.py --models gpt2 \
            --json "$OUT/pdl_ab_gpt2.json" 2>&1 | grep -v Warn | tee "$OUT/pdl_ab_gpt2.txt" | tail -4) ;;
    *) echo "next.sh: calls 1-5"; exit 2 ;;
esac
