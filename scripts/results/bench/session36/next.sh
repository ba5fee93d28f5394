#!/bin/bash
# Session 36's device calls after session 35's next.sh 1-3 (and the efficientvit_b0 tf32 row, call 4,
# and issue 16's bert_base row, call 5): `bash scripts/results/bench/session36/next.sh N` on nvidia-h100-x1,
# with `carry` naming .whl (the highspy wheel), .pin (git archive 583a413, as ../session34/next.sh says)
# and .pin16 (the same from the commit measured, with CODE).
# 6: issue 16, where bert_base's host time goes (scripts/call_overhead.py from the working tree, the
#    plan's real replay, cProfiles), then issue 14's tf32 "before" rows for the profile target:
#    bert_base and gpt2 tf32 with the templates off (optimal-precisionio-notemplates) at the pin.
# 8: issue 16, call 6's call_overhead.py with the measured plan (GPU time near the bench row's), the
#    collector off, and after a torch.profiler session.
# For the next session (issue 17 at HEAD: rebuild .pin16 from HEAD first; 13 needs carry/gpu too):
# 10: the segformer and EfficientViT attention blocks, fp16 and tf32, rewrites off then on (~520 s).
# 11: segformer_b0 fp16, rewrites on then off (session 35's call 5, ~470 s).
# 12: efficientvit_b0 and candy fp16, rewrites on then off (~570 s).
# 13: tests/test_runtime_gpu.py (~200 s; its one-copy conversion test has never run on a GPU).
# 7: issue 16, bert_base fp16 through the backend beside the ONNX path at .pin16 (session 35's call 4 row).
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
case $1 in
    6)
        TESSERA_LOG=warning PYTHONPATH=/tmp/site:$PWD timeout 200 python3 scripts/call_overhead.py --models bert_base \
            --out "$OUT/co" > "$OUT/co.log" 2>&1; echo "call_overhead rc=$?"; tail -12 "$OUT/co.log"
        (cd .pin && TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD python3 scripts/bench_gpus.py --gpus 1 \
            --rows bert_base:tf32=170,gpt2:tf32=170 --deadline-s 345 --cap --cold-caches --out /tmp/nt -- --solver highs \
            --profile --fresh-db --code 583a413 --vs eager --strategies optimal-precisionio-notemplates > "$OUT/nt.log" 2>&1)
        gzip -f /tmp/nt/*/*.jsonl 2>/dev/null; tar -czf "$OUT/nt.tgz" -C /tmp nt; cat "$OUT/nt.log"
        grep -h "bench .* ms$" /tmp/nt/*/log.txt ;;
    7)
        cd .pin16 || exit 1
        TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD python3 scripts/bench_gpus.py --gpus 1 \
            --rows bert_base:fp16=280 --deadline-s 285 --cap --cold-caches --out /tmp/r16 -- --solver highs --profile \
            --fresh-db --code "$(cat CODE)" --vs tessera-dynamo --guards skip-modules \
            --strategies optimal-precisionio > "$OUT/r16.log" 2>&1
        gzip -f /tmp/r16/*/*.jsonl; tar -czf "$OUT/r16.tgz" -C /tmp r16; cat "$OUT/r16.log"; grep -h "bench .* ms$" /tmp/r16/*/log.txt ;;
    8)  # issue 16: the host time per layer with the real (measured) plan, its GPU time about 350 µs
        TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD timeout 400 python3 scripts/call_overhead.py --models bert_base \
            --cost measured --db /tmp/co8.db --out "$OUT/co" > "$OUT/co.log" 2>&1; echo "call_overhead rc=$?"
        grep -v "^tessera .* pass \|tuning\|Warning\|warn" "$OUT/co.log" | tail -16 ;;
    10) # issue 17: the blocks at the whole-plan guard, rewrites off then on, GPU time, from .pin16 (HEAD)
        cd .pin16 || exit 1
        mkdir -p /tmp/blocks
        TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD timeout 560 python3 scripts/bench_suite.py \
            --models segformer_attn,efficientvit_attn --precisions fp16,tf32 --vs inductor-cudagraphs,sdpa \
            --strategies optimal-precisionio,optimal-precisionio-rewrites --timing gpu --fresh-db --profile \
            --solver highs --code "$(cat CODE)" --out /tmp/blocks > /tmp/blocks/log.txt 2>&1
        echo "blocks rc=$?"; gzip -f /tmp/blocks/*.jsonl 2>/dev/null; tar -czf "$OUT/blocks.tgz" -C /tmp blocks
        grep -h "bench .* ms$\|rewrites:\|rewrite search" /tmp/blocks/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    11) exec bash "$(dirname "$0")/../session35/next.sh" 5 ;;  # issue 17: segformer_b0 fp16, rewrites on then off
    12) # issue 17: efficientvit_b0 and candy fp16, rewrites on then off, from an empty database
        cd .pin16 || exit 1
        TESSERA_LOG=info PYTHONPATH=/tmp/site:$PWD python3 scripts/bench_gpus.py --gpus 1 \
            --rows efficientvit_b0:fp16=380,candy:fp16=180 --deadline-s 570 --cap --cold-caches --out /tmp/r17 -- \
            --solver highs --profile --fresh-db --code "$(cat CODE)" --vs inductor-cudagraphs \
            --strategies optimal-precisionio-rewrites,optimal-precisionio > "$OUT/r17.log" 2>&1
        gzip -f /tmp/r17/*/*.jsonl 2>/dev/null; tar -czf "$OUT/r17.tgz" -C /tmp r17; cat "$OUT/r17.log"
        grep -h "bench .* ms$\|rewrites:\|pass \(rewrites\|orchestrate\)" /tmp/r17/*/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    13) # the GPU tests of the runtime (CUDA-graph replay, the one-copy conversion, the in-graph index check)
        PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -q tests/test_runtime_gpu.py 2>&1 | tail -8 ;;
    *) echo "next.sh: call 6, 7, 8, 10, 11, 12 or 13"; exit 2 ;;
esac
