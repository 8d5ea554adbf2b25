#!/usr/bin/env bash
# forkscore's f32 parallel mode and transformers' prefix-batched scoring, alternating in one
# window (forkscore, transformers, forkscore, ...), so a drift of the machine's speed falls on
# both: the ratio of each round's pair is the comparison (run.sh runs each side once, minutes
# apart, and the ratio then moves with the drift).
#
#   PYTHON=… MODEL_DIR=… bash scripts/cpu-real/alternate.sh DUMP OUTDIR
#
# DUMP: a modes-bench dump of the same model (e.g. run.sh's OUTDIR/dump-f32.json): its 8- and
# 28-field cases give transformers the same token ids. Env: PYTHON (python3, with torch and
# transformers), MODEL_DIR (the folder holding qwen25-0.5b), ROUNDS (3), FIELDS (8,28).
# Out: OUTDIR/{alternating.txt, f-<round>/modes.json, t-<round>.json}.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
DUMP=${1:?usage: alternate.sh DUMP OUTDIR}
OUT=${2:?usage: alternate.sh DUMP OUTDIR}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL_DIR:?set MODEL_DIR}/qwen25-0.5b
ROUNDS=${ROUNDS:-3}
FIELDS=${FIELDS:-8,28}
mkdir -p "$OUT"
export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
exe=$(cargo bench -p forkscore-benches --bench modes --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="modes": print(m["executable"])')
python3 -c "
import json,sys
d=json.load(open('$DUMP')); keep={int(f) for f in '$FIELDS'.split(',')}
d['cases']=[c for c in d['cases'] if c['fields'] in keep]
json.dump(d,open('$OUT/dump.json','w'))"
for i in $(seq 1 "$ROUNDS"); do
  FORKSCORE_BENCH_MODEL="$MODEL" FORKSCORE_BENCH_FIELDS="$FIELDS" FORKSCORE_BENCH_WORDS=80 \
    FORKSCORE_BENCH_REPEATS=3 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT="$OUT/f-$i" \
    "$exe" --bench > "$OUT/f-$i.log" 2>&1
  "$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump.json" --model "$MODEL" --out "$OUT/t-$i.json" \
    --label cpu --device cpu --dtype float32 --repeats 3 --budget-s 20 --modes prefix_batched \
    > "$OUT/t-$i.log" 2>&1
  python3 -c "
import json
f=json.load(open('$OUT/f-$i/modes.json'))['rows']; t=json.load(open('$OUT/t-$i.json'))['cases']
for r,c in zip(f,t):
    a,b=r['parallel_ms'],c['modes']['prefix_batched']['ms']
    print(f'round $i, {r[\"fields\"]} fields: forkscore {a:,.0f} ms, transformers {b:,.0f} ms, {b/a:.2f}x')" | tee -a "$OUT/alternating.txt"
done
