#!/bin/bash
# Session 40's device calls: `bash scripts/results/bench/session40/next.sh N` on nvidia-h100-x1, with `carry`
# naming .whl (the highspy wheel) and .pin16 (git archive of the commit measured, with CODE; rebuild it from
# HEAD first, as ../session34/next.sh says).
# (call 1 was ../session39/next.sh 2, the split-K chain probe, after 2a8c0c0's fix of its shared-memory overflow)
# 2: scripts/tf32_round_probe.py: what rounding tf32 operands in the K loop costs the chain products G4-G10.
nvidia-smi -L | grep -q H100 || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
export PYTHONPATH=/tmp/site:$PWD TESSERA_LOG=info
case $1 in
    2)  # from the working tree (the probe is not in .pin16)
        timeout 500 python3 scripts/tf32_round_probe.py --out "$OUT/round.json" > "$OUT/round.txt" 2>&1
        echo "rc=$?"; tail -14 "$OUT/round.txt" ;;
    *) echo "next.sh: call 2"; exit 2 ;;
esac
