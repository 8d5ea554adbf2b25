#!/usr/bin/env bash
# The many-decision checks in ONE call on the GPU machine (~7 minutes), in this order:
#   1. the flash kernel's varlen / slot-table forms vs solo launches and float32
#      (scripts/gpu-kernels/flash_varlen_harness.py) and the cuBLAS row-invariance probe;
#   2. throughput.sh: seeded checkpoints, the first decision of a fresh process (start-up),
#      batch grouped vs direct, serve under load — with MFU beside every figure;
#   3. batch grouped vs direct with --deterministic (bf16 batch invariance and its cost);
#   4. a FORKSCORE_PROFILE=1 grouped batch on the 4B (where the time goes);
#   5. the GPU conformance tests (carry/gpu-tests.xz), if present — run second, right after the
#      kernel harness (correctness before speed).
# Run from the repository root with OUT set; needs carry/{forkscore.xz,run.sh} from
# scripts/build-cuda.sh. Env: BATCH_CONTEXTS (256), CLIENTS (1,64), LOAD_S (8), COMMIT,
# SKIP_SERVE=1 (no serve load), GPU_TESTS_S (150), SKIP_KERNELS=1 / SKIP_GPU_TESTS=1 /
# SKIP_DETERMINISTIC=1 (leave those steps out, e.g. when an earlier call ran them).
# Steps 2–5 run the defaults; step 2b repeats the 4B grouped batch with AB_ENV (default
# FORKSCORE_FLASH_BATCHED=off; any dev switch, e.g. FORKSCORE_HEADS=candle), in the same call,
# for the ratio.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
S=scripts/gpu-real
B=/tmp/forkscore-bin
CK=/tmp/gpu-tput/ckpt
AB_ENV="${AB_ENV:-FORKSCORE_FLASH_BATCHED=off}"
AB_NAME="$(tr 'A-Z=_' 'a-z--' <<<"${AB_ENV#FORKSCORE_}")"
if [[ -z "${SKIP_KERNELS:-}" ]]; then
echo "== kernels"
timeout 120 python3 scripts/gpu-kernels/flash_varlen_harness.py > "$OUT/flash-varlen.log" 2>&1
tail -12 "$OUT/flash-varlen.log"
timeout 60 python3 scripts/gpu-kernels/gemm_invariance_probe.py > "$OUT/gemm-probe.log" 2>&1
cat "$OUT/gemm-probe.log"
fi
mkdir -p "$B"
if [[ -f carry/gpu-tests.xz && -z "${SKIP_GPU_TESTS:-}" ]]; then
  echo "== gpu tests"
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    carry/gpu-tests.xz "$B/gpu-tests"
  chmod +x "$B/gpu-tests"
  timeout "${GPU_TESTS_S:-150}" carry/run.sh "$B/gpu-tests" --test-threads 1 > "$OUT/gpu-tests.log" 2>&1
  grep -E "^test |test result|panicked|differ between" "$OUT/gpu-tests.log" | head -30
fi
echo "== throughput"
BATCH_CONTEXTS="${BATCH_CONTEXTS:-256}" CLIENTS="${CLIENTS:-1,64}" LOAD_S="${LOAD_S:-8}" \
  timeout 330 bash $S/throughput.sh > /dev/null 2>&1
grep -E "first decision|\[batch\]|clients|==" "$OUT/run.log" | head -40
echo "== $AB_ENV (same inputs)"
env "$AB_ENV" timeout 100 python3 $S/batch_case.py --forkscore "$B/run.sh $B/forkscore" \
  --model $CK/qwen35-4b --out "$OUT/batch-qwen35-4b-$AB_NAME.json" --contexts "${BATCH_CONTEXTS:-256}" \
  --fields 8 --tokens 830 --timeout-s 90 --work /tmp/off --modes grouped
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["modes"]; print({m: e.get("prefix_tokens_per_s_job") for m, e in r.items()})' \
  "$OUT/batch-qwen35-4b-$AB_NAME.json"
if [[ -z "${SKIP_DETERMINISTIC:-}" ]]; then
echo "== deterministic"
timeout 120 python3 $S/batch_case.py --forkscore "$B/run.sh $B/forkscore" --model $CK/qwen35-4b \
  --out "$OUT/batch-qwen35-4b-deterministic.json" --contexts "${BATCH_CONTEXTS:-256}" --fields 8 \
  --tokens 830 --timeout-s 100 --work /tmp/det --extra=--deterministic
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["modes"]; print({m: (e.get("prefix_tokens_per_s_job"), e.get("values_differing_from_first_mode")) for m, e in r.items()})' \
  "$OUT/batch-qwen35-4b-deterministic.json"
fi
echo "== profile"
PW=/tmp/det; [[ -f $PW/in.jsonl ]] || PW=/tmp/off  # the inputs of the last batch step that ran
FORKSCORE_PROFILE=1 timeout 60 $B/run.sh $B/forkscore batch --model $CK/qwen35-4b --revision bench \
  --device cuda --dtype bf16 --input $PW/in.jsonl --output $PW/profiled.jsonl \
  --schema-file $PW/schema.json --batch-mode grouped --quiet 2> "$OUT/profile-qwen35-4b.txt"
tail -30 "$OUT/profile-qwen35-4b.txt"
echo "== done"
