#!/usr/bin/env bash
# Device steps comparing this tree with a baseline tree on the same GPU, run from the repo root there:
#   bench/device/compare.sh STEP [STEP ...]
# Steps (in the order given; logs and JSON go to $OUT):
#   coldbuild   time a cold `lucegen build` of the chip the GPU matches, 16 jobs, in a fresh cache
#   weights     random checkpoints in /tmp (0.8B, 27B Q4_K_M legacy and current mix, DFlash drafts); run it in the
#               background (`compare.sh weights &`) and later steps wait for the files they read
#   tests       GPU tests ($GPU_TESTS, default all of tests/gpu)
#   decode      bench decode, baseline and this tree alternating ($TREES: which trees, in order)
#   prefill     bench prefill (0.8B), baseline and this tree
#   ar          bench dflash on the legacy-mix 27B, baseline and this tree alternating twice
#   realmix     this tree alone: run and bench dflash on the current-mix 27B and a lucebox-layout draft
#   runs        this tree alone: lucegen run greedy and sampled on the 0.8B and the 27B, with and without a draft
#   prefill27   this tree alone: bench prefill on the 27B GGUF at 520, 4096 and 16384 tokens
#   profile     per-kernel time of one AR step of the legacy-mix 27B, baseline and this tree (torch's CUPTI)
#   timeline    the same AR step with programmatic launch on, kernel by kernel (--timeline), baseline and this tree
#   mutations   bench/device/mutations.py --only $MUTATIONS, in the time left
#   energy      this tree alone: lucegen run on the 0.8B (its closing line carries NVML's energy)
#   benchjson   this tree alone: bench decode and prefill (0.8B) with --label, JSON for docs/bench
# The baseline is a plain copy of another commit's files in .base/ (git archive BASE | tar -x -C .base, carried).
# Wheels the device lacks (gguf, the serve stack) are installed into $SITE first (carry .whl).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/lucegen-out} LUCEGEN_CACHE_DIR=${LUCEGEN_CACHE_DIR:-/tmp/lucegen-cache}
SITE=/tmp/site
mkdir -p "$OUT"
[ -d $SITE/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $SITE .whl/*.whl > /dev/null 2>&1 || { echo "wheels did not install"; exit 1; }
export PYTHONPATH=$PWD:$SITE
new=$PWD base=$PWD/.base
q08=/tmp/q08 q27=/tmp/q27.gguf q27l=/tmp/q27-legacy.gguf d27=/tmp/d27 d27l=/tmp/d27-lucebox.gguf
lg() { local tree=$1; shift; (cd "$tree" && PYTHONPATH=$tree:$SITE timeout $(left) python3 -m lucegen.cli "$@"); }
start=$(date +%s)
left() { echo $(( ${CALL_SECONDS:-570} - ($(date +%s) - start) )); }
run() { local name=$1; shift; echo "=== $name ($(( $(date +%s) - start )) s)"
        "$@" > "$OUT/$name.log" 2>&1; echo "exit $?"; tail -${TAIL:-6} "$OUT/$name.log"; }
ready() { for f in "$@"; do until [ -e "$f.done" ]; do sleep 2; [ $(left) -gt 0 ] || return 1; done; done; }
written() { local out=$1; shift; [ -e "$out.done" ] && return; lg "$new" init-weights "$@" --out "$out" --quiet \
            && touch "$out.done"; }

for step in "$@"; do case $step in
  coldbuild)
    TAIL=3 run coldbuild timeout $(left) env LUCEGEN_CACHE_DIR=/tmp/cold-cache bash -c "time python3 -m lucegen.cli build --target sm_90 --jobs 16 --out /tmp/cold-out"
    ;;
  weights)
    for spec in "$q08 --preset qwen3.5-0.8b --format safetensors" "$d27 --preset dflash-qwen3.5-27b" \
        "$q27l --preset qwen3.5-27b --format gguf --quant q4_k_m_legacy" \
        "$d27l --preset dflash-qwen3.5-27b --format gguf --quant q8_0 --draft-layout lucebox" \
        "$q27 --preset qwen3.5-27b --format gguf --quant q4_k_m"; do
      case " ${WEIGHTS:-$q08 $d27 $q27l $d27l $q27} " in *" ${spec%% *} "*) ;; *) continue ;; esac
      written $spec > "$OUT/weights_$(basename ${spec%% *}).log" 2>&1 &
    done; wait
    echo "=== weights written ($(( $(date +%s) - start )) s)"
    ;;
  tests)
    TAIL=25 run gpu_tests timeout $(left) python3 -m pytest -q -rfs --tb=short -p no:cacheprovider ${GPU_TESTS:-tests/gpu}
    ;;
  decode)
    ready $q08 && for tree in ${TREES:-base new new base}; do
      dir=$base; [ $tree = new ] && dir=$new
      TAIL=14 run decode_$tree lg "$dir" bench decode --model $q08 --no-hf --json "$OUT/decode_$tree.json"
    done ;;
  prefill)
    ready $q08 && for tree in ${TREES:-base new}; do
      dir=$base; [ $tree = new ] && dir=$new
      run prefill_$tree lg "$dir" bench prefill --model $q08 --tokens 520 4096 --no-hf --no-gemm \
          --json "$OUT/prefill_$tree.json"
    done ;;
  ar)
    ready $q27l $d27 && for tree in ${TREES:-base new base new}; do
      dir=$base; [ $tree = new ] && dir=$new
      TAIL=12 run ar_$tree lg "$dir" bench dflash --model $q27l --draft $d27 --repeats 5 --budgets 1 22 \
          --json "$OUT/ar_$tree.json"
    done ;;
  realmix)
    ready $q27 $d27l && {
      run realmix_run lg "$new" run --model $q27 --draft $d27l --prompt "def f(x):" --max-tokens 64
      TAIL=12 run realmix_dflash lg "$new" bench dflash --model $q27 --draft $d27l --repeats 3 --budgets 1 22 \
          --json "$OUT/realmix_dflash.json"; } ;;
  runs)
    ready $q08 && {
      run run_08_greedy lg "$new" run --model $q08 --prompt "def f(x):" --max-tokens 128
      run run_08_sampled lg "$new" run --model $q08 --prompt "def f(x):" --max-tokens 128 --temperature 0.8 --seed 1; }
    ready $q27 $d27l && {
      run run_27_greedy lg "$new" run --model $q27 --prompt "def f(x):" --max-tokens 64
      run run_27_sampled lg "$new" run --model $q27 --prompt "def f(x):" --max-tokens 64 --temperature 0.8 --seed 1
      run run_27_draft_greedy lg "$new" run --model $q27 --draft $d27l --prompt "def f(x):" --max-tokens 64
      run run_27_draft_sampled lg "$new" run --model $q27 --draft $d27l --prompt "def f(x):" --max-tokens 64 \
          --temperature 0.8 --seed 1; } ;;
  prefill27)
    ready $q27 && TAIL=10 run prefill27 lg "$new" bench prefill --model $q27 --tokens 520 4096 16384 --repeats 3 \
        --no-hf --no-gemm --json "$OUT/prefill27.json" ;;
  profile)
    ready $q27l && {
      TAIL=40 run profile_base bash -c "cd $base && PYTHONPATH=$base:$SITE timeout $(left) python3 tools/target_profile.py \
          $q27l --slots 1 --steps 8 --no-programmatic"
      TAIL=40 run profile_new bash -c "cd $new && \
          PYTHONPATH=$new:$SITE timeout $(left) python3 -m lucegen.devtools.target_profile $q27l --slots 1 --steps 8 \
          --no-programmatic"; } ;;
  timeline)
    ready $q27l && {
      TAIL=20 run timeline_base bash -c "cd $base && PYTHONPATH=$base:$SITE timeout $(left) python3 tools/target_profile.py \
          $q27l --slots 1 --steps 8 --timeline"
      TAIL=20 run timeline_new bash -c "cd $new && \
          PYTHONPATH=$new:$SITE timeout $(left) python3 -m lucegen.devtools.target_profile $q27l --slots 1 --steps 8 \
          --timeline"; } ;;
  mutations)
    TAIL=40 run mutations timeout $(left) python3 bench/device/mutations.py --only "$MUTATIONS" \
        --budget $(( $(left) - 20 )) ;;
  energy)
    ready $q08 && run energy lg "$new" run --model $q08 --prompt "def f(x):" --max-tokens 256 ;;
  benchjson)
    ready $q08 && {
      TAIL=14 run benchjson_decode lg "$new" bench decode --model $q08 --no-hf --label "Qwen3.5-0.8B BF16" \
          --json "$OUT/decode-qwen3.5-0.8b-h200.json"
      run benchjson_prefill lg "$new" bench prefill --model $q08 --tokens 520 4096 --no-hf --no-gemm \
          --label "Qwen3.5-0.8B BF16" --json "$OUT/prefill-qwen3.5-0.8b-h200.json"; } ;;
  *) echo "unknown step $step"; exit 2 ;;
esac; done
