#!/bin/bash
# Session 27's device calls: `bash scripts/results/bench/session27/call.sh N SHA` on the GPU machine,
# after the wheels are installed (PYTHONPATH holds them and the repo). Each step has its own time
# limit, so what finished comes back under $OUT even when a later step runs long.
n=$1; code=$2
export TESSERA_LOG=info
B="python3 scripts/bench_suite.py --solver highs --profile --fresh-db --keep-db /tmp/dbs --code $code"
step() { local t=$1; shift; echo "== $(date +%T) $*" >> $OUT/call.log; timeout -k 5 $t "$@" >> $OUT/call.log 2>&1; echo "== rc $?" >> $OUT/call.log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
case $n in
1|2|3) # issue 14's cold-tuning limit (5 min) after write variants share a measurement: one model per call
    m=$([ $n = 1 ] && echo segformer_b0 || ([ $n = 2 ] && echo efficientvit_b0 || echo segformer_b0))
    pr=$([ $n = 3 ] && echo tf32 || echo fp16)
    step 580 $B --models $m --precisions $pr --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT ;;
4)  # bert_base's host-bound call through the backend, on the GPU machine's CPU; warm recompile
    step 200 python3 scripts/call_overhead.py --models bert_base,gpt2,resnet50 --out $OUT/overhead
    D=scripts/results/bench/session26
    gunzip -c $D/call9/tuning.jsonl.gz > /tmp/b.jsonl; python3 -m tessera db --db /tmp/b.db import /tmp/b.jsonl
    step 300 python3 scripts/recompile_time.py --models bert_base --cost measured --db /tmp/b.db --json $OUT/recompile_bert_base.json ;;
6)  # bert_base fp16 through the backend beside the ONNX path and Inductor, dynamo's guards on module
    # state kept and dropped (--guards), warm from session 26's call 9 rows (H200)
    D=scripts/results/bench/session26
    gunzip -c $D/call9/tuning.jsonl.gz > /tmp/b.jsonl; python3 -m tessera db --db /tmp/b.db import /tmp/b.jsonl
    for g in all skip-modules; do
        mkdir -p $OUT/$g
        step 280 python3 scripts/bench_suite.py --solver highs --profile --db /tmp/b.db --code $code --models bert_base \
            --precisions fp16 --vs inductor-cudagraphs,tessera-dynamo --strategies optimal-precisionio --guards $g --out $OUT/$g
    done ;;
esac
gzip -f $OUT/*.jsonl 2>/dev/null
tail -n 40 $OUT/call.log
