#!/usr/bin/env bash
# Where forkscore's GPU time goes, in one device call (issue 9): per-kernel GPU time under Nsight
# Compute, the GPU tests, the exact top-K kernel harness, and an A/B of the CUDA runtime settings.
#   OUT=/path bash scripts/gpu-real/diagnose.sh
# Needs carry/{forkscore,modes-bench,gpu-tests}.xz + run.sh (scripts/build-cuda.sh).
# Env: MODELS (qwen35-4b,qwen25-1.5b), CASE_<key> ("fields:words", default 8:1000 for
# qwen35_4b, 28:1000 otherwise), SKIP_NCU, SKIP_TESTS, SKIP_TOPK, SKIP_AB (=1 skips), NCU_TIMEOUT (150),
# HARNESSES (space-separated scripts/gpu-kernels/*.py to run, e.g. gdn_chunk_harness.py).
# The A/B alternates "candle" (candle's CUDA runtime defaults, separate gate/up products) with
# "tuned" (the defaults: see backends/src/candle/cuda_runtime.rs and mlp.rs).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT}"; mkdir -p "$OUT"
exec > >(tee "$OUT/diagnose.log") 2>&1
T0=$(date +%s); say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
W=/tmp/fs-diag; B=$W/bin; mkdir -p "$W/ckpt" "$B"
MODELS="${MODELS:-qwen35-4b,qwen25-1.5b}"
cp -f carry/run.sh "$B/"
unxz_to() { if command -v xz >/dev/null; then xz -dc "$1" > "$2"
  else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2"; fi; }
for n in forkscore modes-bench gpu-tests; do unxz_to "carry/$n.xz" "$B/$n" && chmod +x "$B/$n"; done
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); ncu: ${NCU:-none}"
python3 scripts/gpu-real/write_checkpoints.py "$W/ckpt" --models "$MODELS" --device cuda --dtype bfloat16 > "$W/ckpt.jsonl" || echo "checkpoints FAILED"
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  say "gpu tests"
  timeout 240 "$B/run.sh" "$B/gpu-tests" --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1; echo "gpu tests exit $?"
  grep -E "^test |test result|max" "$OUT/gpu-tests.log" | tail -20
fi
if [[ "${SKIP_TOPK:-0}" != 1 ]]; then
  say "top-K kernel harness"
  timeout 120 python3 scripts/gpu-kernels/topk_harness.py > "$OUT/topk_harness.txt" 2>&1; echo "topk exit $?"
  grep -v "^\[check\].*: ok" "$OUT/topk_harness.txt" | tail -20
fi
for h in ${HARNESSES:-}; do
  say "harness $h"
  timeout 150 python3 "scripts/gpu-kernels/$h" > "$OUT/${h%.py}.txt" 2>&1; echo "$h exit $?"
  tail -15 "$OUT/${h%.py}.txt"
done
IFS=, read -ra ML <<<"$MODELS"
for m in "${ML[@]}"; do
  key="${m//[-.]/_}"; cv="CASE_$key"; d=28:1000; [[ "$m" == qwen35-4b ]] && d=8:1000
  IFS=: read -r fields words <<<"${!cv:-$d}"
  bench() { # runtime repeats
    local base=""; [[ "$1" == candle ]] && base="FORKSCORE_MLP=separate"
    env $base FORKSCORE_CUDA_RUNTIME="$1" FORKSCORE_BENCH_MODEL="$W/ckpt/$m" FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=bf16 \
    FORKSCORE_BENCH_REPEATS="$2" FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_FIELDS="$fields" \
    FORKSCORE_BENCH_WORDS="$words" FORKSCORE_BENCH_OUT="$W/bench-$m-$1" "${@:3}"
  }
  if [[ "${SKIP_AB:-0}" != 1 ]]; then
    for rt in candle tuned candle tuned; do
      say "$m $fields fields / $words words, runtime $rt"
      bench "$rt" 7 timeout 90 "$B/run.sh" "$B/modes-bench" 2>&1 | grep -E "^ +[0-9]|loaded" | tee -a "$OUT/ab-$m.log"
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rows"][0]; print("stages (median ms):", json.dumps(r["stages_ms"]["parallel"]))' \
        "$W/bench-$m-$rt/modes.json" 2>&1 | tee -a "$OUT/ab-$m.log"
    done
  fi
  if [[ "${SKIP_NCU:-0}" != 1 && -n "$NCU" ]]; then
    say "$m ncu (2 decisions: warm-up + 1)"
    bench tuned 1 timeout "${NCU_TIMEOUT:-150}" "$NCU" --clock-control none --cache-control none --print-units base \
      --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu-$m.csv" "$B/run.sh" "$B/modes-bench" > "$OUT/ncu-$m.out" 2>&1
    echo "ncu exit $?"; tail -3 "$OUT/ncu-$m.out"
    wall="$(grep -E "^ +$fields " "$OUT/ab-$m.log" 2>/dev/null | tail -1 | awk '{print $3}' | tr -d ms)"
    python3 scripts/gpu-real/kernel_table.py "$OUT/ncu-$m.csv" --passes 2 ${wall:+--wall-ms $wall} > "$OUT/kernels-$m.md" 2>&1
    head -40 "$OUT/kernels-$m.md"
    gzip -9 "$OUT/ncu-$m.csv"
  fi
done
say "done"
