#!/bin/bash
# Session 45's device calls: `bash scripts/results/bench/session45/next.sh N` on nvidia-h200-x2 (one runner per
# GPU, side by side), carrying .whl and .pin16 (rebuilt from HEAD first, as ../session34/next.sh says).
# 1: session 44's closed-form tables (eeef598, codegen 16: a whole-number Resize computes its index and weight
#    tables) and the fp16/bf16 cast fix (66ed5a4), at c1b1516: the gather probe, then segformer_b0 fp16 on
#    GPU 0 and tf32 on GPU 1, cold, profiled. Session 44's call 3 ran the W pass 9.2 us fp16, 13.6-14.0 tf32.
# 2 (call2_tma): a helper's run of scripts/tma_gemm_probe.py on one nvidia-h200 (README).
# 3: candy and efficientvit_b0 fp16 before (.pin, c1b1516) and after (.pin16) the bias groups; see below.
source "$(dirname "$0")/../device_lib.sh"  # the Hopper check, highspy, `gemms`, `models` and `on_gpu`
case $1 in
    1)
        export PROFILE=1
        on_gpu 0 e2e_a.txt eval 'python3 scripts/gather_probe.py > "$OUT/gather.txt" 2>&1;
                                 gemms e2e_a segformer_b0 fp16 540 eager,inductor'
        on_gpu 1 e2e_b.txt gemms e2e_b segformer_b0 tf32 560 eager,inductor
        wait; cat "$OUT/gather.txt" "$OUT/e2e_a.txt" "$OUT/e2e_b.txt" ;;
    3)
        # c9d74df's bias groups (an fp16 product is never written before its own Gemm's or Conv's bias
        # add) change the candidates of candy (16 convs) and efficientvit_b0 (13): the two at
        # c1b1516 (.pin, carried too) on GPU 0 beside HEAD (.pin16) on GPU 1, cold, profiled; GPU 1 first runs the
        # CUDA cases of tests/test_bias_rounding.py and the fuzzer's regression on CUDA.
        export PROFILE=1
        on_gpu 0 e2e_c.txt eval 'export PIN=.pin; gemms e2e_c candy fp16 200 eager,inductor; gemms e2e_d efficientvit_b0 fp16 340 eager,inductor'
        on_gpu 1 e2e_e.txt eval 'timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_bias_rounding.py > "$OUT/bias_tests.txt" 2>&1;
            timeout 30 python3 -c "import sys; sys.path.insert(0, \"tests\"); import test_fuzz, fuzzcheck
print(fuzzcheck.check(test_fuzz.REGRESSIONS[\"fp16_gemm_bias_from_input\"], device=\"cuda\"))" >> "$OUT/bias_tests.txt" 2>&1;
            gemms e2e_e candy fp16 200 eager,inductor; gemms e2e_f efficientvit_b0 fp16 300 eager,inductor'
        wait; tail -3 "$OUT/bias_tests.txt"; cat "$OUT/e2e_c.txt" "$OUT/e2e_e.txt" ;;
    6)
        # where a template build's hold of the GPU lock goes (the run_* stages of 9edaecc's profiler):
        # bert_base fp16 cold on one nvidia-h200, beside eager
        gemms e2e_g bert_base fp16 230 eager
        python3 -c "import json; t = json.load(open('/tmp/e2e_g/bench_bert_base_fp16.json'))['entries'][0]['extra']['tuning']
print(json.dumps(t['profiler_stages_s'], indent=1))" ;;
    7)
        # Next session (rebuild .pin16 from HEAD first): 78c2c20's one-thread workers, untimed. Cold
        # compiles side by side against call 1 (segformer_b0 fp16: 302 s, measuring 276 s) and call 3
        # (efficientvit_b0 fp16: past 300-340 s, 79 s of it the layout pass), with the profiler's stages.
        # First, on CUDA, what session 45's late bias changes (3a18d5d, 1ac9286, e3abfc5) were checked with on the CPU.
        timeout 40 python3 scripts/bias_gpu_check.py > "$OUT/bias_gpu_check.txt" 2>&1
        timeout 40 python3 -m pytest -q -p no:cacheprovider tests/test_torch_prims.py -k "linear_fused or cancelling or alpha" \
            >> "$OUT/bias_gpu_check.txt" 2>&1
        tail -14 "$OUT/bias_gpu_check.txt"
        export PROFILE=1
        on_gpu 0 e2e_h.txt gemms e2e_h segformer_b0 fp16 510 eager,inductor
        on_gpu 1 e2e_i.txt gemms e2e_i efficientvit_b0 fp16 510 eager
        wait; cat "$OUT/e2e_h.txt" "$OUT/e2e_i.txt" ;;
    *) echo "next.sh: call 1, 3, 6 or 7"; exit 2 ;;
esac
