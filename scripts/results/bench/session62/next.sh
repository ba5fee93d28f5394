#!/bin/bash
# Session 62's device calls: `bash scripts/results/bench/session62/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders; carry/a/ holds candy_small, bert_tiny and gpt2_tiny,
# carry/e2e_neox.tgz is session 60's call-1 folder).
# 1: the GPU tests of PDL and of the rotary templates (interleaved pairs, the RotaryEmbedding fission) into
#    files; scripts/pdl_ab.py --spans on gemm_g7, gemm_g5 (fp16) and gemm_g5 (tf32): one plan with and without
#    PDL, each kernel's span in a call (what PDL leaves of the second kernel); the fault check with timing.
# 2: scripts/pdl_ab.py on gpt2.
# 3: scripts/fault_repro.py on gpt_neox's chain candidate that faulted timed at 4 warps (carry/fault_job.pkl,
#    pickled here from session 60's log): which modes (launch, CUDA graph, timing; PDL or not) and which tiles
#    fault; then issue 15's attention rows in fp16 beside SDPA and Inductor with the faulting family (32-column
#    output blocks at 64+ rows per warp group) out of the chain spaces.
# 4 (for session 63): attn_s3's plan replayed with and without PDL (spans); the faulting chain tile under
#    compute-sanitizer (which access is out of range: a shared-memory read would be Triton's wgmma); then
#    attn_s3 and attn_s1 tuned and benched with TESSERA_PDL=0 and =1 from empty databases: is the 8.03 µs of
#    call 3 PDL's?
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        (cd .pin16 && cat CODE && TESSERA_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
            tests/test_pdl.py > "$OUT/test_pdl.txt" 2>&1; tail -2 "$OUT/test_pdl.txt")
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider \
            tests/test_rotary_epilogue.py tests/test_ops_rotary.py > "$OUT/test_rotary.txt" 2>&1; tail -2 "$OUT/test_rotary.txt")
        (cd .pin16 && timeout 110 python3 scripts/pdl_ab.py --models gemm_g7,gemm_g5 --spans \
            --json "$OUT/pdl_ab.json" 2>&1 | grep -v Warn > "$OUT/pdl_ab.txt"; tail -8 "$OUT/pdl_ab.txt"
         timeout 60 python3 scripts/pdl_ab.py --models gemm_g5 --precision tf32 --spans \
            --json "$OUT/pdl_ab_tf32.json" 2>&1 | grep -v Warn > "$OUT/pdl_ab_tf32.txt"; tail -5 "$OUT/pdl_ab_tf32.txt")
        (cd .pin16 && tar xzf carry/e2e_neox.tgz -C /tmp && python3 -c "from tessera import zoo; from pathlib import Path; zoo.build('gpt_neox', Path('/tmp'))" \
            && timeout 150 python3 scripts/fault_check.py /tmp/e2e_neox/tuning.jsonl.gz /tmp/gpt_neox.onnx fp16 --gpu \
            > "$OUT/fault_check.txt" 2>&1; tail -8 "$OUT/fault_check.txt") ;;
    2)
        (cd .pin16 && timeout 330 python3 scripts/pdl_ab.py --models gpt2 \
            --json "$OUT/pdl_ab_gpt2.json" 2>&1 | grep -v Warn > "$OUT/pdl_ab_gpt2.txt"; tail -4 "$OUT/pdl_ab_gpt2.txt") ;;
    3)
        (cd .pin16 && cat CODE && timeout 200 python3 scripts/fault_repro.py carry/fault_job.pkl \
            --configs 4/64/32/128/64/2 2>&1 | grep -v Warn | tee "$OUT/fault_repro_a.txt"
         timeout 330 python3 scripts/fault_repro.py carry/fault_job.pkl --modes time-pdl,time-off --configs \
            8/64/32/128/64/2,4/32/32/128/64/2,4/64/64/128/64/2,4/64/32/64/64/2,4/64/32/128/32/2,8/128/32/128/64/2 \
            2>&1 | grep -v Warn | tee "$OUT/fault_repro_b.txt")
        gemms afp16 "$(echo attn_s{1..9} | tr " " ,)" fp16 250 eager,sdpa,inductor ;;
    4)  # for session 63: attn_s3 ran 1.00 of SDPA in call 3 (8.03 µs) where its tile ran 6.32 at 9b2c5fd
        (cd .pin16 && cat CODE && timeout 150 python3 scripts/pdl_ab.py --models attn_s3,attn_s2 --spans \
            --json "$OUT/pdl_ab_attn.json" 2>&1 | grep -v Warn > "$OUT/pdl_ab_attn.txt"; tail -6 "$OUT/pdl_ab_attn.txt")
        (cd .pin16 && export PATH=$PATH:$(ls -d /usr/local/cuda*/bin 2>/dev/null | tr "\n" :) && cp ../scripts/results/bench/session62/call3/fault_job.pkl /tmp/ && (command -v compute-sanitizer \
            && timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 scripts/fault_repro.py --one \
            /tmp/fault_job.pkl launch-off 4/64/32/128/64/2 > "$OUT/sanitizer.txt" 2>&1; head -40 "$OUT/sanitizer.txt"))
        TESSERA_PDL=0 gemms a3off attn_s3,attn_s1 fp16 120 eager,sdpa,inductor
        TESSERA_PDL=1 gemms a3pdl attn_s3,attn_s1 fp16 120 eager,sdpa,inductor ;;
    *) echo "next.sh: calls 1-4"; exit 2 ;;
esac
