#!/bin/bash
# Session 49: a failed CUDA-graph capture falls back to launches, with torch's leftovers put back.
# From the repository root on one nvidia-h200, carrying .whl and carry/e (gemm_g1, gpt2_tiny, bert_tiny).
source scripts/results/bench/device_lib.sh >/dev/null
unset TESSERA_LOG; export TESSERA_SOLVER=highs
mkdir -p ../shared/models && cp carry/e/*.onnx ../shared/models/ 2>/dev/null
echo "== what a failed capture leaves, and which calls of a second thread break one (capture_modes.py)"
PYTHONPATH=/tmp/site:. python3 scripts/results/bench/session49/capture_modes.py 2>&1 | tee "$OUT/capture_modes.txt"
echo "== tests/test_graphs.py"
python3 -m pytest -q -p no:cacheprovider -rA tests/test_graphs.py > "$OUT/graphs_tests.txt" 2>&1
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|^E  " "$OUT/graphs_tests.txt" | cut -c1-220 | head -30; tail -n 1 "$OUT/graphs_tests.txt"
echo "== the interpreter's index-check test, then the GPU replay tests, in one process (the order that failed)"
python3 -m pytest -q -p no:cacheprovider tests/test_runtime.py::test_the_index_check_runs_on_the_cpu_and_its_kernel_in_the_interpreter \
    tests/test_runtime_gpu.py > "$OUT/gpu_tests.txt" 2>&1
grep -E "^(FAILED|ERROR)|^E  " "$OUT/gpu_tests.txt" | cut -c1-200 | sort | uniq -c | sort -rn | head -12; tail -n 1 "$OUT/gpu_tests.txt"
