#!/usr/bin/env bash
# f32, --quantize bf16 and q8_0 in one process order f32, bf16, q8_0, q8_0, bf16, f32 (so a drift
# of the machine falls on all three), parallel mode at 8 and 28 fields on the seeded
# Qwen2.5-0.5B-shaped checkpoint; then transformers on the f32 run's token ids.
#   MODEL=/path/to/qwen25-0.5b PYTHON=/path/to/python-with-torch bash scripts/cpu-real/schemes-abba.sh OUTDIR
set -euo pipefail
OUT=${1:?usage: schemes-abba.sh OUTDIR}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO"
one() { # NAME TAG [QUANTIZE]
  local name=$1 tag=$2 q=${3:-}
  echo "== $(date -u +%T) $name $tag, load $(cut -d' ' -f1-3 /proc/loadavg)"
  env FORKSCORE_BENCH_MODEL="$MODEL" FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
    FORKSCORE_BENCH_REPEATS=3 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT="$OUT/$name-$tag" \
    FORKSCORE_BENCH_DUMP="$OUT/dump-$name-$tag.json" ${q:+FORKSCORE_BENCH_QUANTIZE=$q} \
    cargo bench -q -p forkscore-benches --bench modes 2>&1 | grep -v "^$" | tail -8
}
one f32 1; one bf16w 1 bf16; one q8_0 1 q8_0; one q8_0 2 q8_0; one bf16w 2 bf16; one f32 2
"$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32-1.json" --model "$MODEL" --out "$OUT/peer.json" \
  --label cpu --device cpu --dtype float32 --repeats 3 --budget-s 20 --modes prefill,prefix_batched
