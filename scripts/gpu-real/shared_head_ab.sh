#!/usr/bin/env bash
# The shared prompt head (engine::head) on the GPU machine, in ONE call (~7 minutes):
#   1. the GPU tests of the shared past and of bf16 batch invariance (carry/gpu-tests.xz);
#   2. throughput.sh with the head on (the default): seeded Qwen3.5-4B / Qwen2.5-1.5B, the 4B
#      batch grouped vs direct, serve under load at CLIENTS;
#   3. the same serve levels and the grouped 4B batch with FORKSCORE_SHARED_HEAD=off (every
#      context prefills its whole prompt), same inputs, same machine: the A/B ratio.
# Run from the repository root with OUT set; needs carry/{forkscore.xz,gpu-tests.xz,run.sh}
# from scripts/build-cuda.sh. Env: BATCH_CONTEXTS (256), CLIENTS (1,64), LOAD_S (8), COMMIT.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT/on" "$OUT/off"
S=scripts/gpu-real
B=/tmp/forkscore-bin
CK=/tmp/gpu-tput/ckpt
export BATCH_CONTEXTS="${BATCH_CONTEXTS:-256}" CLIENTS="${CLIENTS:-1,64}" LOAD_S="${LOAD_S:-8}"
mkdir -p "$B"
if [[ -f carry/gpu-tests.xz ]]; then
  echo "== gpu tests"
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    carry/gpu-tests.xz "$B/gpu-tests"
  chmod +x "$B/gpu-tests"
  for t in cuda_extend_many cuda_packed_prefill cuda_bf16_deterministic; do
    timeout 100 carry/run.sh "$B/gpu-tests" "$t" --test-threads 1 >> "$OUT/gpu-tests.log" 2>&1
  done
  grep -E "^test |test result|panicked|SUMMARY|worst" "$OUT/gpu-tests.log" | head -30
fi
echo "== head on"
OUT="$OUT/on" timeout 330 bash $S/throughput.sh > /dev/null 2>&1
grep -E "first decision|\[batch\]|clients|==" "$OUT/on/run.log" | head -30
echo "== head off (FORKSCORE_SHARED_HEAD=off)"
FORKSCORE_SHARED_HEAD=off OUT="$OUT/off" SKIP_BATCH=1 timeout 200 bash $S/throughput.sh > /dev/null 2>&1
grep -E "clients|==" "$OUT/off/run.log" | head -20
FORKSCORE_SHARED_HEAD=off timeout 100 python3 $S/batch_case.py --forkscore "$B/run.sh $B/forkscore" \
  --model $CK/qwen35-4b --out "$OUT/off/batch-qwen35-4b.json" --contexts "$BATCH_CONTEXTS" \
  --fields 8 --tokens 830 --timeout-s 90 --work /tmp/off --modes grouped
for f in "$OUT"/on/batch-qwen35-4b.json "$OUT"/off/batch-qwen35-4b.json; do
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["modes"]; print(sys.argv[1], {m: (e.get("prefix_tokens_per_s_job"), e.get("job_s"), e.get("values_differing_from_first_mode")) for m, e in r.items()})' "$f"
done
