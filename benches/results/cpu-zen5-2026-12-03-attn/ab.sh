#!/usr/bin/env bash
# The key-major attention form against the products form, same binary (FORKSCORE_CPU_ATTENTION
# toggles it), order products, key-major, key-major, products for f32 and q8_0 in each round;
# parallel mode at 8 and 28 fields, profile on; then transformers on the f32 ids.
#   MODEL=/path/to/qwen25-0.5b PYTHON=/path/to/python-with-torch bash ab.sh OUTDIR
set -euo pipefail
OUT=${1:?usage: ab.sh OUTDIR}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../../.." && pwd); cd "$REPO"
one() { # NAME TAG FORM [QUANTIZE]
  local name=$1 tag=$2 form=$3 q=${4:-}
  echo "== $(date -u +%T) $name $tag form=$form, load $(cut -d' ' -f1-3 /proc/loadavg)"
  env FORKSCORE_CPU_ATTENTION="form=$form" FORKSCORE_BENCH_MODEL="$MODEL" FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
    FORKSCORE_BENCH_REPEATS=3 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT="$OUT/$name-$tag" \
    FORKSCORE_BENCH_PROFILE=1 FORKSCORE_BENCH_DUMP="$OUT/dump-$name-$tag.json" ${q:+FORKSCORE_BENCH_QUANTIZE=$q} \
    cargo bench -q -p forkscore-benches --bench modes 2>&1 | grep -v "^$" | tail -3
}
i=0
for form in products auto auto products; do
  i=$((i+1)); one f32 "$form-$i" $form; one q8_0 "$form-$i" $form q8_0
done
"$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32-auto-2.json" --model "$MODEL" --out "$OUT/peer.json" \
  --label cpu --device cpu --dtype float32 --repeats 3 --budget-s 20 --modes prefill,prefix_batched
