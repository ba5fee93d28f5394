#!/bin/bash
# Session 33's device calls (session 32's call.sh, with the rows' strategies as a 6th argument and the blocks
# in $BLOCK_MODELS), on one H100 (`nvidia-h100-x1`): issue 14's suite rows at one pinned commit,
# with the PyTorch backend timed in the same process (issue 16) and, when BLOCKS is set, issue 17's
# three blocks with rewrites off and on first.
#   bash scripts/results/bench/session33/call.sh ROWS DEADLINE_S CODE VS [BLOCKS_S [STRATEGIES]]
# run from the repo root on the GPU machine, after the wheels are installed (PYTHONPATH holds
# them). The measured code is the pinned copy in .pin/ (`git archive CODE tessera scripts`), so
# work in the tree after CODE does not travel into the numbers. Rows run one after another on the
# one GPU (scripts/bench_gpus.py --cap --cold-caches: each row from empty caches and an empty database).
rows=$1; deadline=$2; code=$3; vs=$4; blocks_s=${5:-0}; strategies=${6:-optimal-precisionio}
export TESSERA_LOG=info PYTHONPATH=$PYTHONPATH:$PWD/.pin
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > $OUT/gpu.txt
nproc >> $OUT/gpu.txt
cd .pin || exit 1
start=$SECONDS
if [ "$blocks_s" -gt 0 ]; then
    mkdir -p /tmp/blocks
    timeout "$blocks_s" python3 scripts/bench_suite.py --models "${BLOCK_MODELS:-segformer_attn,efficientvit_attn,candy_norm_pad}" \
        --precisions fp16,tf32 --vs inductor-cudagraphs,sdpa \
        --strategies optimal-precisionio,optimal-precisionio-rewrites --timing gpu --fresh-db --profile \
        --solver highs --code "$code" --out /tmp/blocks > /tmp/blocks/log.txt 2>&1
    echo "blocks rc=$? in $((SECONDS - start)) s" >> /tmp/blocks/log.txt
    gzip -f /tmp/blocks/*.jsonl 2>/dev/null
    tar -czf $OUT/blocks.tgz -C /tmp blocks
    grep -h "bench .* ms$\|blocks rc" /tmp/blocks/log.txt | sed 's/.*bench /bench /'
fi
if [ -n "$rows" ]; then
    python3 scripts/bench_gpus.py --rows "$rows" --deadline-s $((deadline - (SECONDS - start))) --cap --cold-caches \
        --out /tmp/rows -- --solver highs --profile --fresh-db --keep-db /tmp/dbs --code "$code" \
        --vs "$vs" --strategies "$strategies" > $OUT/call.log 2>&1
    gzip -f /tmp/rows/*/*.jsonl 2>/dev/null
    tar -czf $OUT/rows.tgz -C /tmp rows
    cat $OUT/call.log
    grep -h "bench .* ms$" /tmp/rows/*/log.txt | sed 's/.*bench /bench /'
fi
