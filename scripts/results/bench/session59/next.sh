#!/bin/bash
# Session 59's device calls: `bash scripts/results/bench/session59/next.sh N` from the repository root on one
# H100 or H200, carrying .whl (the highspy wheel) and .pin16 (a `git archive` of the commit measured, its hash
# in CODE, without scripts/results' session folders).
# 1: the rotary epilogue's GPU tests, then llama fp16 at HEAD beside eager with a limit its compile, eager and
#    the replay's profile fit in (session 58's next.sh 5 cut it off at 170 s: its tuning log and profile were lost).
# 2: llama fp16 at HEAD beside eager, after call 1 showed every rotary candidate failing to build (b235f4c).
# 3: the same after call 2's plan kept v's transpose (and q's rotation) in a kernel of their own.
# 4: gpt2 fp16 at HEAD beside eager (session 57, H100: 0.312 ms at 4997f90).
# 5: llama bf16 at HEAD beside eager (the rotary template's first bf16 run on a GPU).
# 6: zoo:gpt_neox fp16 beside eager (partial rotary). Session 59 ran it at 175 s and it was cut off in its
#    compile; give it 280 s (a run of about 350 s with the start).
# 7: scripts/epilogue_prefetch_probe.py: a GEMM at llama's shapes with its epilogue operands (cos/sin tables, a
#    residual) loaded after the K loop (tessera's code today) or before it. 67: calls 7 and 6 in one.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    1)
        (cd .pin16 && TESSERA_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider \
            tests/test_rotary_epilogue.py 2>&1 | tail -3)
        export PROFILE=1; gemms e2e_llama_head llama fp16 280 eager ;;
    2)  # after b235f4c (rotary candidates' own tiles): llama fp16 at HEAD beside eager
        export PROFILE=1; gemms e2e_llama_rot llama fp16 280 eager ;;
    3)  # after v's head split joined the rotary template: llama fp16 at HEAD beside eager
        export PROFILE=1; gemms e2e_llama_v llama fp16 280 eager ;;
    4)  # gpt2 fp16 at HEAD beside eager: the inherited-schedule change (measured._nearest) touches every model
        export PROFILE=1; gemms e2e_gpt2 gpt2 fp16 300 eager ;;
    5)  # llama bf16 at HEAD beside eager: the rotary template in bf16 on the GPU (never run there)
        export PROFILE=1; gemms e2e_llama_bf16 llama bf16 280 eager ;;
    6)  # zoo:gpt_neox fp16 beside eager: partial rotary in the projection's template 
        export PROFILE=1; gemms e2e_neox gpt_neox fp16 280 eager ;;
    7)  # the epilogue-prefetch probe: do epilogue loads after the K loop cost a memory latency?
        (cd .pin16 && timeout 120 python3 scripts/epilogue_prefetch_probe.py 2>&1 | tee "$OUT/prefetch_probe.txt" | tail -7) ;;
    67)  # the next session's first call: the probe, then gpt_neox (about 420 s with the start)
        (cd .pin16 && timeout 100 python3 scripts/epilogue_prefetch_probe.py 2>&1 | tee "$OUT/prefetch_probe.txt" | tail -7)
        export PROFILE=1; gemms e2e_neox gpt_neox fp16 280 eager ;;
    *) echo "next.sh: calls 1-7, 67"; exit 2 ;;
esac
