#!/bin/bash
# Session 38's device calls: `bash scripts/results/bench/session38/next.sh N` on nvidia-h100-x1, with `carry`
# naming .whl (the highspy wheel) and .pin16 (git archive of the commit measured, with CODE; rebuild it from
# HEAD first, as ../session34/next.sh says).
# 1: issue 15's GEMM chains g4-g12 then g1-g3, tf32 then fp16, --rewrites on only (matmul_associative),
#    beside eager's two calls, GPU time, one empty database per precision: the GEMM template walk
#    (cost/measured.py::_family_walk) measured against session 38's calls 1-2 (before it).
# Table: python scripts/mcfuser_table.py scripts/results/bench/session38/call6/g*/
# 2 and 5 (next session): call 1's rows again at HEAD, tf32 (2) and fp16 (5): the 4-warp small tiles for 4-byte
#    operands (codegen/gemm.py) and the rule matmul_chain_transposed (a right-grouped pair as one chain kernel,
#    rewrite/rules/associative_matmul.py), against call 6's rows.
# 3 (next session): bert_base and gpt2 tf32 (the 4-byte small-tile warps change and the family walk in whole
#    models), cold, beside Inductor with CUDA graphs; compare with issue 14's suite rows (session 33, 583a413).
# 4 (next session): mobilenet_v2 and segformer_b0 fp16, --rewrites on (first, cold) then off: the 1x1-convolution
#    pairs as GEMM chains (conv1x1_pair_as_mlp, 4f98243); the run profiles name the chain kernels.
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cd .pin16 || exit 1
export PYTHONPATH=/tmp/site:$PWD TESSERA_LOG=info
case $1 in
    1)
        for p in tf32 fp16; do
            mkdir -p /tmp/g$p
            timeout 280 python3 scripts/bench_suite.py --models "$(echo gemm_g{4..12} gemm_g{1..3} | tr ' ' ,)" \
                --precisions $p --vs eager --strategies optimal-precisionio-rewrites --timing gpu --fresh-db \
                --budget-s 260 --solver highs --code "$(cat CODE)" --out /tmp/g$p > /tmp/g$p/log.txt 2>&1
            echo "gemm $p rc=$?"; gzip -f /tmp/g$p/*.jsonl 2>/dev/null; tar -czf "$OUT/g$p.tgz" -C /tmp g$p
            grep -h "bench .* ms$" /tmp/g$p/log.txt | sed 's/.*tessera [0-9:]* //'
        done ;;
    2|5)  # call 1's rows at HEAD, one precision a call (the chain searches take longer): 2 tf32, 5 fp16
        p=$([ "$1" = 2 ] && echo tf32 || echo fp16)
        mkdir -p /tmp/g$p
        timeout 560 python3 scripts/bench_suite.py --models "$(echo gemm_g{4..12} gemm_g{1..3} | tr ' ' ,)" \
            --precisions $p --vs eager --strategies optimal-precisionio-rewrites --timing gpu --fresh-db \
            --budget-s 500 --solver highs --code "$(cat CODE)" --out /tmp/g$p > /tmp/g$p/log.txt 2>&1
        echo "gemm $p rc=$?"; gzip -f /tmp/g$p/*.jsonl 2>/dev/null; tar -czf "$OUT/g$p.tgz" -C /tmp g$p
        grep -h "bench .* ms$\|rewrites:" /tmp/g$p/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    3)
        python3 scripts/bench_gpus.py --gpus 1 --rows bert_base:tf32=280,gpt2:tf32=280 --deadline-s 570 --cap \
            --cold-caches --out /tmp/m38 -- --solver highs --profile --fresh-db --code "$(cat CODE)" \
            --vs inductor-cudagraphs --strategies optimal-precisionio > "$OUT/m38.log" 2>&1
        gzip -f /tmp/m38/*/*.jsonl 2>/dev/null; tar -czf "$OUT/m38.tgz" -C /tmp m38; cat "$OUT/m38.log"
        grep -h "bench .* ms$" /tmp/m38/*/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    4)
        python3 scripts/bench_gpus.py --gpus 1 --rows mobilenet_v2:fp16=200,segformer_b0:fp16=360 --deadline-s 570 \
            --cap --cold-caches --out /tmp/p38 -- --solver highs --profile --fresh-db --code "$(cat CODE)" \
            --vs inductor-cudagraphs --strategies optimal-precisionio-rewrites,optimal-precisionio > "$OUT/p38.log" 2>&1
        gzip -f /tmp/p38/*/*.jsonl 2>/dev/null; tar -czf "$OUT/p38.tgz" -C /tmp p38; cat "$OUT/p38.log"
        grep -h "bench .* ms$\|rewrites:" /tmp/p38/*/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    *) echo "next.sh: call 1-5"; exit 2 ;;
esac
