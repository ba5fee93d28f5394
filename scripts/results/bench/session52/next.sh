#!/bin/bash
# Session 52's device calls, planned at the end of session 51 (whose device time ran out after its call 6):
# `bash scripts/results/bench/session52/next.sh N` from the repository root on one nvidia-h200, carrying .whl
# (the highspy wheel; TESSERA_SOLVER=highs) and carry/e (gemm_g1, gpt2_tiny, bert_tiny from ../shared/models).
# Everything below ran on the CPU only in session 51.
# 1: the generated kernels of session 51's later rules compiled for the GPU: cubic Resize, integer
#    reductions (int64's least written as a difference: does Triton 3.6 take it?), TopK, Einsum, Col2Im,
#    RotaryEmbedding, RMSNormalization, LRN, Hardmax, Trilu, OneHot, Swish (tests/test_codegen_kernels.py,
#    tests/test_codegen_scatter.py, tests/test_ops_rotary.py), and the architecture tests (mixtral,
#    mobilevitv2 among them).
# 2: the seventeen architectures added after session 51's device calls (mixtral, qwen2_moe, the third
#    and fourth batches) through ONNX in fp16 on the GPU.
# 3: the same seventeen through the backend in fp16, then the fuzzer on the GPU over the families the
#    new rules live in.
# 4: the zoo's new llama (a Llama-family decoder at GPT-2's scale) cold, fp16, beside eager and Inductor.
# 5: the same in tf32.
# 6: bert_base at batch 8, fp16, beside eager and Inductor (a first row above batch 1).
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
unset TESSERA_LOG; export TESSERA_SOLVER=highs
NEW=mixtral,qwen2_moe,gptj,codegen,xlm_roberta,canine,glpn,mobilevitv2,data2vec_audio,owlvit_vision,siglip_vision,focalnet,pvt_v2,mobilenet_v1,dpt,ijepa,vivit
case $1 in
    1)
        mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
        timeout 400 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_codegen_kernels.py tests/test_codegen_scatter.py \
            tests/test_ops_rotary.py tests/test_arch_zoo.py > "$OUT/tests.txt" 2>&1; echo "tests rc=$?"
        grep -E "^(FAILED|ERROR)|^E  " "$OUT/tests.txt" | cut -c1-250 | head -30; tail -n 1 "$OUT/tests.txt" ;;
    2)
        rm -rf /tmp/az52 && python3 scripts/arch_zoo.py /tmp/az52 --models $NEW > "$OUT/arch_export.txt" 2>&1
        echo "export rc=$? after ${SECONDS} s"
        timeout 420 python3 scripts/check_models.py /tmp/az52 --precision fp16 --cost analytical --timeout 120 --budget-s 400 \
            --out "$OUT/arch_check_fp16.json" > "$OUT/arch_check_fp16.txt" 2>&1; echo "check rc=$?"
        grep "^|" "$OUT/arch_check_fp16.txt" ;;
    3)
        timeout 280 python3 scripts/arch_zoo.py --backend --precision fp16 --device cuda --models $NEW \
            > "$OUT/arch_backend_fp16.txt" 2>&1; echo "backend rc=$?"; grep "^|" "$OUT/arch_backend_fp16.txt"
        timeout 240 python3 scripts/fuzz.py --device cuda --minutes ${FUZZ_MIN:-3} --seed 5201 --big 0.3 \
            --families gather,opaque,integer,reduction,resize,linear,normalization \
            --out "$OUT/fuzz_5201.json" > "$OUT/fuzz.txt" 2>&1; echo "fuzz rc=$?"; tail -n 3 "$OUT/fuzz.txt" ;;
    4)  # the zoo's llama (7d1f0bf) cold beside eager and Inductor, fp16, GPU time; carries .pin16 as well
        export PROFILE=1; gemms e2e_llama llama fp16 420 eager,inductor ;;
    5)  # the same in tf32
        export PROFILE=1; gemms e2e_llama_tf32 llama tf32 420 eager,inductor ;;
    6)  # bert_base at 8 items a call (40d15de, `--batch`), fp16, in what device time is left
        export PROFILE=1 BATCH=8; gemms e2e_bert_b8 bert_base fp16 220 eager,inductor ;;
    *) echo "next.sh: calls 1-6"; exit 2 ;;
esac
