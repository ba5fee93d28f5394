#!/bin/bash
# Session 50's device calls, planned in session 49: `bash scripts/results/bench/session50/next.sh N` from the
# repository root on one nvidia-h200, carrying .whl (the highspy wheel; TESSERA_SOLVER=highs) and carry/e
# (gemm_g1, gpt2_tiny, bert_tiny from ../shared/models).
# 1: the GPU tests written after session 49's last device call: a TESSERA_CAPTURE it cannot read fails a GPU
#    executable when it is made (9acb733), and a piecewise plan whose second graph fails its capture falls back
#    whole; with the rest of tests/test_graphs.py and tests/test_threads.py (all passed in session 49's call 9).
# 2: `scripts/atomic_chain_probe.py`: G4-G10's left chain split over N, summed by atomics (CASES, PRECS).
# 3: `scripts/exclusive_cost.py`: the host time the thread guard adds to a GPU call.
# 4: calls 1 and 3 again, after `exclusive` reads the raw stream handle.
# 5: `scripts/arch_zoo.py`'s 28 architectures on the GPU: ONNX export, compile and run --check (fp16,
#    analytical cost), then torch.compile(backend="tessera") against float64 eager.
# 6: what call 5's budget and timeout left.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
unset TESSERA_LOG; export TESSERA_SOLVER=highs
case $1 in
    1)
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
        python3 -m pytest -q -p no:cacheprovider -rA tests/test_graphs.py tests/test_threads.py > "$OUT/tests.txt" 2>&1
        grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|^E  " "$OUT/tests.txt" | cut -c1-200 | head -40; tail -n 1 "$OUT/tests.txt" ;;
    2)  # the left chain split over its intermediate, summed by float32 atomics, beside tessera's ordered sum
        cd scripts && python3 atomic_chain_probe.py --cases ${CASES:-7,8,9,10,4,5,6} --precisions ${PRECS:-fp16} \
            > "$OUT/atomic.txt" 2>&1; echo "rc=$?"; grep -v "^precompiled" "$OUT/atomic.txt" | tail -n 14 ;;
    3)  # host time of `Executable.exclusive` per call (bert_tiny, gpt2_tiny)
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
        for m in bert_tiny gpt2_tiny; do
            python3 scripts/exclusive_cost.py --model ../shared/models/$m.onnx > "$OUT/exclusive_$m.txt" 2>&1
            echo "$m rc=$?"; tail -n 8 "$OUT/exclusive_$m.txt"
        done ;;
    4)  # after the raw-handle stream check: the thread and capture tests, then call 3 again
        bash "$0" 1; bash "$0" 3 ;;
    5)  # 28 small transformers architectures, built here, compiled (analytical cost) and checked on the GPU
        python3 scripts/arch_zoo.py /tmp/az > "$OUT/arch_export.txt" 2>&1; echo "export rc=$?"
        timeout 440 python3 scripts/check_models.py /tmp/az --precision fp16 --cost analytical --timeout 120 --budget-s 360 \
            --out "$OUT/arch_check_fp16.json" > "$OUT/arch_check_fp16.txt" 2>&1; echo "check rc=$?"
        grep "^|" "$OUT/arch_check_fp16.txt" | grep -v " PASS " | head -20; grep -c " PASS " "$OUT/arch_check_fp16.txt"
        timeout 150 python3 scripts/arch_zoo.py --backend --precision fp16 --device cuda \
            > "$OUT/arch_backend_fp16.txt" 2>&1; echo "backend rc=$?"; grep "^|" "$OUT/arch_backend_fp16.txt" | grep -v PASS ;;
    6)  # call 5's rest: the six exports its budget skipped and the three backend rows its timeout cut
        python3 scripts/arch_zoo.py /tmp/az --models mistral,qwen2,bloom,dinov2,swin,mobilevit \
            > "$OUT/arch_export.txt" 2>&1; echo "export rc=$?"
        timeout 300 python3 scripts/check_models.py /tmp/az --precision fp16 --cost analytical --timeout 120 \
            --out "$OUT/arch_check_fp16.json" > "$OUT/arch_check_fp16.txt" 2>&1; echo "check rc=$?"
        grep "^|" "$OUT/arch_check_fp16.txt"
        timeout 120 python3 scripts/arch_zoo.py --backend --precision fp16 --device cuda \
            --models whisper_encoder,wav2vec2,mobilevit > "$OUT/arch_backend_fp16.txt" 2>&1; echo "backend rc=$?"
        grep "^|" "$OUT/arch_backend_fp16.txt" ;;
    *) echo "next.sh: calls 1-6"; exit 2 ;;
esac
