#!/usr/bin/env bash
# One device session comparing this tree with a baseline tree on the same GPU (run from the repo root there).
#   bench/device/compare.sh prep    random checkpoints in /tmp, both trees' sm_90 kernels compiled, GPU tests
#   bench/device/compare.sh bench   bench decode / prefill / dflash, baseline and this tree alternating
# The baseline is a plain copy of another commit's files in .base/ (git archive BASE | tar -x -C .base, carried).
# Logs and JSON go to $OUT.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/lucegen-out} LUCEGEN_CACHE_DIR=/tmp/lucegen-cache
mkdir -p "$OUT"
new=$PWD base=$PWD/.base
q08=/tmp/q08 q27=/tmp/q27.gguf d27=/tmp/d27
lg() { local tree=$1; shift; (cd "$tree" && PYTHONPATH=$tree${SITE:+:$SITE} python3 -m lucegen.cli "$@"); }
jobs=$(( $(nproc) / 2 ))

case ${1:-prep} in
  prep)
    start=$(date +%s)
    nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"
    ( lg "$new" init-weights --preset qwen3.5-0.8b --format safetensors --out $q08 --quiet
      lg "$new" init-weights --preset qwen3.5-27b --format gguf --quant q4_k_m --out $q27 --quiet
      lg "$new" init-weights --preset dflash-qwen3.5-27b --out $d27 --quiet ) > "$OUT/weights.log" 2>&1 &
    weights=$!
    ( lg "$base" build --target sm_90 --jobs $jobs > "$OUT/build_base.log" 2>&1 ) &
    ( lg "$new" build --target sm_90 --jobs $jobs > "$OUT/build_new.log" 2>&1 ) &
    wait %2 %3; echo "both builds: $(( $(date +%s) - start )) s"; tail -3 "$OUT/build_new.log"
    wait $weights; tail -3 "$OUT/weights.log"; ls -la /tmp | grep -E "q08|q27|d27"
    left=$(( ${PREP_SECONDS:-570} - ($(date +%s) - start) ))
    echo "GPU tests with ${left} s left"
    LUCEGEN_08B_DIR=$q08 timeout $left python3 -m pytest -q -p no:cacheprovider --maxfail=15 ${GPU_TESTS:+-k "$GPU_TESTS"} \
        tests/gpu > "$OUT/gpu_tests.log" 2>&1; echo "pytest exit $?"; tail -30 "$OUT/gpu_tests.log"
    ;;
  bench)
    for round in 1 2; do
      for tree in base new; do
        dir=$base; [ $tree = new ] && dir=$new
        echo "=== $tree round $round"
        lg "$dir" bench decode --model $q08 --no-hf --json "$OUT/decode_${tree}_$round.json" 2>&1 | tail -4
        [ $round = 1 ] && lg "$dir" bench prefill --model $q08 --tokens 520 4096 --no-hf --no-gemm \
            --json "$OUT/prefill_${tree}.json" 2>&1 | tail -4
        [ $round = 1 ] && lg "$dir" bench dflash --model $q27 --draft $d27 --repeats 3 --budgets 1 22 \
            --json "$OUT/dflash_${tree}.json" 2>&1 | tail -8
      done
    done
    ;;
esac
