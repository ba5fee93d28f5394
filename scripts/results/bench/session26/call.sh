#!/bin/bash
# Session 26's device calls: `bash scripts/results/bench/session26/call.sh N SHA` on the GPU machine,
# after the wheels are installed (PYTHONPATH holds them and the repo). Each step has its own time
# limit, so what finished comes back under $OUT even when a later step runs long.
n=$1; code=$2
B="python3 scripts/bench_suite.py --solver highs --profile --fresh-db --keep-db /tmp/dbs --code $code"
step() { local t=$1; shift; echo "== $(date +%T) $*" >> $OUT/call.log; timeout -k 5 $t "$@" >> $OUT/call.log 2>&1; echo "== rc $?" >> $OUT/call.log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
case $n in
1)  # split-K GEMM on the GPU; resnet50 fp16 through the ONNX path and torch.compile(backend="tessera"); warm recompile
    step 90 python3 -m pytest -q -x tests/test_gemm_template.py -k split_k
    step 300 $B --models resnet50 --precisions fp16 --vs inductor-cudagraphs,tessera-dynamo --strategies optimal-precisionio --out $OUT
    step 150 python3 scripts/recompile_time.py --models resnet50 --cost measured --db /tmp/dbs/resnet50_fp16.db --json $OUT/recompile_resnet50.json ;;
2)  # gpt2 fp16 cold with the GEMM ranking (4d77a98), beside the backend; warm recompile
    step 470 $B --models gpt2 --precisions fp16 --vs inductor-cudagraphs,tessera-dynamo --strategies optimal-precisionio --out $OUT
    step 110 python3 scripts/recompile_time.py --models gpt2 --cost measured --db /tmp/dbs/gpt2_fp16.db --json $OUT/recompile_gpt2.json ;;
3|4) # a tf32 transformer without templates (the profile target's "before") and with them, one database
    m=$([ $n = 3 ] && echo bert_base || echo gpt2)
    step 570 $B --models $m --precisions tf32 --vs eager --strategies optimal-precisionio-notemplates,optimal-precisionio --out $OUT ;;
5)  # issue 14's suite rows not yet run at recent code
    step 300 $B --models segformer_b0 --precisions fp16 --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT
    step 270 $B --models efficientvit_b0 --precisions fp16 --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT ;;
6)  # the fault in gpt2's recompile (call 2), kernel by kernel; the backend's host time by layer;
    # resnet50 through the backend with BatchNorm folded into the convolutions (warm, call 1's rows)
    D=scripts/results/bench/session26
    gunzip -c $D/call2/tuning.jsonl.gz > /tmp/g.jsonl; python3 -m tessera db --db /tmp/g.db import /tmp/g.jsonl
    gunzip -c $D/call1/tuning.jsonl.gz > /tmp/r.jsonl; python3 -m tessera db --db /tmp/r.db import /tmp/r.jsonl
    step 230 python3 scripts/fault_probe.py --model gpt2 --db /tmp/g.db --out $OUT/fault
    step 150 python3 scripts/call_overhead.py --models resnet50,gpt2 --out $OUT/overhead
    step 160 python3 scripts/bench_suite.py --solver highs --profile --db /tmp/r.db --code $code --models resnet50 \
        --precisions fp16 --vs tessera-dynamo --strategies optimal-precisionio --out $OUT ;;
7)  # after KNOWN_FAULTS (chain.py): gpt2's plan kernel by kernel, then the warm recompile of gpt2 and
    # of resnet50 (BatchNorm folded) through the backend
    D=scripts/results/bench/session26
    gunzip -c $D/call2/tuning.jsonl.gz > /tmp/g.jsonl; python3 -m tessera db --db /tmp/g.db import /tmp/g.jsonl
    gunzip -c $D/call1/tuning.jsonl.gz > /tmp/r.jsonl; python3 -m tessera db --db /tmp/r.db import /tmp/r.jsonl
    step 200 python3 scripts/fault_probe.py --model gpt2 --db /tmp/g.db --out $OUT/fault
    step 150 python3 scripts/recompile_time.py --models gpt2 --cost measured --db /tmp/g.db --json $OUT/recompile_gpt2.json
    step 90 python3 scripts/recompile_time.py --models resnet50 --cost measured --db /tmp/r.db --json $OUT/recompile_resnet50.json
    step 120 python3 scripts/bench_suite.py --solver highs --profile --db /tmp/g.db --code $code --models gpt2 \
        --precisions fp16 --vs tessera-dynamo --strategies optimal-precisionio --out $OUT ;;
# Not run in session 26 (no device time left): the next calls, one per 600 s call, logging each
# contender as it finishes.
10) # bert_base's host-bound call through the backend, on the GPU machine's CPU; warm recompiles
    export TESSERA_LOG=info
    step 200 python3 scripts/call_overhead.py --models bert_base,gpt2,resnet50 --out $OUT/overhead
    D=scripts/results/bench/session26
    gunzip -c $D/call9/tuning.jsonl.gz > /tmp/b.jsonl; python3 -m tessera db --db /tmp/b.db import /tmp/b.jsonl
    step 300 python3 scripts/recompile_time.py --models bert_base --cost measured --db /tmp/b.db --json $OUT/recompile_bert_base.json ;;
11|12|13) # issue 14's missing suite rows, one model per call, cold
    export TESSERA_LOG=info
    m=$([ $n = 11 ] && echo segformer_b0 || ([ $n = 12 ] && echo efficientvit_b0 || echo segformer_b0))
    pr=$([ $n = 13 ] && echo tf32 || echo fp16)
    step 580 $B --models $m --precisions $pr --vs inductor-cudagraphs --strategies optimal-precisionio --out $OUT ;;
esac
gzip -f $OUT/*.jsonl 2>/dev/null
tail -n 40 $OUT/call.log
