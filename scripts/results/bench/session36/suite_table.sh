#!/bin/bash
# Issue 14's H100 suite at the pinned 583a413, all sixteen rows, assembled from the sessions'
# committed row archives: the table, the targets under it, and what each plan fused.
#   bash scripts/results/bench/session36/suite_table.sh [OUT_DIR]      ($ROWS: another set of rows)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
out=${1:-/tmp/suite_h100}
rm -rf "$out" && mkdir -p "$out/rows"
# archive (relative to scripts/results/bench) and the row inside it; a row that ran twice is named once
ROWS=${ROWS:-"session32/call2/rows.tgz:bert_base_fp16 session32/call1/rows.tgz:mobilenet_v2_tf32
session32/call4/rows.tgz:resnet50_fp16 session33/call1/rows.tgz:candy_fp16 session33/call1/rows.tgz:gpt2_fp16
session33/call2/rows.tgz:gpt2_tf32 session33/call2/rows.tgz:candy_tf32 session33/call3/rows.tgz:bert_base_tf32
session34/call3/rows.tgz:inception_v3_fp16 session34/call3/rows.tgz:mobilenet_v2_fp16
session34/call3/rows.tgz:resnet50_tf32 session34/call4/rows.tgz:inception_v3_tf32
session36/call1/rows.tgz:segformer_b0_fp16 session36/call2/rows.tgz:segformer_b0_tf32
session36/call3/rows.tgz:efficientvit_b0_fp16 session36/call4/rows.tgz:efficientvit_b0_tf32"}
for r in $ROWS; do
    tgz=${r%%:*}; row=${r##*:}
    tar -xzf "scripts/results/bench/$tgz" -C "$out" "rows/$row/bench_$row.json"
done
python3 scripts/bench_suite.py --table --kinds "$out"/rows/*/bench_*.json
echo
python3 scripts/fusion_summary.py "$out"/rows/*/bench_*.json
