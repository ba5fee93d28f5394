#!/bin/bash
# Session 46's device calls: `bash scripts/results/bench/session46/next.sh N` from the repository root on the
# GPU machine, carrying .whl and .pin16 (rebuilt from HEAD first, as ../session34/next.sh says).
# 1: ../session45/next.sh 7 (README).
# 2: scripts/flag_chain_probe.py on nvidia-h200-x2, fp16 G4-G10 split over the two GPUs.
# 3: the test files with CUDA cases on one nvidia-h200 (the working tree), carrying .whl and carry/a.
# 4: call 3 set up as the suite expects (below), and the kernelcheck files on the GPU.
# 5: next session, on one nvidia-h200: call 4's first half again, one pytest a file (below).
# 6: next session: the whole suite in one pytest process on the GPU machine.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
case $1 in
    2)
        TRITON_INTERPRET=1 timeout 60 python3 scripts/flag_chain_probe.py --check > "$OUT/check.txt" 2>&1; tail -n 2 "$OUT/check.txt"
        CUDA_VISIBLE_DEVICES=0 timeout 420 python3 scripts/flag_chain_probe.py --cases 7,8,9,4 --jobs 14 > "$OUT/flag0.txt" 2>&1 &
        CUDA_VISIBLE_DEVICES=1 timeout 420 python3 scripts/flag_chain_probe.py --cases 10,5,6 --jobs 14 > "$OUT/flag1.txt" 2>&1 &
        wait; tail -n 20 "$OUT/flag0.txt" "$OUT/flag1.txt" ;;
    3)
        # The tests that run only with CUDA (skipped on the CPU machines). The working tree is about 59 MB of
        # the 64 MiB a call may carry, so this carries only .whl (highspy: TESSERA_SOLVER=highs stands in for
        # CBC) and carry/a with attn_s4, attn_s7, gemm_g1, gemm_g3 and bert_tiny; cases of the other shared
        # models are deselected or fail for want of the file (read the failures with that in mind).
        export TESSERA_SOLVER=highs
        timeout 470 python3 -m pytest -v -p no:cacheprovider -rs --durations=15 \
            -k "not candy_small and not gpt2_tiny" tests/test_runtime_gpu.py \
            tests/test_profiler_gpu.py tests/test_bias_rounding.py tests/test_tf32_rounding.py tests/test_workers.py \
            tests/test_profile.py tests/test_torch_prims.py tests/test_runtime.py tests/test_bad_inputs.py \
            tests/test_gemm_template_wiring.py tests/test_gemm_template.py tests/test_conv_template.py tests/test_layout.py \
            tests/test_graphs.py tests/test_rewrite_search.py > "$OUT/pytest_gpu.txt" 2>&1
        echo "pytest rc=$?"; grep -E " (PASSED|FAILED|ERROR|SKIPPED)" "$OUT/pytest_gpu.txt" | awk '{print $2}' | sort | uniq -c
        grep -E "FAILED|ERROR" "$OUT/pytest_gpu.txt" | head -30; tail -n 25 "$OUT/pytest_gpu.txt" ;;
    4)
        # Call 3 again, set up as the suite expects: no TESSERA_LOG (its handler outlives pytest's captured
        # streams), the GPU files apart from those importing tests/kernelcheck.py (which sets TRITON_INTERPRET=1
        # at import), and the carried models where the tests look for ../shared/models. Beside it, the
        # kernelcheck files compiled for the GPU (TESSERA_TEST_DEVICE=cuda).
        unset TESSERA_LOG; export TESSERA_SOLVER=highs
        mkdir -p ../shared/models && cp carry/a/*.onnx ../shared/models/
        timeout 250 python3 -m pytest -v -p no:cacheprovider -rs -k "not candy_small and not gpt2_tiny" \
            tests/test_runtime_gpu.py tests/test_profiler_gpu.py tests/test_bias_rounding.py tests/test_tf32_rounding.py \
            tests/test_workers.py tests/test_profile.py tests/test_runtime.py tests/test_bad_inputs.py \
            > "$OUT/pytest_gpu_a.txt" 2>&1 &
        TESSERA_TEST_DEVICE=cuda timeout 250 python3 -m pytest -v -p no:cacheprovider -rs -k "not candy_small and not gpt2_tiny" \
            tests/test_gemm_template.py tests/test_conv_template.py tests/test_chain.py tests/test_codegen_kernels.py \
            tests/test_tables.py > "$OUT/pytest_gpu_b.txt" 2>&1 &
        wait
        grep -E " (PASSED|FAILED|ERROR|SKIPPED)" "$OUT/pytest_gpu_a.txt" | awk '{print $2}' | sort | uniq -c
        grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_a.txt" | head -20; tail -n 3 "$OUT/pytest_gpu_a.txt"
        grep -E " (PASSED|FAILED|ERROR|SKIPPED)" "$OUT/pytest_gpu_b.txt" | awk '{print $2}' | sort | uniq -c
        grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu_b.txt" | head -20; tail -n 3 "$OUT/pytest_gpu_b.txt" ;;
    5)
        # Next session: call 4's file list, each file in its own pytest under its own timeout, so every file
        # prints its failures (call 4's first process was cut by its timeout before pytest's summary).
        # Carry .whl and carry/a (attn_s4, attn_s7, bert_tiny, candy_small, gemm_g1, gemm_g2, gemm_g3, gpt2_tiny:
        # 12.2 MB, which fits beside the 49 MB tree since the largest results are gzipped); cases of the other
        # models (candy_small_legacy, segformer_b0_small, efficientvit_b0_small) fail for want of the file, said
        # in their message.
        unset TESSERA_LOG; export TESSERA_SOLVER=highs
        mkdir -p ../shared/models && cp carry/a/*.onnx ../shared/models/
        # first, session 46's bias changes on CUDA (the padded matmul's and the broadcast conv bias's cases)
        timeout 60 python3 scripts/bias_gpu_check.py > "$OUT/bias_gpu_check.txt" 2>&1; tail -n 8 "$OUT/bias_gpu_check.txt"
        bash scripts/gpu_tests.sh "$OUT/tests" 100 ;;
    6)
        # Next session, after 5: the README's test command on the GPU machine, the whole suite in one pytest
        # process (kernelcheck compiles for the GPU there since this session). Same carry as 5; failures that
        # name a model not carried are the carry limit's, not tessera's. It also checks, on Triton 3.6,
        # launch.py's switch from CPU runs back to GPU builds (test_runtime.py's CPU cases before the GPU ones).
        unset TESSERA_LOG; export TESSERA_SOLVER=highs
        mkdir -p ../shared/models && cp carry/a/*.onnx ../shared/models/
        timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE --tb=line tests/ > "$OUT/pytest_all.txt" 2>&1
        echo "rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_all.txt" | cut -c1-200 | head -40; tail -n 2 "$OUT/pytest_all.txt" ;;
    *) echo "next.sh: call 2 to 6"; exit 2 ;;
esac
