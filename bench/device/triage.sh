#!/usr/bin/env bash
# Triage of GPU-test failures in one device call (run from the repo root there; carry .whl for gguf).
#   bench/device/triage.sh "PYTEST_ARGS" ["PYTEST_ARGS" ...]   each argument is one pytest run, in order, with
#                                                            its log in $OUT/triage_<n>.log
# SANITIZE="initcheck:PYTEST_ARGS" adds a compute-sanitizer run (Firecracker machines only) at the end.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/lucegen-out} LUCEGEN_CACHE_DIR=${LUCEGEN_CACHE_DIR:-/tmp/lucegen-cache}
SITE=/tmp/site
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl \
    > /dev/null 2>&1 || { echo "wheels did not install"; exit 1; }
export PYTHONPATH=$PWD:$SITE
start=$(date +%s)
left() { echo $(( ${CALL_SECONDS:-560} - ($(date +%s) - start) )); }
echo "$(uname -r) $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader)"
n=0
for args in "$@"; do
  n=$((n + 1)); t0=$(date +%s)
  eval timeout $(left) python3 -m pytest -p no:cacheprovider -q -rf --tb=short "$args" > "$OUT/triage_$n.log" 2>&1
  echo "=== run $n ($args): exit $?, $(( $(date +%s) - t0 )) s"
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)|^E " "$OUT/triage_$n.log" | head -30
done
if [ -n "${SANITIZE:-}" ]; then
  tool=${SANITIZE%%:*} args=${SANITIZE#*:}; t0=$(date +%s)
  eval timeout $(left) compute-sanitizer --tool $tool --print-limit 20 python3 -m pytest -p no:cacheprovider -q -x \
      --tb=short "$args" > "$OUT/sanitize.log" 2>&1
  echo "=== compute-sanitizer $tool: exit $?, $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" "$OUT/sanitize.log" | head -40
fi
