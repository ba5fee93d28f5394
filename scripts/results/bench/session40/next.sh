#!/bin/bash
# Session 40's device calls: `bash scripts/results/bench/session40/next.sh N` on nvidia-h100-x1, with `carry`
# naming .whl (the highspy wheel) and .pin16 (git archive of the commit measured, with CODE; rebuild it from
# HEAD first, as ../session34/next.sh says).
# (call 1 was ../session39/next.sh 2, the split-K chain probe, after 2a8c0c0's fix of its shared-memory overflow)
# 2: scripts/tf32_round_probe.py: what rounding tf32 operands in the K loop costs the chain products G4-G10.
# 3: tf32 G4-G10 at HEAD (86a31e7: tf32 rounding by cvt.rna in the generated kernels) with the default options,
#    beside eager's two calls, GPU time, one empty database. Table: python scripts/mcfuser_table.py .../call3/g*/
# 4: bert_base and gpt2 tf32 cold beside Inductor with CUDA graphs (the cvt rounding in whole models; also
#    session 39's 4-warp tf32 tiles and three-shape walk, untimed in models until now).
# (call 5 was ../session39/next.sh 4: fp16 G7-G10 and G4 with --rewrites on; does the search keep matmul_split_k?)
# 6: resnet50 and mobilenet_v2 tf32 cold beside Inductor with CUDA graphs: the cvt rounding in convolution templates.
# Next session (rebuild .pin16 from HEAD first):
# 7: tf32 G6 and G4 at HEAD (665a014: matmul_transposed may follow a regrouping in the default mode); first, what
#    Triton's Gluon offers there for a cluster design of the fp16 chains (TMA multicast, cluster barriers,
#    shared-memory stores to other CTAs) and whether nvcc is there: gluon_api.txt.
# 8: attention S1-S9 tf32 at HEAD beside eager, SDPA and Inductor: the cvt rounding in chain kernels
#    (table: python scripts/mcfuser_table.py .../call8/a*/).
# 9: fp16 G4-G7 with the default options (never run in that mode).
# 10: scripts/gemm_probe.py --set chains --precisions fp16: the regrouped chains' products over the wide schedule
#     sweep in fp16 (session 38 swept tf32 only); G9 fp16 is 0.15 us over its target.
# 11: scripts/cluster_chain_probe.py: fp16 G4, G5, G7-G10 as one kernel of thread-block clusters sharing X through
#     distributed shared memory (CUDA C++, built there with nvcc for sm_90a), beside eager.
source "$(dirname "$0")/../device_lib.sh"  # the H100 check, highspy, `gemms` and `models`
case $1 in
    2)  # from the working tree (the probe is not in .pin16)
        timeout 500 python3 scripts/tf32_round_probe.py --out "$OUT/round.json" > "$OUT/round.txt" 2>&1
        echo "rc=$?"; tail -14 "$OUT/round.txt" ;;
    3) gemms gtf32 gemm_g4,gemm_g5,gemm_g6,gemm_g7,gemm_g8,gemm_g9,gemm_g10 tf32 280 ;;
    4) models m40 bert_base:tf32=280,gpt2:tf32=280 570 ;;
    6) models c40 resnet50:tf32=180,mobilenet_v2:tf32=200 420 ;;
    7)
        python3 - > "$OUT/gluon_api.txt" 2>&1 <<'PY'
import inspect, triton
print("triton", triton.__version__)
try:
    from triton.experimental.gluon.language.nvidia import hopper
    for mod in (hopper, getattr(hopper, "tma", None), getattr(hopper, "mbarrier", None), getattr(hopper, "cluster", None)):
        if mod is not None:
            print(mod.__name__, sorted(n for n in dir(mod) if not n.startswith("_")))
    for fn in ("async_copy_global_to_shared", "async_load"):
        f = getattr(getattr(hopper, "tma", None), fn, None)
        print(fn, inspect.signature(f) if f else None)
except Exception as e:
    print("gluon:", type(e).__name__, e)
PY
        { echo "nvcc: $(command -v nvcc || ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null || echo none)"
          python3 -c "import torch.utils.cpp_extension as c; print('CUDA_HOME', c.CUDA_HOME)"; } >> "$OUT/gluon_api.txt" 2>&1
        cat "$OUT/gluon_api.txt"; gemms g7 gemm_g6,gemm_g4 tf32 130 ;;
    8) gemms atf32 attn_s1,attn_s2,attn_s3,attn_s4,attn_s5,attn_s6,attn_s7,attn_s8,attn_s9 tf32 330 eager,sdpa,inductor ;;
    9) gemms gfp16 gemm_g4,gemm_g5,gemm_g6,gemm_g7 fp16 160 ;;
    10) # from the working tree (the probe imports tests/)
        timeout 560 python3 scripts/gemm_probe.py --set chains --precisions fp16 --out "$OUT/gemm_probe_chains_fp16.json" \
            > "$OUT/gemm_probe_chains_fp16.log" 2>&1
        echo "rc=$?"; grep -v Warn "$OUT/gemm_probe_chains_fp16.log" | tail -12 | cut -c1-160 ;;
    11) # from the working tree
        timeout 400 python3 scripts/cluster_chain_probe.py > "$OUT/cluster.txt" 2>&1
        echo "rc=$?"; tail -16 "$OUT/cluster.txt" ;;
    *) echo "next.sh: call 2-4, 6-11"; exit 2 ;;
esac
