#!/bin/bash
# The next session's device calls: `bash scripts/results/bench/session37/next.sh N` on nvidia-h100-x1, with
# `carry` naming .whl (the highspy wheel) and .pin16 (git archive of the commit measured, with CODE; rebuild
# it from HEAD first, as ../session34/next.sh says).
# 1: issue 15, gemm_g4-g12 then g1-g3, fp16, with the regrouping rule (--rewrites on, first, from an empty database) beside
#    rewrites off and eager's two calls, GPU time (~450 s).
# 2: the same in tf32.
# Table (issue 15): python scripts/mcfuser_table.py scripts/results/mcfuser/h100_2026-11-24/s1[345]/*/ \
#    scripts/results/bench/session37/call15_attn_s6 <the new gemm folders>
# 3: issue 17, segformer_b0 and candy tf32, rewrites on then off (the full-model rows session 37 ran in fp16).
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cd .pin16 || exit 1
export PYTHONPATH=/tmp/site:$PWD TESSERA_LOG=info
case $1 in
    1|2)
        p=$([ "$1" = 1 ] && echo fp16 || echo tf32)
        mkdir -p /tmp/g$p
        timeout 570 python3 scripts/bench_suite.py --models "$(echo gemm_g{4..12} gemm_g{1..3} | tr ' ' ,)" --precisions $p \
            --vs eager --strategies optimal-precisionio-rewrites,optimal-precisionio --timing gpu --fresh-db \
            --budget-s 520 --solver highs --code "$(cat CODE)" --out /tmp/g$p > /tmp/g$p/log.txt 2>&1
        echo "gemm $p rc=$?"; gzip -f /tmp/g$p/*.jsonl 2>/dev/null; tar -czf "$OUT/g$p.tgz" -C /tmp g$p
        grep -h "bench .* ms$\|rewrites:" /tmp/g$p/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    3)
        python3 scripts/bench_gpus.py --gpus 1 --rows segformer_b0:tf32=380,candy:tf32=180 --deadline-s 570 --cap \
            --cold-caches --out /tmp/r17t -- --solver highs --profile --fresh-db --code "$(cat CODE)" \
            --vs inductor-cudagraphs --strategies optimal-precisionio-rewrites,optimal-precisionio > "$OUT/r17t.log" 2>&1
        gzip -f /tmp/r17t/*/*.jsonl 2>/dev/null; tar -czf "$OUT/r17t.tgz" -C /tmp r17t; cat "$OUT/r17t.log"
        grep -h "bench .* ms$\|rewrites:" /tmp/r17t/*/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    *) echo "next.sh: call 1, 2 or 3"; exit 2 ;;
esac
