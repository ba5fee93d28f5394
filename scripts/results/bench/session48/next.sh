#!/bin/bash
# Session 48's device calls: `bash scripts/results/bench/session48/next.sh N` from the repository root on one
# nvidia-h200. Calls 1-4 ran session 47's next.sh (6, 7, 8 and the artifact test; README). Carry .whl and, for 5,
# .pin16 (`git archive HEAD tessera scripts/bench_suite.py scripts/bench_gpus.py scripts/linear_share.py pyproject.toml
# | tar -x -C .pin16` and `git rev-parse --short HEAD >
# .pin16/CODE`).
# 5: issue 15's end-to-end rows gpt2 and bert_base fp16 at HEAD, cold, beside eager and Inductor, profiled: the
#    first run since session 43 (40cfc43), after sessions 44-47's changes (in-place concatenations, bias rounding).
# 6: scripts/gemm_probe.py --set chains --deep, fp16: G4-G10's products with K steps of 256-512 and 1-2 stages
#    beside the usual sweep (whether fewer, larger loads shorten the long first product).
# 7: the fuzzer on the GPU (first time since session 15): scripts/gpu_correctness.sh, no zoo models, fp32 and
#    fp16 graphs, 5 instances with random schedules and 4 with measured tuning, 6 minutes each, seeds from 48000.
# 8: after 0daef58 (no collection inside a capture; the piecewise graph refers weakly to its executable):
#    capture_gc_check.py, the CUDA tests it touches, and three fuzz instances of 45 s.
# 9: as 8's first two commands, after the check and the test collect only while a capture runs (in 8 the
#    collection ran in the warm-up, before the capture), carrying carry/e (gpt2_tiny, bert_tiny, gemm_g1).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
export TESSERA_SOLVER=highs
case $1 in
    5)
        export PROFILE=1
        gemms e2e_a gpt2 fp16 290 eager,inductor; gemms e2e_b bert_base fp16 270 eager,inductor ;;
    6)
        timeout 500 python3 scripts/gemm_probe.py --set chains --deep --precisions fp16 --out "$OUT/deep_k.json" \
            2>&1 | grep -v Warning | tail -n 20 ;;
    7)
        unset TESSERA_LOG; bash scripts/gpu_correctness.sh "" fp32 6 5 4 48000 ;;
    8)
        unset TESSERA_LOG; R=scripts/results/bench/session48
        PYTHONPATH=$PYTHONPATH:tests timeout 80 python3 $R/capture_gc_check.py $R/flaky_spec.txt 2>&1 | grep -v Warn | tail -n 4
        timeout 70 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_graphs.py tests/test_runtime_gpu.py \
            tests/test_fuzz.py -k "collection_inside or gpu_regressions or does_not_come_back or graph or replay or index" 2>&1 | tail -n 3
        for s in 48600 48700 48800; do timeout 70 python3 scripts/fuzz.py --device cuda --precisions fp32,fp16 \
            --minutes 0.75 --seed $s --out "$OUT/fuzz_$s.json" > "$OUT/fuzz_$s.log" 2>&1 & done; wait
        tail -q -n 2 "$OUT"/fuzz_*.log ;;
    9)
        unset TESSERA_LOG; R=scripts/results/bench/session48
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/
        PYTHONPATH=$PYTHONPATH:tests timeout 60 python3 $R/capture_gc_check.py 2>&1 | grep -v Warn | tail -n 3
        timeout 70 python3 -m pytest -q -p no:cacheprovider -n 4 -rfE tests/test_graphs.py tests/test_runtime_gpu.py \
            tests/test_fuzz.py -k "(collection_inside or gpu_regressions or does_not_come_back or graph or replay or index) and not candy" \
            2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -n 8 ;;
    *) echo "next.sh: call 5 to 9"; exit 2 ;;
esac
