#!/bin/bash
# The next session's device calls (README, "Plan for the next session's device time"), one per run:
#   bash scripts/results/bench/session34/next.sh N      (N = 1..4 on nvidia-h100-x1; x2a, x2b on an H100 pair)
# Before: `.pin` from 583a413 (rows 1-3, x2a, x2b) and `.pin16` from HEAD (call 4), both made with
#   git archive SHA tessera scripts/bench_suite.py scripts/bench_gpus.py scripts/linear_share.py pyproject.toml
# (and `git rev-parse --short HEAD > .pin16/CODE`), carried with the highspy wheel (and carry/gpu for call 4).
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }  # an x2 request may be given H200s
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
export PYTHONPATH=/tmp/site
here=$(dirname "$0")
row() { rm -rf /tmp/rows; bash "$here/../session32/call.sh" "$1" "$2" 583a413 eager,inductor-cudagraphs; }
case $1 in
    1) row segformer_b0:fp16=430 440 ;;
    2) row segformer_b0:tf32=430 440 ;;
    3) row efficientvit_b0:fp16=430 440 ;;
    x2a) row segformer_b0:fp16=430,efficientvit_b0:fp16=430 440 ;;
    x2b) row segformer_b0:tf32=430,efficientvit_b0:tf32=430 440 ;;
    4)  # issue 16: bert_base fp16 through the backend, frozen-inference guards; then the GPU runtime tests
        (cd .pin16 && TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD python3 scripts/bench_gpus.py --gpus 1 \
            --rows bert_base:fp16=280 --deadline-s 285 --cap --cold-caches --out /tmp/r16 -- --solver highs --profile \
            --fresh-db --code "$(cat CODE)" --vs tessera-dynamo --guards skip-modules \
            --strategies optimal-precisionio > "$OUT/r16.log" 2>&1
         gzip -f /tmp/r16/*/*.jsonl; tar -czf "$OUT/r16.tgz" -C /tmp r16; cat "$OUT/r16.log"; grep -h "bench .* ms$" /tmp/r16/*/log.txt)
        PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m pytest -q tests/test_runtime_gpu.py 2>&1 | tail -5 ;;
    *) echo "next.sh: call 1, 2, 3, 4, x2a or x2b"; exit 2 ;;
esac
