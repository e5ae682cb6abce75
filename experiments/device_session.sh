#!/usr/bin/env bash
# One device call for the decode megakernel: GPU tests (tiny presets), a random 0.8B checkpoint in /tmp, its
# teacher-forced test, the bench (with per-phase profile and the HF baseline), compute-sanitizer on tiny.
# Usage (from the repo root, on the device): experiments/device_session.sh [tests] [sanitize] [bench] [test08]
#   [pftests] [pfbench] [run]   (prefill: every GPU test of tests/gpu/test_prefill*.py incl. the 0.8B ones; ppN bench)
# Logs and JSON go to $OUT (default /tmp/lucegen-out).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export OUT=${OUT:-/tmp/lucegen-out} LUCEGEN_REPORT_DIR=${OUT}
mkdir -p "$OUT"
stages=${*:-tests bench test08}
model=/tmp/lucegen-q08
need_model() {
  [ -f $model/config.json ] || python3 -m lucegen.cli init-weights --preset qwen3.5-0.8b --format safetensors \
      --out $model --quiet
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
for stage in $stages; do
  echo "=== $stage"
  case $stage in
    tests) python3 -m pytest -q -x tests/gpu/test_megakernel.py 2>&1 | tail -30 | tee "$OUT/tests.log" ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 experiments/mk_smoke.py 2>&1 | tail -15 \
          | tee "$OUT/sanitize_$tool.log"
      done ;;
    bench)
      need_model
      python3 -m lucegen.cli bench decode --model $model --profile --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/bench.log" ;;
    benchq)
      need_model
      python3 -m lucegen.cli bench decode --model $model --no-hf --profile --json "$OUT/bench.json" 2>&1 \
        | tee "$OUT/bench.log" ;;
    test08)
      need_model
      LUCEGEN_08B_DIR=$model python3 -m pytest -q tests/gpu/test_megakernel.py -k 08b 2>&1 | tail -15 \
        | tee "$OUT/test08.log" ;;
    sweep)
      need_model
      python3 experiments/mk_sweep.py $model "${SWEEP:-[]}" 2>&1 | tee "$OUT/sweep.log" ;;
    pftests)
      need_model
      LUCEGEN_08B_DIR=$model python3 -m pytest -q tests/gpu/test_prefill*.py 2>&1 | tail -40 \
        | tee "$OUT/pftests.log" ;;
    pfbench)
      need_model
      python3 -m lucegen.cli bench prefill --model $model --tokens ${PF_TOKENS:-520 4096 32768} \
        --json "$OUT/pfbench.json" ${PF_ARGS:-} 2>&1 | tee "$OUT/pfbench.log" ;;
    run)
      need_model
      python3 -m lucegen.cli run --model $model --prompt "def fibonacci(n):" --max-tokens 32 2>&1 | tee "$OUT/run.log" ;;
  esac
done
