#!/usr/bin/env bash
# forkscore vs transformers at real model sizes, on the GPU machine, in ONE command (issue 9).
# Run from the repository root with OUT set:  OUT=/path bash scripts/gpu-real/run.sh
# Needs: carry/{forkscore.xz,modes-bench.xz,run.sh} (scripts/build-cuda.sh), python3 with
# torch + transformers + tokenizers, optionally .whl/*.whl (fla-core, flash-linear-attention).
# See scripts/gpu-real/README.md. The whole run keeps under TOTAL_S seconds (default 530): every
# step's timeout is cut to what is left, minus a reserve for the report.
#
# Env (defaults): MODELS (qwen35-4b,qwen25-1.5b), BATCH_MODELS (qwen35-4b), SKIP_BENCH, SKIP_PEER,
#   SKIP_FLA, SKIP_BATCH (=1 skips), BENCH_REPEATS (3), BENCH_FIELDS (1,3,8,28), BENCH_WORDS
#   (40,600), BENCH_MODES_<model with - and . as _> (qwen35_4b: parallel,cached-serial; others:
#   parallel,fbs4,cached-serial,independent), BENCH_TIMEOUT_<key> (qwen35_4b 110, else 70),
#   PEER_MODES_<key> (e.g. prefill: which peer modes run; default all four),
#   PEER_LABELS_<key> (e.g. fla: which peer variants run; default fla,nofla for Qwen3.5 when the
#   wheels are there, else nofla), PEER_REPEATS (5), PEER_BUDGET_S (3), PEER_TIMEOUT_<key> (qwen35_4b 70 per fla/nofla run,
#   else 50), PEER_CASES (8:600,28:600,28:40,8:40,3:600,3:40,1:600,1:40: priority order),
#   BATCH_CONTEXTS (64), BATCH_FIELDS (8), BATCH_TOKENS (830), BATCH_TIMEOUT (45 per mode),
#   FORKSCORE_BENCH_PROFILE (1: one extra profiled parallel run per bench case), CARRY (carry), WORK (/tmp/gpu-real),
#   COMMIT (else git rev-parse HEAD), PY (python3), TOTAL_S (530).
# CPU smoke test of the whole pipeline (no GPU, tiny dimensions, real vocabularies):
#   DEVICE=cpu DTYPE=f32 TINY=1 BIN_DIR=target/debug-bins (holding forkscore and modes-bench).
# Output ($OUT, 8 files at most): run.log (everything printed; the report table last),
#   report.md, report.json, bench-<model>.log (bench stdout+stderr incl. the profile
#   output), peer.log, batch.log, raw.tar.gz (modes/peer/batch JSON, dumps, memory samples).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
T0=$(date +%s)
TOTAL_S="${TOTAL_S:-530}"
PY="${PY:-python3}"
CARRY="${CARRY:-$REPO/carry}"
W="${WORK:-/tmp/gpu-real}"
MODELS="${MODELS:-qwen35-4b,qwen25-1.5b}"
BATCH_MODELS="${BATCH_MODELS:-qwen35-4b}"
S="$REPO/scripts/gpu-real"
B="${BIN_DIR:-/tmp/forkscore-bin}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bf16}"
case "$DTYPE" in bf16) PT_DTYPE=bfloat16 ;; f16) PT_DTYPE=float16 ;; *) PT_DTYPE=float32 ;; esac
TINY_FLAG=""; [[ "${TINY:-0}" == 1 ]] && TINY_FLAG=--tiny
export FORKSCORE_BENCH_PROFILE="${FORKSCORE_BENCH_PROFILE:-1}"
rm -rf "$W" && mkdir -p "$W/ckpt" "$B"
RUN="$B/run.sh"

elapsed() { echo $(( $(date +%s) - T0 )); }
# budget DEFAULT RESERVE: a step's timeout, the default cut to the time left minus RESERVE.
# The defaults add up to ~500 s with the current speeds; earlier steps come first when short.
budget() { local left=$(( TOTAL_S - $(elapsed) - $2 )); (( left < $1 )) && echo "$left" || echo "$1"; }
say() { echo "== [$(elapsed)s] $*"; }
# GPU memory sampler around a step: mem_start NAME / mem_stop.
mem_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$W/mem-$1.txt" 2>/dev/null & MEM_PID=$!; }
mem_stop() { kill "$MEM_PID" 2>/dev/null; wait "$MEM_PID" 2>/dev/null; }

say "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
COMMIT="${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

# 1. In the background: unpack the binaries, install the fla wheels into /tmp/fla.
if [[ -n "${BIN_DIR:-}" ]]; then
  RUN=env  # local binaries: no wrapper
  UNPACK_PID=""
