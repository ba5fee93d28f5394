#!/bin/bash
# Session 51's device calls: `bash scripts/results/bench/session51/next.sh N` from the repository root on one
# nvidia-h200, carrying .whl (the highspy wheel; TESSERA_SOLVER=highs) and carry/e (gemm_g1, gpt2_tiny,
# bert_tiny from ../shared/models). Each call works in a folder of its own under /tmp (a warm machine keeps
# /tmp between calls: session 50's call 6 re-ran call 5's folder).
# 1: session 50's fission rules compiled for the GPU: tests/test_codegen_kernels.py (every kernel form,
#    among them GatherND, CumSum and the new activations, on CUDA) and tests/test_arch_zoo.py (llama, swin,
#    wav2vec2, t5_encoder, roberta, falcon, llama through the backend, the dynamic llama); then the fuzzer
#    on the GPU for the rest of the call (it draws GatherND and the new activations).
# 2: the 21 architectures never checked through ONNX on the GPU (session 50's six unreached and the second
#    batch of 15): export, compile and run --check in fp16 (analytical cost).
# 3: the second batch through torch.compile(backend="tessera") in fp16 against float64 eager.
# 4: session 51's rules on the GPU: Sin, Cos, Tan, Floor, Ceil, Round and Mod (tests/test_codegen_kernels.py
#    compiles each for the GPU and compares it with the float64 interpreter: trigonometry far from zero,
#    rounding and remainders exactly), ScatterND/ScatterElements with constant indices
#    (tests/test_codegen_scatter.py), the bridge's aten ops; the GPU tests whose host step became Atan
#    (tests/test_graphs.py, tests/test_fuzz.py's GPU regressions, tests/test_threads.py); then the fuzzer.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
unset TESSERA_LOG; export TESSERA_SOLVER=highs
BATCH2=bart_encoder,mpnet,squeezebert,convbert,clip_text,swinv2,convnextv2,efficientnet,mobilenet_v2,levit,poolformer,yolos,hubert,videomae,fnet
case $1 in
    1)
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
        timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_codegen_kernels.py tests/test_arch_zoo.py \
            > "$OUT/tests.txt" 2>&1; echo "tests rc=$?"
        grep -E "^(FAILED|ERROR)|^E  " "$OUT/tests.txt" | cut -c1-200 | head -30; tail -n 1 "$OUT/tests.txt"
        timeout 200 python3 scripts/fuzz.py --device cuda --minutes ${FUZZ_MIN:-2.5} --seed 5101 --big 0.3 \
            --out "$OUT/fuzz_5101.json" > "$OUT/fuzz.txt" 2>&1; echo "fuzz rc=$?"; tail -n 6 "$OUT/fuzz.txt" ;;
    2)
        rm -rf /tmp/az2 && python3 scripts/arch_zoo.py /tmp/az2 --models mistral,qwen2,bloom,dinov2,swin,mobilevit,$BATCH2 \
            > "$OUT/arch_export.txt" 2>&1; echo "export rc=$?"; grep -i "error\|fail" "$OUT/arch_export.txt" | head
        timeout 450 python3 scripts/check_models.py /tmp/az2 --precision fp16 --cost analytical --timeout 120 --budget-s 420 \
            --out "$OUT/arch_check_fp16.json" > "$OUT/arch_check_fp16.txt" 2>&1; echo "check rc=$?"
        grep "^|" "$OUT/arch_check_fp16.txt" | grep -v " PASS " | head -20; grep -c " PASS " "$OUT/arch_check_fp16.txt" ;;
    3)
        timeout 500 python3 scripts/arch_zoo.py --backend --precision fp16 --device cuda --models ${MODELS:-$BATCH2} \
            > "$OUT/arch_backend_fp16.txt" 2>&1; echo "backend rc=$?"; grep "^|" "$OUT/arch_backend_fp16.txt" ;;
    4)
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
        timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_codegen_kernels.py tests/test_codegen_scatter.py \
            tests/test_graphs.py tests/test_threads.py tests/test_fuzz.py tests/test_torch_frontend.py \
            > "$OUT/tests.txt" 2>&1; echo "tests rc=$?"
        grep -E "^(FAILED|ERROR)|^E  " "$OUT/tests.txt" | cut -c1-200 | head -30; tail -n 1 "$OUT/tests.txt"
        timeout 220 python3 scripts/fuzz.py --device cuda --minutes ${FUZZ_MIN:-3} --seed 5121 --big 0.3 \
            --out "$OUT/fuzz_5121.json" > "$OUT/fuzz.txt" 2>&1; echo "fuzz rc=$?"; tail -n 3 "$OUT/fuzz.txt" ;;
    5)  # call 4's tests cut by its timeout, with the NaN-sign fix of the exactness check
        timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_codegen_kernels.py tests/test_codegen_scatter.py \
            tests/test_graphs.py tests/test_threads.py tests/test_fuzz.py -k "trigonometry or rounding or mod or scatter \
            or capture or graph or thread or gpu_regressions or host_steps" > "$OUT/tests.txt" 2>&1; echo "tests rc=$?"
        grep -E "^(FAILED|ERROR)|^E  " "$OUT/tests.txt" | cut -c1-300 | head -30; tail -n 1 "$OUT/tests.txt" ;;
    6)  # after the fixes: NEG as a product by -1, float MOD through torch.fmod; the GPU tests with their models
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
        bash "$0" 5 ;;
    *) echo "next.sh: calls 1-6"; exit 2 ;;
esac
