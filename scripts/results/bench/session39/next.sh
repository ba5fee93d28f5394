#!/bin/bash
# Session 39's device calls: `bash scripts/results/bench/session39/next.sh N` on nvidia-h100-x1, with `carry`
# naming .whl (the highspy wheel) and .pin16 (git archive of the commit measured, with CODE; rebuild it from
# HEAD first, as ../session34/next.sh says).
# 1: issue 15's GEMM chains with the default options (the rewrite mode `regroup`: only matmul_associative and
#    fold_constant_matmul searched), beside eager's two calls, GPU time, one empty database per precision:
#    tf32 g1, g7-g12; fp16 g1, g8-g12. Against calls 2 and 5 (`--rewrites on`, 665d659).
# Table: python scripts/mcfuser_table.py scripts/results/bench/session39/call1/g*/
# 2 (next session): scripts/splitk_chain_probe.py, the regrouped chains' first product split in S slices whose
#    partials the second GEMM sums as it loads them: fp16 G7-G10 and G4 (about 3 minutes), then tf32 G4-G6.
# 3 (next session): tf32 G4-G6, G8, G10 at HEAD with the default options: the template walk over three tile
#    shapes (GEMM_WALK_FAMILIES, efc4a2d) against calls 2 and 1.
# 4 (next session): fp16 G7-G10 and G4 at HEAD with --rewrites on (optimal-precisionio-rewrites): does the
#    measured search keep matmul_split_k (the first product split over K, its partials summed by the
#    second GEMM as it loads them)? The log's rewrite lines and the table's kernels column say.
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cd .pin16 || exit 1
export PYTHONPATH=/tmp/site:$PWD TESSERA_LOG=info
case $1 in
    1)
        for p in tf32 fp16; do
            rows=$([ $p = tf32 ] && echo gemm_g1,gemm_g7,gemm_g8,gemm_g9,gemm_g10,gemm_g11,gemm_g12 \
                                 || echo gemm_g1,gemm_g8,gemm_g9,gemm_g10,gemm_g11,gemm_g12)
            mkdir -p /tmp/g$p
            timeout 230 python3 scripts/bench_suite.py --models "$rows" --precisions $p --vs eager \
                --strategies optimal-precisionio --timing gpu --fresh-db --budget-s 215 --solver highs \
                --code "$(cat CODE)" --out /tmp/g$p > /tmp/g$p/log.txt 2>&1
            echo "gemm $p rc=$?"; gzip -f /tmp/g$p/*.jsonl 2>/dev/null; tar -czf "$OUT/g$p.tgz" -C /tmp g$p
            grep -h "bench .* ms$\|rewrites:" /tmp/g$p/log.txt | sed 's/.*tessera [0-9:]* //'
        done ;;
    2)  # the probe runs from the working tree (it is not in .pin16)
        cd .. && export PYTHONPATH=/tmp/site:$PWD
        timeout 300 python3 scripts/splitk_chain_probe.py --cases 7,8,9,10,4 --precisions fp16 > "$OUT/splitk_fp16.txt" 2>&1
        echo "fp16 rc=$?"; tail -14 "$OUT/splitk_fp16.txt"
        timeout 200 python3 scripts/splitk_chain_probe.py --cases 4,5,6 --precisions tf32 > "$OUT/splitk_tf32.txt" 2>&1
        echo "tf32 rc=$?"; tail -10 "$OUT/splitk_tf32.txt" ;;
    3)
        mkdir -p /tmp/gw
        timeout 230 python3 scripts/bench_suite.py --models gemm_g4,gemm_g5,gemm_g6,gemm_g8,gemm_g10 --precisions tf32 \
            --vs eager --strategies optimal-precisionio --timing gpu --fresh-db --budget-s 215 --solver highs \
            --code "$(cat CODE)" --out /tmp/gw > /tmp/gw/log.txt 2>&1
        echo "gemm tf32 rc=$?"; gzip -f /tmp/gw/*.jsonl 2>/dev/null; tar -czf "$OUT/gw.tgz" -C /tmp gw
        grep -h "bench .* ms$\|rewrites:" /tmp/gw/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    4)
        mkdir -p /tmp/gs
        timeout 230 python3 scripts/bench_suite.py --models gemm_g7,gemm_g8,gemm_g9,gemm_g10,gemm_g4 --precisions fp16 \
            --vs eager --strategies optimal-precisionio-rewrites --timing gpu --fresh-db --budget-s 215 --solver highs \
            --code "$(cat CODE)" --out /tmp/gs > /tmp/gs/log.txt 2>&1
        echo "gemm fp16 rc=$?"; gzip -f /tmp/gs/*.jsonl 2>/dev/null; tar -czf "$OUT/gs.tgz" -C /tmp gs
        grep -h "bench .* ms$\|rewrites:" /tmp/gs/log.txt | sed 's/.*tessera [0-9:]* //' ;;
    *) echo "next.sh: call 1-4"; exit 2 ;;
esac
