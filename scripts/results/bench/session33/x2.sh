#!/bin/bash
# Two bench_gpus runs side by side on a two-GPU H100 machine (`nvidia-h100-x2`), each on its own GPU
# and half of the cores (bench_gpus.py --only), so rows that need different suite arguments share
# one call: issue 16's backend rows on GPU 0, issue 17's rewrites rows on GPU 1.
#   bash scripts/results/bench/session33/x2.sh CODE DEADLINE_S "ROWS_GPU0" "ARGS_GPU0" "ROWS_GPU1" "ARGS_GPU1"
# e.g. x2.sh SHA 560 "bert_base:fp16=280,resnet50:fp16=200" "--vs tessera-dynamo --strategies optimal-precisionio" \
#        "segformer_b0:fp16=520" "--vs inductor-cudagraphs --strategies optimal-precisionio-rewrites,optimal-precisionio"
# Run from the repo root after the wheels are installed (PYTHONPATH holds them); the measured code is
# .pin/ (`git archive CODE ...`). Exits 3 at once unless the GPUs are H100s (an x2 call may get H200s).
code=$1; deadline=$2; rows0=$3; args0=$4; rows1=$5; args1=$6
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > $OUT/gpu.txt
export TESSERA_LOG=info PYTHONPATH=$PYTHONPATH:$PWD/.pin
cd .pin || exit 1
run() {  # GPU ROWS ARGS NAME
    [ -n "$2" ] || return 0
    # shellcheck disable=SC2086 # the suite's arguments are words
    python3 scripts/bench_gpus.py --gpus 2 --only "$1" --rows "$2" --deadline-s "$deadline" --cap --cold-caches \
        --out /tmp/$4 -- --solver highs --profile --fresh-db --keep-db /tmp/dbs_$4 --code "$code" $3 > $OUT/$4.log 2>&1
    gzip -f /tmp/$4/*/*.jsonl 2>/dev/null
    tar -czf $OUT/$4.tgz -C /tmp $4
}
run 0 "$rows0" "$args0" gpu0 &
run 1 "$rows1" "$args1" gpu1 &
wait
cat $OUT/gpu0.log $OUT/gpu1.log 2>/dev/null
grep -h "bench .* ms$\|rewrites:" /tmp/gpu0/*/log.txt /tmp/gpu1/*/log.txt 2>/dev/null | sed 's/.*tessera [0-9:]* //'
