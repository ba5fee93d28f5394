#!/bin/bash
# Session 49's device calls, planned in session 48: `bash scripts/results/bench/session49/next.sh N` from the
# repository root on one nvidia-h200, carrying .whl (the highspy wheel; TESSERA_SOLVER=highs) and, for 1, carry/a
# (attn_s1-s9, gemm_g1-g12, bert_tiny, candy_small, gpt2_tiny from ../shared/models: 12.2 MB beside the 49.5 MB
# tree). Larger model sets do not fit beside the tree; session 48's README says how it moved old results out
# during such calls.
# 1: the whole suite on the GPU (`pytest -n 4`), after session 48's capture changes (capture_guard, the weak
#    piecewise reference, PrecisionFlags): test_a_collection_inside_a_capture_finds_no_earlier_cuda_graph has not
#    run on the GPU since they landed (capture_gc_check.py, the same steps, passed in session 48's call 12).
# 2: the fuzzer on the GPU with bf16 too: 5 instances with random schedules and 4 with measured tuning, 7 minutes
#    each, seeds from 49000 (session 48 ran fp32 and fp16 only).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
unset TESSERA_LOG; export TESSERA_SOLVER=highs
case $1 in
    1)
        mkdir -p ../shared/models && cp carry/a/*.onnx ../shared/models/ 2>/dev/null
        timeout 560 python3 -m pytest -q -n 4 -p no:cacheprovider -rfE --tb=line tests/ > "$OUT/pytest_all.txt" 2>&1
        echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_all.txt" | cut -c1-200 | head -40; tail -n 2 "$OUT/pytest_all.txt" ;;
    2)
        FUZZ_PRECISIONS=fp32,fp16,bf16 bash scripts/gpu_correctness.sh "" fp32 7 5 4 49000 ;;
    *) echo "next.sh: call 1 or 2"; exit 2 ;;
esac
