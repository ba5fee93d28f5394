#!/bin/bash
# Session 29's device calls: `bash scripts/results/bench/session29/call.sh N SHA` on the GPU machine,
# after the wheels are installed (PYTHONPATH holds them and the repo). Each step has its own time
# limit, so what finished comes back under $OUT even when a later step runs long.
n=$1; code=$2
export TESSERA_LOG=info
B="python3 scripts/bench_suite.py --solver highs --profile --fresh-db --keep-db /tmp/dbs --code $code"
step() { local t=$1; shift; echo "== $(date +%T) $*" >> $OUT/call.log; timeout -k 5 $t "$@" >> $OUT/call.log 2>&1; echo "== rc $?" >> $OUT/call.log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
case $n in
1)  # gpt2 tf32 with scalar constants as literals (the tanh-GELU epilogue at a third of its
    # instructions) and GEMMs ranked as 1x1 convolutions: both sides of issue 14's profile target
    step 560 $B --models gpt2 --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
2)  # gpt2 fp16 beside Inductor (the profile target's before side is session 23's H100 profile)
    step 560 $B --models gpt2 --precisions fp16 --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT ;;
3)  # inception_v3 tf32: both sides of the profile target, cold
    step 560 $B --models inception_v3 --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
4)  # what rounding the activation to tf32 in the K loop costs a GEMM (A from registers, not shared memory)
    step 300 python3 scripts/tf32_operand_probe.py --kinds nk32,nk32r --out $OUT/tf32_round_probe.json ;;
5)  # bert_base fp16 with and without the QKV merge, beside Inductor, cold (session 28's call 5)
    step 580 $B --models bert_base --precisions fp16 --vs inductor-cudagraphs \
        --strategies optimal-precisionio,optimal-precisionio-nomerge --out $OUT ;;
6)  # tf32 activations rounded by their writer, not in the K loop (mark_tf32_operands): gpt2 tf32, both
    # sides of the profile target
    step 560 $B --models gpt2 --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
7)  # the same for inception_v3 tf32 (convolution templates round their activation too)
    step 560 $B --models inception_v3 --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
8)  # the same for bert_base tf32 (session 28 met the target on the H200 at -33%)
    step 560 $B --models bert_base --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
esac
gzip -f $OUT/*.jsonl 2>/dev/null
tail -n 40 $OUT/call.log
