#!/usr/bin/env bash
# On a GPU machine: forkscore batch grouped (decide_many) vs direct on a bench-size seeded model.
set -uo pipefail
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec > >(tee "$OUT/batch.log") 2>&1
B=/tmp/fsbin; mkdir -p $B; cp -f $C/run.sh $B/
for n in forkscore modes-bench; do python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' $C/$n.xz $B/$n; chmod +x $B/$n; done
# 1. write the bench-size model (hidden 1024, 8 layers) via one quick bench pass
FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=bf16 FORKSCORE_BENCH_HIDDEN=1024 FORKSCORE_BENCH_LAYERS=8 \
FORKSCORE_BENCH_HEADS=16 FORKSCORE_BENCH_KV_HEADS=4 FORKSCORE_BENCH_REPEATS=1 FORKSCORE_BENCH_OUT=/tmp/b \
  timeout 150 $B/run.sh $B/modes-bench > /tmp/bench.log 2>&1; echo "bench pass exit $?"
M=/tmp/forkscore-bench-qwen25-h1024-l8-a16-kv4-i2816
ls $M || exit 1
# 2. inputs: 512 lines, varied contexts (40-400 words)
python3 - <<'PY'
import json, random
random.seed(7)
words = "customer payment outage checkout invoice refund login error latency database region enterprise contract urgent broken slow report security password account billing api".split()
with open('/tmp/in.jsonl','w') as f:
    for i in range(512):
        n = random.randint(40, 400)
        f.write(json.dumps({"id": f"t{i}", "context": " ".join(random.choice(words) for _ in range(n)) + "."}) + "\n")
PY
for schema in parallel_schema support_triage; do
  for dtype in bf16 f32; do
    for mode in grouped direct; do
      rm -f /tmp/out-$schema-$dtype-$mode.jsonl
      t0=$(date +%s.%N)
      $B/run.sh $B/forkscore batch --quiet --model $M --revision bench --device cuda --dtype $dtype \
        --input /tmp/in.jsonl --output /tmp/out-$schema-$dtype-$mode.jsonl --schema-file $C/$schema.json --batch-mode $mode
      echo "RESULT schema=$schema dtype=$dtype mode=$mode exit=$? wall=$(python3 -c "print(round($(date +%s.%N)-$t0,2))")s"
    done
    python3 - /tmp/out-$schema-$dtype-grouped.jsonl /tmp/out-$schema-$dtype-direct.jsonl <<'PY'
import json, sys
a=[json.loads(l) for l in open(sys.argv[1])]; b=[json.loads(l) for l in open(sys.argv[2])]
assert [x['id'] for x in a]==[x['id'] for x in b]
changed=0; maxdp=0.0; groups=set()
for x,y in zip(a,b):
    if 'error' in x or 'error' in y: print('error line', x.get('error'), y.get('error')); continue
    g=x['telemetry'].get('group') or {}; groups.add(g.get('size'))
    for k,f in x['fields'].items():
        if f['value']!=y['fields'][k]['value']: changed+=1
        for c,p in f['scores'].items(): maxdp=max(maxdp, abs(p-y['fields'][k]['scores'][c]))
print(f"COMPARE {sys.argv[1]}: lines={len(a)} changed_values={changed} max_abs_dprob={maxdp:.3g} group_sizes={sorted(s for s in groups if s)}")
PY
  done
done
echo done
