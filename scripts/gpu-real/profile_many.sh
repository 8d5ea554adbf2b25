#!/usr/bin/env bash
# Where a many-decision job spends its time on the GPU machine, in one command: for each model
# (seeded checkpoints written by transformers if absent), `forkscore batch --batch-mode grouped`
# over CONTEXTS contexts (scripts/gpu-real/batch_case.py's inputs) twice — once plain (job time,
# prefix tokens/s) and once with FORKSCORE_PROFILE=1 (device-synchronised regions: prefill passes,
# attention / linear attention / MLP parts, scoring) — and the first `score` of the fresh process
# (start-up: kernel loading, no JIT when candle's kernels are fat binaries).
#   OUT=/path bash scripts/gpu-real/profile_many.sh
# Needs carry/{forkscore.xz,run.sh} (scripts/build-cuda.sh), python3 with torch + transformers.
# Env (defaults): MODELS (qwen35-4b,qwen25-1.5b), CONTEXTS (64), TOKENS (830), CKPT (/tmp/gpu-ckpt),
#   BATCH_FLAGS (more `forkscore batch` flags for both runs, e.g. "--layout fields-first").
# Output ($OUT): profile.log, batch-<model>.json, profile-<model>.txt.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
exec > >(tee "$OUT/profile.log") 2>&1
T0=$(date +%s)
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
CKPT="${CKPT:-/tmp/gpu-ckpt}"
B=/tmp/forkscore-bin
MODELS="${MODELS:-qwen35-4b,qwen25-1.5b}"
mkdir -p "$B" "$CKPT"
if [[ ! -x "$B/forkscore" ]]; then
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    carry/forkscore.xz "$B/forkscore"
  chmod +x "$B/forkscore"
fi
RUN="carry/run.sh $B/forkscore"
IFS=, read -ra ML <<<"$MODELS"
missing=()
for m in "${ML[@]}"; do [[ -f "$CKPT/$m/config.json" ]] || missing+=("$m"); done
if ((${#missing[@]})); then
  say "write checkpoints: ${missing[*]}"
  timeout 200 python3 scripts/gpu-real/write_checkpoints.py "$CKPT" --models "$(IFS=,; echo "${missing[*]}")" \
    --device cuda --dtype bfloat16 || echo "write_checkpoints FAILED"
fi
for m in "${ML[@]}"; do
  say "$m: first score of a fresh process"
  /usr/bin/time -f "$m first score: %e s wall" $RUN score --model "$CKPT/$m" --revision bench --device cuda \
    --dtype bf16 --schema-file fixtures/examples/support_triage.json --context "warm-up" > /dev/null
  say "$m: batch grouped, ${CONTEXTS:-64} contexts"
  timeout 200 python3 scripts/gpu-real/batch_case.py --forkscore "$RUN" --model "$CKPT/$m" --device cuda \
    --dtype bf16 --out "$OUT/batch-$m.json" --contexts "${CONTEXTS:-64}" --fields 8 --tokens "${TOKENS:-830}" \
    --modes grouped --timeout-s 180 --work "/tmp/profile-$m" --extra "${BATCH_FLAGS:-}"
  say "$m: the same job profiled"
  FORKSCORE_PROFILE=1 timeout 200 $RUN batch --model "$CKPT/$m" --revision bench --device cuda --dtype bf16 \
    --input "/tmp/profile-$m/in.jsonl" --output "/tmp/profile-$m/profiled.jsonl" \
    --schema-file "/tmp/profile-$m/schema.json" --batch-mode grouped --quiet ${BATCH_FLAGS:-} \
    2> "$OUT/profile-$m.txt"
  tail -40 "$OUT/profile-$m.txt"
done
say "done"
