#!/usr/bin/env bash
# Many decisions at real shapes on the GPU machine, in ONE command: seeded Qwen3.5-4B and
# Qwen2.5-1.5B checkpoints written by transformers, then
#   1. `forkscore batch` grouped vs direct (BATCH_CONTEXTS contexts x 8 fields, ~830 tokens):
#      wall, job seconds, prefix tokens/s from the job's own timing, changed values;
#   2. `forkscore serve` under load (serve_load.py): closed loop at CLIENTS clients and, with
#      RATES, fixed arrival rates; decisions/s, prefix tokens/s, p50/p90/p99 and MFU.
# Run from the repository root with OUT set:  OUT=/path bash scripts/gpu-real/throughput.sh
# Needs carry/{forkscore.xz,run.sh} (scripts/build-cuda.sh), python3 with torch + transformers.
# Env (defaults): MODELS (qwen35-4b,qwen25-1.5b), BATCH_MODELS (qwen35-4b), BATCH_CONTEXTS (512),
#   CLIENTS (1,16,64), RATES (empty), LOAD_S (15 per level), WORDS (150:250), PEAK_TFLOPS (790),
#   SKIP_BATCH, SKIP_SERVE (=1 skips), EXTRA_SERVE_FLAGS, BATCH_EXTRA (more batch flags),
#   LOAD_OPTIONS (the load's requests' options object, e.g. '{"layout": "fields-first"}'), COMMIT.
# CPU smoke test of the script (tiny dimensions, real vocabularies, local binary):
#   DEVICE=cpu DTYPE=f32 TINY=1 BIN=target/debug/forkscore BATCH_CONTEXTS=8 CLIENTS=1,4 LOAD_S=3
# Output ($OUT): run.log, batch-<model>.json, load-<model>.json.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
T0=$(date +%s)
PY="${PY:-python3}"
CARRY="${CARRY:-$REPO/carry}"
W="${WORK:-/tmp/gpu-tput}"
B=/tmp/forkscore-bin
S="$REPO/scripts/gpu-real"
MODELS="${MODELS:-qwen35-4b,qwen25-1.5b}"
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p "$W/ckpt" "$B"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bf16}"
case "$DTYPE" in bf16) PT_DTYPE=bfloat16 ;; f16) PT_DTYPE=float16 ;; *) PT_DTYPE=float32 ;; esac
TINY_FLAG=""; [[ "${TINY:-0}" == 1 ]] && TINY_FLAG=--tiny

say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit ${COMMIT:-unknown}"
if [[ -n "${BIN:-}" ]]; then
  UNPACK=""
else
(
  cp -f "$CARRY/run.sh" "$B/"
  "$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    "$CARRY/forkscore.xz" "$B/forkscore"
  chmod +x "$B/forkscore"
) &
UNPACK=$!
fi
say "write checkpoints: $MODELS"
timeout 150 "$PY" "$S/write_checkpoints.py" "$W/ckpt" --models "$MODELS" --device "$DEVICE" \
  --dtype "$PT_DTYPE" $TINY_FLAG || echo "write_checkpoints FAILED"
[[ -z "$UNPACK" ]] || wait "$UNPACK" || echo "unpack FAILED"
RUN="${BIN:-$B/run.sh $B/forkscore}"

# One untimed decision per model first: a fresh machine compiles the GPU kernels on first use
# (cached for later processes), which must not fall on whichever mode is measured first.
IFS=, read -ra ML <<<"$MODELS"
for m in "${ML[@]}"; do
  say "warm-up $m"
  /usr/bin/time -f "first decision of a fresh process: %e s wall" $RUN score --model "$W/ckpt/$m" \
    --revision bench --device "$DEVICE" --dtype "$DTYPE" \
    --schema-file fixtures/examples/support_triage.json --context "warm-up" > /dev/null
done

if [[ "${SKIP_BATCH:-0}" != 1 ]]; then
  IFS=, read -ra BL <<<"${BATCH_MODELS:-qwen35-4b}"
  for m in "${BL[@]}"; do
    say "batch $m: ${BATCH_CONTEXTS:-512} contexts, grouped vs direct"
    timeout 300 "$PY" "$S/batch_case.py" --forkscore "$RUN" --model "$W/ckpt/$m" \
      --device "$DEVICE" --dtype "$DTYPE" --out "$OUT/batch-$m.json" --contexts "${BATCH_CONTEXTS:-512}" --fields 8 --tokens 830 \
      --timeout-s 140 --work "$W/batch-$m" --extra "${BATCH_EXTRA:-}"
    echo "batch exit $?"
  done
fi

if [[ "${SKIP_SERVE:-0}" != 1 ]]; then
  IFS=, read -ra ML <<<"$MODELS"
  port=18080
  for m in "${ML[@]}"; do
    port=$((port + 1))
    say "serve $m on :$port"
    $RUN serve --model "$W/ckpt/$m" --revision bench --device "$DEVICE" --dtype "$DTYPE" --port "$port" \
      --queue-capacity 4096 ${EXTRA_SERVE_FLAGS:-} > "$W/serve-$m.log" 2>&1 &
    SPID=$!
    timeout 240 "$PY" "$S/serve_load.py" --url "http://127.0.0.1:$port" --model "$W/ckpt/$m" \
      --clients "${CLIENTS:-1,16,64}" --rate "${RATES:-}" --duration-s "${LOAD_S:-15}" \
      --words "${WORDS:-150:250}" --peak-tflops "${PEAK_TFLOPS:-790}" --label "$m" \
      ${LOAD_OPTIONS:+--options "$LOAD_OPTIONS"} \
      --out "$OUT/load-$m.json"
    echo "load exit $?"
    kill -TERM "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
    tail -3 "$W/serve-$m.log"
  done
fi
say "done"
