#!/bin/bash
# Session 63's device calls: `bash scripts/results/bench/session63/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders; carry/a/ holds candy_small, bert_tiny and gpt2_tiny).
# (for session 64: calls 6-9 have not run)
# 1: attn_s3's plan replayed with and without PDL (spans); the faulting chain tile under compute-sanitizer
#    (which access is out of range); then attn_s3 and attn_s1 tuned and benched with TESSERA_PDL=0 and =1 from
#    empty databases: is call 3 of session 62's 8.03 µs on attn_s3 PDL's?
# 2: tf32 attention attn_s1-s9 beside eager, SDPA and Inductor (not re-run since the faulting family left the
#    chain spaces).
# 3: end to end, fp16, cold, with --profile (the plan's attention kernels named): gpt2 and bert_base beside eager
#    and Inductor. 4: segformer_b0 the same way.
# 5: why PDL slows attn_s3's best tile (m64 n64 l128 k64 w4 s3: 8.59 µs timed with PDL, 6.85 without, in call 1's
#    tunings): scripts/pdl_ab.py --chain --split on attn_s3 and attn_s1 at that tile and its 8-warp twin, with the
#    prologue alone, the launch attribute alone, and both without the early trigger (PDL=2), and each binary's
#    registers, spills and shared memory.
# 6: tests/test_pdl.py on the GPU (late chain kernels compute the same bits); attn_s3 at both tiles, 20 calls
#    captured in one graph (PDL overlaps one call with the next) in every mode.
# 7: fp16 attn_s1-s9 at HEAD (the chain walk times its starts launched late). 8: gpt2 and bert_base fp16.
# 9: gpt2 and bert_base, one plan each, with every chain kernel launched late and as tuned (pdl_ab --late-chains).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        (cd .pin16 && cat CODE && timeout 150 python3 scripts/pdl_ab.py --models attn_s3,attn_s2 --spans \
            --json "$OUT/pdl_ab_attn.json" 2>&1 | grep -v Warn > "$OUT/pdl_ab_attn.txt"; tail -6 "$OUT/pdl_ab_attn.txt")
        (cd .pin16 && export PATH=$PATH:$(ls -d /usr/local/cuda*/bin 2>/dev/null | tr "\n" :) \
            && cp ../scripts/results/bench/session62/call3/fault_job.pkl /tmp/ && (command -v compute-sanitizer \
            && timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 scripts/fault_repro.py --one \
            /tmp/fault_job.pkl launch-off 4/64/32/128/64/2 > "$OUT/sanitizer.txt" 2>&1; head -40 "$OUT/sanitizer.txt"))
        TESSERA_PDL=0 gemms a3off attn_s3,attn_s1 fp16 120 eager,sdpa,inductor
        TESSERA_PDL=1 gemms a3pdl attn_s3,attn_s1 fp16 120 eager,sdpa,inductor ;;
    2)
        gemms atf32 "$(echo attn_s{1..9} | tr " " ,)" tf32 280 eager,sdpa,inductor ;;
    3)
        export PROFILE=1
        gemms e2e_a gpt2 fp16 290 eager,inductor; gemms e2e_b bert_base fp16 270 eager,inductor ;;
    4)
        PROFILE=1 gemms e2e_c segformer_b0 fp16 400 eager,inductor ;;
    5)
        (cd .pin16 && cat CODE && timeout 400 python3 scripts/pdl_ab.py --models attn_s3,attn_s1 --split \
            --chain 4/64/64/128/64/3,8/64/64/128/64/3 --json "$OUT/pdl_split.json" 2>&1 | grep -v Warn > "$OUT/pdl_split.txt"
         tail -30 "$OUT/pdl_split.txt") ;;
    6)  # call 5: every mode replays both tiles at the same time; the tuning's timing graph (launches of one
        # candidate back to back) timed w4 8.59 µs under PDL: do 20 calls in one graph run slower under PDL?
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider \
            tests/test_pdl.py > "$OUT/test_pdl.txt" 2>&1; tail -2 "$OUT/test_pdl.txt")
        (cd .pin16 && cat CODE && timeout 200 python3 scripts/pdl_ab.py --models attn_s3 --split --in-graph 20 \
            --chain 4/64/64/128/64/3,8/64/64/128/64/3 --repeats 2 --json "$OUT/pdl_graph.json" 2>&1 | grep -v Warn > "$OUT/pdl_graph.txt"
         grep "in one graph" "$OUT/pdl_graph.txt") ;;
    7)  # now that the chain walk also times its starts launched late (ChainSchedule.late): fp16 attention again
        gemms afp16 "$(echo attn_s{1..9} | tr " " ,)" fp16 280 eager,sdpa,inductor ;;
    8)  # and whole models: does a plan keep a late chain kernel, and what does it cost?
        PROFILE=1 gemms e2e_g gpt2 fp16 290 eager,inductor; PROFILE=1 gemms e2e_b bert_base fp16 270 eager,inductor ;;
    9)  # in whole models, what launching every attention chain late costs or saves (same plan, PDL on)
        (cd .pin16 && cat CODE && timeout 500 python3 scripts/pdl_ab.py --models gpt2,bert_base --late-chains \
            --json "$OUT/pdl_late.json" 2>&1 | grep -v Warn > "$OUT/pdl_late.txt"; tail -8 "$OUT/pdl_late.txt") ;;
    *) echo "next.sh: calls 1-9"; exit 2 ;;
esac
