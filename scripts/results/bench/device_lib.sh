# Shared by the sessions' next.sh (sourced, run on the GPU machine from the repository root, carrying .whl
# with the highspy wheel and .pin16, a `git archive` of the commit measured with its hash in CODE).
# Stops unless the cards are H100s or H200s (the same Hopper chip), installs highspy, records the cards, then
# defines `gemms`, `models` and `on_gpu`. Set CUDA_VISIBLE_DEVICES to give a runner one GPU of several.
nvidia-smi -L | grep -q 'H100\|H200' || { nvidia-smi -L; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/highspy*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
# tessera's package metadata alone (the code stays the tree's): torch.compile(backend="tessera") finds the
# dynamo backend through its entry point, which only an installed tessera declares
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/meta . > /dev/null 2>&1 \
    && rm -rf /tmp/meta/tessera || echo "device_lib: tessera's entry point not installed (the backend-by-name tests fail)"
export PYTHONPATH=/tmp/site:$PWD:/tmp/meta TESSERA_LOG=info
# MCFuser rows beside eager (and PEERS), GPU time, one empty database: gemms NAME MODELS PRECISION TIMEOUT_S [PEERS]
# (PROFILE=1: also each contender's kernels by kind, as the end-to-end rows need)
# (PIN=DIR: the `git archive` to run instead of .pin16, for an A/B of two commits; BATCH=N: the zoo model at N items)
gemms() {
    (cd ${PIN:-.pin16} && export PYTHONPATH=/tmp/site:$PWD && mkdir -p /tmp/$1
    timeout $4 python3 scripts/bench_suite.py --models "$2" --precisions $3 --vs ${5:-eager} \
        --strategies optimal-precisionio --timing gpu --fresh-db --budget-s $(($4 - 15)) --solver highs \
        --code "$(cat CODE)" ${PROFILE:+--profile} ${BATCH:+--batch $BATCH} --out /tmp/$1 > /tmp/$1/log.txt 2>&1
    echo "gemm $3 rc=$?"; gzip -f /tmp/$1/*.jsonl 2>/dev/null; tar -czf "$OUT/$1.tgz" -C /tmp $1
    grep -h "bench .* ms$\|rewrites:" /tmp/$1/log.txt | sed 's/.*tessera [0-9:]* //')
}
# whole models cold beside Inductor with CUDA graphs: models NAME ROWS DEADLINE_S
models() {
    (cd .pin16 && export PYTHONPATH=/tmp/site:$PWD
    python3 scripts/bench_gpus.py --gpus 1 --rows "$2" --deadline-s $3 --cap \
        --cold-caches --out /tmp/$1 -- --solver highs --profile --fresh-db --code "$(cat CODE)" \
        --vs inductor-cudagraphs --strategies optimal-precisionio > "$OUT/$1.log" 2>&1
    gzip -f /tmp/$1/*/*.jsonl 2>/dev/null; tar -czf "$OUT/$1.tgz" -C /tmp $1; cat "$OUT/$1.log"
    grep -h "bench .* ms$" /tmp/$1/*/log.txt | sed 's/.*tessera [0-9:]* //')
}
# one runner on one GPU, in the background (wait for them): on_gpu GPU LOG COMMAND...
on_gpu() {
    local gpu=$1 log=$2; shift 2
    (export CUDA_VISIBLE_DEVICES=$gpu; "$@") > "$OUT/$log" 2>&1 &
}
