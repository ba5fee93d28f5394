#!/bin/bash
# The next session's device calls (README here), one per run:
#   bash scripts/results/bench/session35/next.sh N
# 1-4, x2a, x2b: session 34's plan unchanged (issue 14's last rows at the pin 583a413; issue 16's
# bert_base row and GPU tests from .pin16), see ../session34/next.sh.
# 5: issue 17, segformer_b0 fp16 with the rewrites on, then off, at the code in .pin16 (HEAD), from
#    an empty database: the rewrites contender compiles cold (its plan without the rewrites first,
#    then the search, then a second plan only if the windows promise 3% of the first), the off
#    contender warm. `rewrites.seconds + guard_s` in its entry is what the rewrites added.
# Before: `.pin` (583a413) and `.pin16` (HEAD, with CODE) as ../session34/next.sh says, carried
# with the highspy wheel (and carry/gpu for call 4).
here=$(dirname "$0")
case $1 in
    1|2|3|4|x2a|x2b) exec bash "$here/../session34/next.sh" "$1" ;;
    5) ;;
    *) echo "next.sh: call 1, 2, 3, 4, 5, x2a or x2b"; exit 2 ;;
esac
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cd .pin16 || exit 1
TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD python3 scripts/bench_gpus.py --gpus 1 \
    --rows segformer_b0:fp16=470 --deadline-s 480 --cap --cold-caches --out /tmp/r17 -- --solver highs --profile \
    --fresh-db --keep-db /tmp/dbs17 --code "$(cat CODE)" --vs inductor-cudagraphs \
    --strategies optimal-precisionio-rewrites,optimal-precisionio > "$OUT/r17.log" 2>&1
gzip -f /tmp/r17/*/*.jsonl 2>/dev/null
tar -czf "$OUT/r17.tgz" -C /tmp r17
cat "$OUT/r17.log"
grep -h "bench .* ms$\|rewrites:\|pass \(rewrites\|orchestrate\)" /tmp/r17/*/log.txt | sed 's/.*tessera [0-9:]* //'
