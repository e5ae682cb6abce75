#!/usr/bin/env bash
# One device session comparing this tree with a baseline tree on the same GPU (run from the repo root there).
#   bench/device/compare.sh prep    random checkpoints in /tmp, both trees' sm_90 kernels compiled, GPU tests
#   bench/device/compare.sh bench   bench decode / prefill / dflash, baseline and this tree alternating; then this
#                                   tree alone on the current llama.cpp Q4_K_M mix and a lucebox-layout draft
# The baseline is a plain copy of another commit's files in .base/ (git archive BASE | tar -x -C .base, carried).
# Wheels the device lacks (gguf) are installed into $SITE first (../shared/device/wheels.sh; carry .whl).
# Logs and JSON go to $OUT.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/lucegen-out} LUCEGEN_CACHE_DIR=/tmp/lucegen-cache SITE=/tmp/site
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl \
    > /dev/null 2>&1 || { echo "wheels did not install"; exit 1; }
export PYTHONPATH=$PWD:$SITE
new=$PWD base=$PWD/.base
q08=/tmp/q08 q27=/tmp/q27.gguf q27l=/tmp/q27-legacy.gguf d27=/tmp/d27 d27l=/tmp/d27-lucebox.gguf
lg() { local tree=$1; shift; (cd "$tree" && PYTHONPATH=$tree:$SITE python3 -m lucegen.cli "$@"); }
start=$(date +%s)
left() { echo $(( ${CALL_SECONDS:-560} - ($(date +%s) - start) )); }

case ${1:-prep} in
  prep)
    nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee "$OUT/gpu.txt"
    ( lg "$new" init-weights --preset qwen3.5-0.8b --format safetensors --out $q08 --quiet
      lg "$new" init-weights --preset dflash-qwen3.5-27b --out $d27 --quiet
      lg "$new" init-weights --preset qwen3.5-27b --format gguf --quant q4_k_m_legacy --out $q27l --quiet
      lg "$new" init-weights --preset qwen3.5-27b --format gguf --quant q4_k_m --out $q27 --quiet
      lg "$new" init-weights --preset dflash-qwen3.5-27b --format gguf --quant q8_0 --draft-layout lucebox \
          --out $d27l --quiet ) > "$OUT/weights.log" 2>&1 &
    ( lg "$base" build --target sm_90 --jobs 6 > "$OUT/build_base.log" 2>&1 ) &
    ( time lg "$new" build --target sm_90 --jobs 10 ) > "$OUT/build_new.log" 2>&1
    echo "new tree built: $(( $(date +%s) - start )) s"; tail -4 "$OUT/build_new.log"
    echo "GPU tests with $(left) s left"
    cd "$new" && timeout $(left) python3 -m pytest -q -p no:cacheprovider --maxfail=20 ${GPU_TESTS:-\
      tests/gpu/test_quant_gemm.py tests/gpu/test_quant_target.py tests/gpu/test_tree_verify.py \
      tests/gpu/test_dflash_draft.py tests/gpu/test_megakernel.py tests/gpu/test_small_kernels.py \
      tests/gpu/test_quant_matvec.py tests/gpu/test_prefill.py tests/gpu/test_prefill_gemm.py \
      tests/gpu/test_prefill_attention.py tests/gpu/test_prefill_deltanet.py tests/gpu/test_sampling_gpu.py \
      tests/gpu/test_api_gpu.py tests/gpu/test_serve_gpu.py} > "$OUT/gpu_tests.log" 2>&1
    echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -25
    wait; tail -2 "$OUT/build_base.log"; cat "$OUT/weights.log" | tail -5; ls -la /tmp | grep -E "q08|q27|d27"
    ;;
  bench)
    run() { local name=$1; shift; echo "=== $name"; "$@" 2>&1 | tee "$OUT/$name.log" | tail -${TAIL:-6}; }
    for tree in base new; do
      dir=$base; [ $tree = new ] && dir=$new
      run decode_${tree}_1 lg "$dir" bench decode --model $q08 --no-hf --json "$OUT/decode_${tree}_1.json"
    done
    for tree in base new; do
      dir=$base; [ $tree = new ] && dir=$new
      run prefill_${tree} lg "$dir" bench prefill --model $q08 --tokens 520 4096 --no-hf --no-gemm \
          --json "$OUT/prefill_${tree}.json"
    done
    for tree in base new; do
      dir=$base; [ $tree = new ] && dir=$new
      TAIL=12 run dflash_${tree} lg "$dir" bench dflash --model $q27l --draft $d27 --repeats 3 --budgets 1 22 \
          --json "$OUT/dflash_${tree}.json"
    done
    run run_real_mix_lucebox lg "$new" run --model $q27 --draft $d27l --prompt "def f(x):" --max-tokens 64
    TAIL=12 run dflash_real_mix lg "$new" bench dflash --model $q27 --draft $d27l --repeats 3 --budgets 1 22 \
        --json "$OUT/dflash_real_mix.json"
    run run_q27_ar lg "$new" run --model $q27 --prompt "def f(x):" --max-tokens 64
    run run_q08_sampled lg "$new" run --model $q08 --prompt "def f(x):" --max-tokens 64 --temperature 0.8 --seed 1
    ;;
esac
