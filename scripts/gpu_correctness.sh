#!/usr/bin/env bash
# One device call of correctness work, run side by side so that the GPU machine's 16 cores stay busy:
#   - scripts/run_check.py on the zoo models (compile, run on the GPU, compare with onnxruntime);
#   - scripts/fuzz.py instances with their own seeds: analytical tuning (random schedules) and
#     measured tuning (the profiler's workers, templates and operand prologues), fp32 and fp16.
# Everything lands in $OUT/work and is packed into $OUT/correctness.tgz at the end (the device tool
# brings back at most 8 files), so the fuzzers stop by themselves (--minutes; a shrink that runs on
# is cut 90 s later) well inside the call.
#
#   bash scripts/gpu_correctness.sh ZOO PRECISIONS FUZZ_MIN N_ANALYTICAL N_MEASURED SEED0
#   bash scripts/gpu_correctness.sh resnet50,inception_v3,bert_base,gpt2 fp32 6 4 2 1000
# PRECISIONS are the zoo check's; the fuzzers' are FUZZ_PRECISIONS (default fp32,fp16). A fuzzer stopped by
# its timeout still writes its summary (scripts/fuzz.py handles SIGTERM).
set -u
zoo=${1-resnet50,inception_v3,bert_base,gpt2}  # "" skips the zoo check
precisions=${2:-fp32}
minutes=${3:-6}
n_an=${4:-4}
n_me=${5:-2}
seed0=${6:-1000}
fuzz_precisions=${FUZZ_PRECISIONS:-fp32,fp16}
work="$OUT/work"
mkdir -p "$work"
export PYTHONUNBUFFERED=1
pids=()
if [ -n "$zoo" ]; then
  python3 scripts/run_check.py --zoo "$zoo" --precisions "$precisions" --workers 4 --out "$work" \
    >"$work/run_check.log" 2>&1 &
  pids+=($!)
fi
for i in $(seq 1 "$n_an"); do
  s=$((seed0 + 100 * i))
  timeout $((minutes * 60 + 90)) python3 scripts/fuzz.py --device cuda --precisions "$fuzz_precisions" --minutes "$minutes" --seed "$s" \
    --out "$work/fuzz_an_$s.json" >"$work/fuzz_an_$s.log" 2>&1 &
  pids+=($!)
done
for i in $(seq 1 "$n_me"); do
  s=$((seed0 + 5000 + 100 * i))
  timeout $((minutes * 60 + 90)) python3 scripts/fuzz.py --device cuda --tuning measured --precisions "$fuzz_precisions" --minutes "$minutes" \
    --seed "$s" --out "$work/fuzz_me_$s.json" >"$work/fuzz_me_$s.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
tar czf "$OUT/correctness.tgz" -C "$work" .
rm -rf "$work"
echo "== run_check"
tar xzf "$OUT/correctness.tgz" -O ./run_check.log 2>/dev/null | tail -n 25
echo "== fuzz"
for f in $(tar tzf "$OUT/correctness.tgz" | grep 'fuzz_.*\.log$'); do
  echo "$f: $(tar xzf "$OUT/correctness.tgz" -O "$f" | grep -E '^(wrote|FAILURE|\[)' | tail -n 2 | tr '\n' ' ')"
done