else
(
  cp -f "$CARRY/run.sh" "$B/"
  for n in forkscore modes-bench; do
    if command -v xz >/dev/null; then xz -dc "$CARRY/$n.xz" > "$B/$n"
    else "$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$CARRY/$n.xz" "$B/$n"; fi
    chmod +x "$B/$n"
  done
  echo "unpacked binaries"
) &
UNPACK_PID=$!
fi
FLA=""
if [[ "${SKIP_FLA:-0}" != 1 ]] && ls .whl/*.whl >/dev/null 2>&1; then
  rm -rf /tmp/fla
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla .whl/*.whl \
    && FLA=/tmp/fla || echo "fla wheels: install failed"
fi

# 2. Checkpoints (transformers save_pretrained, bf16, on cuda).
say "write checkpoints: $MODELS"
timeout "$(budget 120 15)" "$PY" "$S/write_checkpoints.py" "$W/ckpt" --models "$MODELS" \
  --device "$DEVICE" --dtype "$PT_DTYPE" $TINY_FLAG \
  | tee "$W/checkpoints.jsonl" || echo "write_checkpoints FAILED"
[[ -z "$UNPACK_PID" ]] || wait "$UNPACK_PID" || echo "unpack FAILED"

cat > "$W/env.json" <<EOF
{"commit": "$COMMIT", "gpu": "$GPU", "driver": "$DRIVER", "command": "OUT=... bash scripts/gpu-real/run.sh",
 "models": "$MODELS", "total_s": $TOTAL_S, "forkscore_bench_profile": "$FORKSCORE_BENCH_PROFILE"}
EOF

IFS=, read -ra MODEL_LIST <<<"$MODELS"
for m in "${MODEL_LIST[@]}"; do
  dir="$W/ckpt/$m"
  [[ -f "$dir/config.json" ]] || { echo "no checkpoint for $m"; continue; }
  key="${m//[-.]/_}"
  if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
    modes_var="BENCH_MODES_$key"
    default_modes="parallel,fbs4,cached-serial,independent"
    [[ "$m" == qwen35-4b ]] && default_modes="parallel,cached-serial"
    tv="BENCH_TIMEOUT_$key"; d=70; [[ "$m" == qwen35-4b ]] && d=110
    t="$(budget "${!tv:-$d}" 15)"
    say "modes bench $m (modes ${!modes_var:-$default_modes}, timeout ${t}s)"
    mem_start "bench-$m"
    FORKSCORE_BENCH_MODEL="$dir" FORKSCORE_BENCH_DEVICE="$DEVICE" FORKSCORE_BENCH_DTYPE="$DTYPE" \
    FORKSCORE_BENCH_REPEATS="${BENCH_REPEATS:-3}" FORKSCORE_BENCH_OUT="$W/bench-$m" \
    FORKSCORE_BENCH_DUMP="$W/dump-$m.json" FORKSCORE_BENCH_MODES="${!modes_var:-$default_modes}" \
    FORKSCORE_BENCH_FIELDS="${BENCH_FIELDS:-1,3,8,28}" FORKSCORE_BENCH_WORDS="${BENCH_WORDS:-40,600}" \
      timeout "$t" $RUN "$B/modes-bench" > "$OUT/bench-$m.log" 2>&1
    echo "bench exit $?"
    mem_stop
    grep -v "^\[profile\]" "$OUT/bench-$m.log" | tail -12
    cp -f "$W/bench-$m/modes.json" "$W/modes-$m.json" 2>/dev/null || echo "no modes.json for $m"
  fi
  if [[ "${SKIP_PEER:-0}" != 1 && -f "$W/dump-$m.json" ]]; then
    labels=(nofla)
    [[ -n "$FLA" && "$m" == qwen35* ]] && labels=(fla nofla)
    lv="PEER_LABELS_$key"; [[ -n "${!lv:-}" ]] && IFS=, read -ra labels <<<"${!lv}"
    for label in "${labels[@]}"; do
      tv="PEER_TIMEOUT_$key"; d=50; [[ "$m" == qwen35-4b ]] && d=70
      t="$(budget "${!tv:-$d}" 15)"
      say "peer $m $label (timeout ${t}s)"
      mem_start "peer-$label-$m"
      pp=""; [[ "$label" == fla ]] && pp="$FLA"
      PYTHONPATH="$pp" timeout "$t" "$PY" "$S/peer.py" --dump "$W/dump-$m.json" --model "$dir" \
        --out "$W/peer-$m-$label.json" --label "$m-$label" --device "$DEVICE" --dtype "$PT_DTYPE" --repeats "${PEER_REPEATS:-5}" \
        --budget-s "${PEER_BUDGET_S:-3}" --deadline-s "$(( t - 15 ))" \
        --cases "${PEER_CASES:-8:600,28:600,28:40,8:40,3:600,3:40,1:600,1:40}" \
        --modes "$(v="PEER_MODES_$key"; echo "${!v:-prefill,independent,cached_serial,batched}")" >> "$OUT/peer.log" 2>&1
      echo "peer exit $?"
      mem_stop
      grep "^\[peer" "$OUT/peer.log" | grep -- "$m-$label" | tail -40
    done
  fi
done

if [[ "${SKIP_BATCH:-0}" != 1 ]]; then
  IFS=, read -ra BL <<<"$BATCH_MODELS"
  for m in "${BL[@]}"; do
    dir="$W/ckpt/$m"
    [[ -f "$dir/config.json" ]] || continue
    t="$(budget $(( 2 * ${BATCH_TIMEOUT:-45} + 10 )) 10)"
    say "batch $m (timeout ${t}s)"
    mem_start "batch-$m"
    timeout "$t" "$PY" "$S/batch_case.py" --forkscore "$RUN $B/forkscore" --model "$dir" \
      --device "$DEVICE" --dtype "$DTYPE" \
      --out "$W/batch-$m.json" --contexts "${BATCH_CONTEXTS:-64}" --fields "${BATCH_FIELDS:-8}" \
      --tokens "${BATCH_TOKENS:-830}" --timeout-s "$(( (t - 10) / 2 ))" --work "$W/batch-work-$m" \
      >> "$OUT/batch.log" 2>&1
    echo "batch exit $?"
    mem_stop
    tail -4 "$OUT/batch.log"
  done
fi

say "report"
(cd "$W" && tar czf "$OUT/raw.tar.gz" --exclude=./ckpt --exclude='in.jsonl' --exclude='out-*.jsonl' .)
"$PY" "$S/report.py" "$W" --md "$OUT/report.md" --json "$OUT/report.json" --env "$W/env.json" > /tmp/gpu-real-report.txt 2>&1 \
  || echo "report FAILED: $(tail -5 /tmp/gpu-real-report.txt)"
echo "== done in $(elapsed)s"
cat "$OUT/report.md" 2>/dev/null
