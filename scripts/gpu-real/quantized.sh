#!/usr/bin/env bash
# In-memory quantization on the GPU (`--quantize q8_0|q4k`), in ONE command on the GPU machine:
#   OUT=/path bash scripts/gpu-real/quantized.sh
# Writes the seeded real-shape checkpoints with transformers (bf16), then runs the modes bench
# (parallel mode) on each model unquantized and under each scheme with a dump of every row's
# candidate logits, sampling GPU memory, and reports speed, memory and fidelity against the
# unquantized run of the same model (scripts/gpu-real/quantized_report.py).
# Needs carry/{modes-bench.xz,run.sh} (scripts/build-cuda.sh) and python3 with torch + transformers.
# Env (defaults): MODELS (qwen25-1.5b,qwen35-4b), SCHEMES (q8_0,q4k), FIELDS (8,28), WORDS (600),
#   REPEATS (3), RUN_TIMEOUT (80 s per bench run), COMMIT (else git rev-parse HEAD), PY (python3).
# Output ($OUT): run.log, report.md, report.json, bench-<model>-<scheme>.log.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
PY="${PY:-python3}"
W=/tmp/gpu-quant
B=/tmp/forkscore-bin
MODELS="${MODELS:-qwen25-1.5b,qwen35-4b}"
SCHEMES="${SCHEMES:-q8_0,q4k}"
rm -rf "$W" && mkdir -p "$W/ckpt" "$B"
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
cp -f carry/run.sh "$B/"
xz -dc carry/modes-bench.xz > "$B/modes-bench" && chmod +x "$B/modes-bench"
"$PY" scripts/gpu-real/write_checkpoints.py "$W/ckpt" --models "$MODELS" --device cuda --dtype bfloat16 \
  || echo "write_checkpoints FAILED"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
cat > "$W/env.json" <<JSON
{"commit": "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}", "gpu": "$GPU", "driver": "$DRIVER",
 "command": "OUT=... bash scripts/gpu-real/quantized.sh", "models": "$MODELS", "schemes": "$SCHEMES",
 "fields": "${FIELDS:-8,28}", "words": "${WORDS:-600}", "repeats": "${REPEATS:-3}"}
JSON
IFS=, read -ra MODEL_LIST <<<"$MODELS"
IFS=, read -ra SCHEME_LIST <<<"none,$SCHEMES"
for m in "${MODEL_LIST[@]}"; do
  [[ -f "$W/ckpt/$m/config.json" ]] || { echo "no checkpoint for $m"; continue; }
  for s in "${SCHEME_LIST[@]}"; do
    echo "== [$(date -u +%T)] $m quantize $s"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$W/mem-$m-$s.txt" 2>/dev/null &
    mem=$!
    q=(); [[ "$s" != none ]] && q=(FORKSCORE_BENCH_QUANTIZE="$s")
    env "${q[@]}" FORKSCORE_BENCH_MODEL="$W/ckpt/$m" FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=bf16 \
      FORKSCORE_BENCH_FIELDS="${FIELDS:-8,28}" FORKSCORE_BENCH_WORDS="${WORDS:-600}" \
      FORKSCORE_BENCH_REPEATS="${REPEATS:-3}" FORKSCORE_BENCH_MODES=parallel \
      FORKSCORE_BENCH_OUT="$W/bench-$m-$s" FORKSCORE_BENCH_DUMP="$W/dump-$m-$s.json" \
      timeout "${RUN_TIMEOUT:-80}" "$B/run.sh" "$B/modes-bench" > "$OUT/bench-$m-$s.log" 2>&1
    echo "bench exit $?"
    kill "$mem" 2>/dev/null; wait "$mem" 2>/dev/null
    tail -4 "$OUT/bench-$m-$s.log"
  done
done
"$PY" scripts/gpu-real/quantized_report.py "$W" --md "$OUT/report.md" --json "$OUT/report.json"
echo "== $(date -u +%FT%TZ) done"
