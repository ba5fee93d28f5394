#!/bin/bash
# Session 28's device calls: `bash scripts/results/bench/session28/call.sh N SHA` on the GPU machine,
# after the wheels are installed (PYTHONPATH holds them and the repo). Each step has its own time
# limit, so what finished comes back under $OUT even when a later step runs long.
# (Call 1 ran `scripts/tf32_operand_probe.py --out $OUT/tf32_operand_probe.json` directly.)
n=$1; code=$2
export TESSERA_LOG=info
B="python3 scripts/bench_suite.py --solver highs --profile --fresh-db --keep-db /tmp/dbs --code $code"
step() { local t=$1; shift; echo "== $(date +%T) $*" >> $OUT/call.log; timeout -k 5 $t "$@" >> $OUT/call.log 2>&1; echo "== rc $?" >> $OUT/call.log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
case $n in
2)  # tf32 transformers with K-major constant weights: without templates (the profile target's
    # "before") and with them, one database per model
    step 285 $B --models bert_base --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT
    step 285 $B --models gpt2 --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
3)  # the GEMM probe in tf32 with K-major weights; bert_base with its QKV merged, tf32 (both sides of the
    # profile target) and fp16 beside Inductor
    step 120 python3 scripts/gemm_probe.py --precisions tf32 --out $OUT/gemm_probe_tf32.json
    step 260 $B --models bert_base --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT
    step 195 $B --models bert_base --precisions fp16 --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT ;;
# Not run in session 28 (no device time left): the next calls, one per 600 s call.
5)  # bert_base fp16 with and without the QKV merge, beside Inductor, cold (the compile alone took 155 s)
    step 580 $B --models bert_base --precisions fp16 --vs inductor-cudagraphs \
        --strategies optimal-precisionio,optimal-precisionio-nomerge --out $OUT ;;
6)  # gpt2 fp16 with K-major tf32 weights in place (fp16 is unaffected by them; the profile target's
    # fp16 row was -21% in session 23, H100)
    step 580 $B --models gpt2 --precisions fp16 --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT ;;
esac
gzip -f $OUT/*.jsonl 2>/dev/null
tail -n 40 $OUT/call.log
