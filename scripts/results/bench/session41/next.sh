#!/bin/bash
# Session 41's device calls: `bash scripts/results/bench/session41/next.sh N` on nvidia-h100-x1, carrying .whl and
# .pin16 (rebuilt from HEAD first, as ../session34/next.sh says). Calls 1-6 ran ../session40/next.sh (README).
# 7: on the H100 the generated tf32 rounding still picks cvt.rna (9a1ba72 chooses by the GPU's architecture);
#    tf32 G5 and G7 at HEAD beside eager; segformer_b0 tf32 cold beside Inductor with CUDA graphs (not run with
#    the cvt rounding before).
# 8: tf32 G1-G3 (never run with the cvt rounding) and G8 at HEAD with the default options.
# Next session (rebuild .pin16 from HEAD first):
# 9: all twelve GEMM chains in tf32 at HEAD (67f1f20: measured rewrite windows priced with their kernels
#    tuned; does G6 keep the regrouping now, and does any met row move?). Table: mcfuser_table.py .../call9/g*/
# 10: the same in fp16.
# 11: attention S1-S9 tf32 beside eager, SDPA and Inductor (3198f55: the chain walk also moves the row and column
#     blocks; attn_s6 tf32 ran 0.82 in call 5). 12: the same in fp16.
source "$(dirname "$0")/../device_lib.sh"  # the H100 check, highspy, `gemms` and `models`
case $1 in
    7)
        (cd .pin16 && python3 - <<'PY'
import os, torch, triton.language as tl
from tessera.codegen.triton_ops import TF32_ROUND, module_source
lines = module_source([f"y = {TF32_ROUND.format(x='x')}"]).splitlines()
start = next(i for i, ln in enumerate(lines) if ln.startswith("TF32_CVT = "))
scope = {"os": os, "torch": torch, "tl": tl}
exec("\n".join(lines[start:start + 2]), scope)
print("sm", torch.cuda.get_device_capability(), "TF32_CVT", bool(scope["TF32_CVT"]))
PY
        ) 2>&1 | tee "$OUT/cvt_choice.txt"
        gemms g41 gemm_g5,gemm_g7 tf32 130
        models s41 segformer_b0:tf32=360 380 ;;
    8) gemms g41b gemm_g1,gemm_g2,gemm_g3,gemm_g8 tf32 120 ;;
    9) gemms gtf32 "$(echo gemm_g{1..12} | tr ' ' ,)" tf32 330 ;;
    10) gemms gfp16 "$(echo gemm_g{1..12} | tr ' ' ,)" fp16 330 ;;
    11) gemms atf32 "$(echo attn_s{1..9} | tr ' ' ,)" tf32 330 eager,sdpa,inductor ;;
    12) gemms afp16 "$(echo attn_s{1..9} | tr ' ' ,)" fp16 330 eager,sdpa,inductor ;;
    *) echo "next.sh: call 7-12"; exit 2 ;;
esac
