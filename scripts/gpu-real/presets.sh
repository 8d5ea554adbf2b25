#!/usr/bin/env bash
# The four seed presets (fintech_fraud, code_security, support_triage, high_cardinality_255
# with literal scoring) with every mode on the GPU machine, in ONE command:
#   OUT=/path bash scripts/gpu-real/presets.sh
# Writes the seeded real-shape checkpoints with transformers (bf16) and runs the modes bench
# (FORKSCORE_BENCH_PRESETS) on each. Needs carry/{modes-bench.xz,run.sh} (scripts/build-cuda.sh).
# Env (defaults): MODELS (qwen25-1.5b,qwen35-4b), MODES (parallel,fbs4,cached-serial,
#   independent,tree), WORDS (600), REPEATS (2), RUN_TIMEOUT (200 s per model), PY (python3).
# Output ($OUT): run.log, modes-<model>.json, bench-<model>.log.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
PY="${PY:-python3}"
W=/tmp/gpu-presets
B=/tmp/forkscore-bin
MODELS="${MODELS:-qwen25-1.5b,qwen35-4b}"
rm -rf "$W" && mkdir -p "$W/ckpt" "$B"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
cp -f carry/run.sh "$B/"
xz -dc carry/modes-bench.xz > "$B/modes-bench" && chmod +x "$B/modes-bench"
"$PY" scripts/gpu-real/write_checkpoints.py "$W/ckpt" --models "$MODELS" --device cuda --dtype bfloat16 \
  || echo "write_checkpoints FAILED"
IFS=, read -ra MODEL_LIST <<<"$MODELS"
for m in "${MODEL_LIST[@]}"; do
  [[ -f "$W/ckpt/$m/config.json" ]] || { echo "no checkpoint for $m"; continue; }
  echo "== [$(date -u +%T)] $m"
  FORKSCORE_BENCH_MODEL="$W/ckpt/$m" FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=bf16 \
    FORKSCORE_BENCH_PRESETS=fintech_fraud,code_security,support_triage,high_cardinality_255 \
    FORKSCORE_BENCH_MODES="${MODES:-parallel,fbs4,cached-serial,independent,tree}" \
    FORKSCORE_BENCH_WORDS="${WORDS:-600}" FORKSCORE_BENCH_REPEATS="${REPEATS:-2}" \
    FORKSCORE_BENCH_OUT="$W/bench-$m" \
    timeout "${RUN_TIMEOUT:-200}" "$B/run.sh" "$B/modes-bench" > "$OUT/bench-$m.log" 2>&1
  echo "bench exit $?"
  grep -v "^\[profile\]" "$OUT/bench-$m.log" | tail -8
  cp -f "$W/bench-$m/modes.json" "$OUT/modes-$m.json" 2>/dev/null || echo "no modes.json for $m"
done
echo "== $(date -u +%FT%TZ) done"
