#!/bin/bash
# Issue 14's H100 suite at the pinned 583a413 as session 34 left it (12 rows): session 36's script
# over those rows.   bash scripts/results/bench/session34/suite_table.sh [OUT_DIR]
ROWS="session32/call2/rows.tgz:bert_base_fp16 session32/call1/rows.tgz:mobilenet_v2_tf32
session32/call4/rows.tgz:resnet50_fp16 session33/call1/rows.tgz:candy_fp16 session33/call1/rows.tgz:gpt2_fp16
session33/call2/rows.tgz:gpt2_tf32 session33/call2/rows.tgz:candy_tf32 session33/call3/rows.tgz:bert_base_tf32
session34/call3/rows.tgz:inception_v3_fp16 session34/call3/rows.tgz:mobilenet_v2_fp16
session34/call3/rows.tgz:resnet50_tf32 session34/call4/rows.tgz:inception_v3_tf32" \
    exec bash "$(dirname "$0")/../session36/suite_table.sh" "$@"
