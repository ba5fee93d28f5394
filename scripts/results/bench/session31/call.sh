#!/bin/bash
# Session 31's device calls: issue 14's 16-row suite at one pinned commit, rows side by side on a
# four-GPU machine (scripts/bench_gpus.py: one row per GPU, each confined to its GPU's 16 cores;
# --cap: a row is stopped once it has run for its estimate, so a max-autotune that cannot finish frees its GPU).
#   bash scripts/results/bench/session31/call.sh ROWS DEADLINE_S CODE
# run from the repo root on the GPU machine, after the wheels are installed (PYTHONPATH holds
# them). The measured code is the pinned copy in .pin/ (`git archive CODE tessera scripts`), so
# work in the tree after CODE does not travel into the numbers.
rows=$1; deadline=$2; code=$3
export TESSERA_LOG=info PYTHONPATH=$PYTHONPATH:$PWD/.pin
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt
cd .pin || exit 1
python3 scripts/bench_gpus.py --rows "$rows" --deadline-s "$deadline" --cap --out /tmp/rows -- \
    --solver highs --profile --fresh-db --keep-db /tmp/dbs --code "$code" \
    --vs eager,inductor-cudagraphs,inductor-max-autotune --strategies optimal-precisionio > $OUT/call.log 2>&1
gzip -f /tmp/rows/*/*.jsonl 2>/dev/null
tar -czf $OUT/rows.tgz -C /tmp rows
cat $OUT/call.log
grep -h "bench .* ms$" /tmp/rows/*/log.txt | sed 's/.*bench /bench /'
