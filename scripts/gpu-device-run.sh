#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with the carry folder staged by
# scripts/build-cuda.sh (carry/{forkscore,gpu-tests,modes-bench,run.sh} and this script).
# (binaries as <name>.xz). One call does everything, so the machine starts once:
#   1. the GPU conformance tests (CUDA f32/bf16 vs CPU f32 on tiny models);
#   2. forkscore demo-model + score on cpu, cuda f32, cuda bf16 (JSON results to $OUT);
#   3. the modes bench on a bench-size seeded model on cuda (bf16, then f32).
# Env: OUT (results folder), TESTS_TIMEOUT (240 s), BENCH_TIMEOUT (150 s per dtype), BENCH_HIDDEN/LAYERS/HEADS/KV_HEADS (default 1024/8/16/4),
#      BENCH_REPEATS (default 7), SKIP_BENCH=1 to skip step 3.
# Output: $OUT/{run.log,gpu-tests.log,score-cpu.json,score-cuda-f32.json,
#              score-cuda-bf16.json,modes-cuda-bf16.json,modes-cuda-f32.json}
set -uo pipefail
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:?set OUT to a results folder}"
exec > >(tee "$OUT/run.log") 2>&1

# Unpack the xz-compressed binaries (python's lzma where xz is missing) next to run.sh.
B=/tmp/forkscore-bin
mkdir -p "$B"
cp -f "$C/run.sh" "$B/"
for f in "$C"/*.xz; do
  n="$(basename "$f" .xz)"
  if command -v xz >/dev/null; then xz -dc "$f" > "$B/$n"
  else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$f" "$B/$n"; fi
  chmod +x "$B/$n"
done
SCHEMA="$C/parallel_schema.json"
C="$B"

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
nproc; grep -m1 "model name" /proc/cpuinfo
ldd "$C/forkscore" | grep -E "cuda|cublas|curand|nvrtc|not found" || true

echo "== 1. GPU conformance tests"
t0=$(date +%s)
timeout "${TESTS_TIMEOUT:-240}" "$C/run.sh" "$C/gpu-tests" --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
echo "gpu-tests exit $? in $(( $(date +%s) - t0 ))s"
grep -E "^test |test result|ARGMAX|SKIPPED|panicked|SUMMARY" "$OUT/gpu-tests.log"

echo "== 2. demo model scored on cpu / cuda f32 / cuda bf16"
DEMO=/tmp/forkscore-demo
rm -rf "$DEMO"
"$C/run.sh" "$C/forkscore" demo-model "$DEMO" || echo "demo-model failed"
CTX="Our production payment service is completely down for every customer, and no one can complete a purchase."
for cfg in "cpu f32" "cuda f32" "cuda bf16"; do
  set -- $cfg
  "$C/run.sh" "$C/forkscore" score --model "$DEMO" --revision demo \
    --schema-file "$SCHEMA" --context "$CTX" \
    --device "$1" --dtype "$2" > "$OUT/score-$1-$2.json" \
    && echo "score $1 $2 ok" || echo "score $1 $2 FAILED"
done
mv -f "$OUT/score-cpu-f32.json" "$OUT/score-cpu.json" 2>/dev/null

if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  echo "== 3. modes bench on cuda"
  for dtype in bf16 f32; do
    t0=$(date +%s)
    FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=$dtype \
    FORKSCORE_BENCH_HIDDEN="${BENCH_HIDDEN:-1024}" FORKSCORE_BENCH_LAYERS="${BENCH_LAYERS:-8}" \
    FORKSCORE_BENCH_HEADS="${BENCH_HEADS:-16}" FORKSCORE_BENCH_KV_HEADS="${BENCH_KV_HEADS:-4}" \
    FORKSCORE_BENCH_REPEATS="${BENCH_REPEATS:-7}" FORKSCORE_BENCH_OUT="/tmp/bench-$dtype" \
      timeout "${BENCH_TIMEOUT:-150}" "$C/run.sh" "$C/modes-bench" \
      && cp "/tmp/bench-$dtype/modes.json" "$OUT/modes-cuda-$dtype.json" \
      || echo "bench $dtype FAILED"
    echo "bench $dtype took $(( $(date +%s) - t0 ))s"
  done
fi
echo "== done"
