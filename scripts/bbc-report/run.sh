#!/usr/bin/env bash
# The real-data report's runs on the CPU: BBC News topics (scripts/bbc-report/prepare.py) on the
# real Qwen2.5-Coder GGUFs (scripts/real-models.sh), with one forkscore binary.
#
#   BIN=target/release/forkscore OUT=/tmp/bbc-run [PER_TOPIC=20] scripts/bbc-report/run.sh [1.5b|0.5b|all]
#
# PER_TOPIC: articles per topic in the stratified sample (seed 17), used when $OUT/data is made.
#
# Per model: `forkscore eval` with code-letter scoring, with literal scoring, and with json
# scoring (the generation baseline's own prompt) together with the generation baseline on the
# same items, and `forkscore calibrate` (temperature per field, and contextual calibration) on the
# code-letter, literal and json predictions, each into $OUT/<model>/. Peak RSS of each process
# from GNU time. Nothing is written inside the repository. STEPS (default "code literal json")
# selects the evals and their calibrations.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN=${BIN:-$REPO/target/release/forkscore}
OUT=${OUT:-/tmp/bbc-run}
THREADS=${THREADS:-2}
which=${1:-all}
cache=${FORKSCORE_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forkscore/models}
declare -A FILE=([1.5b]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [0.5b]=qwen2.5-coder-0.5b-instruct.gguf)
mkdir -p "$OUT"
[ -f "$OUT/data/all.jsonl" ] || python3 "$REPO/scripts/bbc-report/prepare.py" "$OUT/data" --per-topic "${PER_TOPIC:-20}"
timed() { # name, command…: peak RSS (KiB) and wall seconds into $dir/<name>.time
  local name=$1; shift
  /usr/bin/time -f "%M %e" -o "$dir/$name.time" "$@"
}
for m in 1.5b 0.5b; do
  [ "$which" = all ] || [ "$which" = "$m" ] || continue
  model="$cache/${FILE[$m]}"
  [ -f "$model" ] || { echo "missing $model (run scripts/real-models.sh $m)" >&2; exit 1; }
  dir="$OUT/$m"; mkdir -p "$dir"
  common=(--model "$model" --schema-file "$OUT/data/schema.json" --input "$OUT/data/all.jsonl" --quiet)
  steps=" ${STEPS:-code literal json} "
  if [[ $steps == *" code "* ]]; then
  echo "== $m: code-letter scoring" >&2
  timed code env RAYON_NUM_THREADS=$THREADS "$BIN" eval "${common[@]}" --predictions "$dir/code.jsonl" \
    --report "$dir/code.report.json" --svg-dir "$dir" --resume > "$dir/code.txt"
  echo "== $m: calibrate (temperature, contextual)" >&2
  timed calibrate env RAYON_NUM_THREADS=$THREADS "$BIN" calibrate "${common[@]}" --predictions "$dir/code.jsonl" \
    --resume --seed 17 --output "$dir/calibration.json" --replace-output --report "$dir/calibrate.report.json" \
    > "$dir/calibrate.txt"
  timed calibrate-contextual env RAYON_NUM_THREADS=$THREADS "$BIN" calibrate "${common[@]}" \
    --predictions "$dir/code.jsonl" --resume --seed 17 --contextual --output "$dir/calibration-contextual.json" \
    --replace-output --report "$dir/calibrate-contextual.report.json" > "$dir/calibrate-contextual.txt"
  fi
  if [[ $steps == *" json "* ]]; then
  echo "== $m: json scoring + generation baseline (the same prompt)" >&2
  timed json env RAYON_NUM_THREADS=$THREADS "$BIN" eval "${common[@]}" --scoring json --predictions "$dir/json.jsonl" \
    --report "$dir/json.report.json" --svg-dir "$dir/json-svg" --baseline generate --resume > "$dir/json.txt"
  timed calibrate-json env RAYON_NUM_THREADS=$THREADS "$BIN" calibrate "${common[@]}" --scoring json \
    --predictions "$dir/json.jsonl" --resume --seed 17 --output "$dir/calibration-json.json" --replace-output \
    --report "$dir/calibrate-json.report.json" > "$dir/calibrate-json.txt"
  fi
  [[ $steps == *" literal "* ]] || continue
  echo "== $m: literal scoring" >&2
  timed literal env RAYON_NUM_THREADS=$THREADS "$BIN" eval "${common[@]}" --scoring literal \
    --predictions "$dir/literal.jsonl" --report "$dir/literal.report.json" --svg-dir "$dir/literal-svg" \
    --resume > "$dir/literal.txt"
  echo "== $m: calibrate literal scoring (temperature, contextual)" >&2
  timed calibrate-literal env RAYON_NUM_THREADS=$THREADS "$BIN" calibrate "${common[@]}" --scoring literal \
    --predictions "$dir/literal.jsonl" --resume --seed 17 --output "$dir/calibration-literal.json" --replace-output \
    --report "$dir/calibrate-literal.report.json" > "$dir/calibrate-literal.txt"
  timed calibrate-literal-contextual env RAYON_NUM_THREADS=$THREADS "$BIN" calibrate "${common[@]}" --scoring literal \
    --predictions "$dir/literal.jsonl" --resume --seed 17 --contextual --output "$dir/calibration-literal-contextual.json" \
    --replace-output --report "$dir/calibrate-literal-contextual.report.json" > "$dir/calibrate-literal-contextual.txt"
done
echo "done: $OUT" >&2
