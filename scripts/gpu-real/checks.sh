#!/usr/bin/env bash
# Device-side checks that go with scripts/gpu-real/run.sh (one call, ~6 minutes on one GPU):
#   1. the GPU conformance tests (CUDA f32/bf16 vs CPU f32 on tiny models of every architecture,
#      and the fused Gated DeltaNet kernels vs the candle forms);
#   2. start-up on a fresh machine: `forkscore score` on the seeded Qwen3.5-4B folder with an
#      empty CUDA compute cache (CUDA_CACHE_PATH pointed at a new folder), without and with the
#      background kernel compilation (FORKSCORE_KERNEL_WARMUP=0 / default), then again with the
#      cache filled — wall time, load and prefill from the telemetry;
#   3. the fused kernels' effect end to end: the modes bench on the 4B folder, one case
#      (8 fields, ~1,080-token prefix, parallel), with FORKSCORE_GDN=candle and with the default.
# Needs carry/{forkscore,gpu-tests,modes-bench}.xz + carry/run.sh (scripts/build-cuda.sh).
# Env: OUT (results folder). Output: $OUT/checks.log, $OUT/gpu-tests.log.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
exec > >(tee "$OUT/checks.log") 2>&1
B=/tmp/forkscore-bin
W=/tmp/gpu-checks
mkdir -p "$B" "$W"
cp -f carry/run.sh "$B/"
for n in forkscore gpu-tests modes-bench; do
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "carry/$n.xz" "$B/$n"
  chmod +x "$B/$n"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== 1. GPU conformance tests"
t0=$(date +%s)
CUDA_CACHE_PATH=$W/cc-tests timeout "${TESTS_TIMEOUT:-240}" "$B/run.sh" "$B/gpu-tests" --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1
echo "gpu-tests exit $? in $(( $(date +%s) - t0 ))s"
grep -E "^test |test result|SUMMARY|ARGMAX|panicked" "$OUT/gpu-tests.log"

echo "== 2. start-up (seeded Qwen3.5-4B, bf16)"
python3 scripts/gpu-real/write_checkpoints.py "$W/ckpt" --models qwen35-4b > /dev/null || echo "checkpoint FAILED"
M="$W/ckpt/qwen35-4b"
python3 - "$W/context.txt" <<'PY'
import sys
base = ("Customer reports that the checkout API returns 502 errors for every enterprise account since the last deploy; "
        "they cannot bill their own customers and threaten to cancel the contract unless it is fixed today. ")
open(sys.argv[1], "w").write(base * 60)
PY
score() { # label, env...
  local label="$1"; shift
  local t0; t0=$(date +%s.%N)
  env "$@" "$B/run.sh" "$B/forkscore" score --model "$M" --revision seeded --device cuda --dtype bf16 \
    --schema-file fixtures/examples/parallel_schema.json --context-file "$W/context.txt" > "$W/score-$label.json" 2> "$W/score-$label.err"
  local rc=$?
  local wall; wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  python3 - "$W/score-$label.json" "$label" "$rc" "$wall" <<'PY'
import json, sys
path, label, rc, wall = sys.argv[1:]
try:
    t = json.load(open(path))["telemetry"]
    print(f"{label}: rc {rc}, process wall {wall} s, prefix {t.get('prefix_tokens')} tokens, timings_ms {t.get('timings_ms')}")
except Exception as e:  # noqa: BLE001
    print(f"{label}: rc {rc}, wall {wall} s, no telemetry ({e})")
PY
}
score cold-no-warmup CUDA_CACHE_PATH=$W/cc-a FORKSCORE_KERNEL_WARMUP=0
score cold-warmup CUDA_CACHE_PATH=$W/cc-b
score warm-cache CUDA_CACHE_PATH=$W/cc-b
tail -3 "$W/score-cold-warmup.err"

echo "== 3. fused GDN kernels vs the candle path (4B, 8 fields, 600 words, parallel)"
for gdn in candle fused; do
  e=(); [[ $gdn == candle ]] && e=(FORKSCORE_GDN=candle)
  env "${e[@]}" CUDA_CACHE_PATH=$W/cc-b FORKSCORE_BENCH_MODEL="$M" FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=bf16 \
    FORKSCORE_BENCH_REPEATS=3 FORKSCORE_BENCH_FIELDS=8 FORKSCORE_BENCH_WORDS=600 FORKSCORE_BENCH_MODES=parallel \
    FORKSCORE_BENCH_PROFILE=1 FORKSCORE_BENCH_OUT="$W/bench-$gdn" \
    timeout 150 "$B/run.sh" "$B/modes-bench" 2>&1 | grep -E "^ +8 |profile" | sed "s/^/$gdn: /"
done
