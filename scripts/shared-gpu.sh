#!/usr/bin/env bash
# On a GPU machine: GPU conformance tests with the current code, then batch shared (one context
# prefilled once, extended per question) vs direct on a bench-size seeded model.
set -uo pipefail
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec > >(tee "$OUT/shared.log") 2>&1
B=/tmp/fsbin; mkdir -p $B; cp -f $C/run.sh $B/
for n in forkscore modes-bench gpu-tests; do python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' $C/$n.xz $B/$n; chmod +x $B/$n; done
timeout 240 $B/run.sh $B/gpu-tests --test-threads=1 --nocapture > $OUT/gpu-tests.log 2>&1; echo "gpu-tests exit $?"
grep -E "^test |test result|ARGMAX" $OUT/gpu-tests.log
FORKSCORE_BENCH_DEVICE=cuda FORKSCORE_BENCH_DTYPE=bf16 FORKSCORE_BENCH_HIDDEN=1024 FORKSCORE_BENCH_LAYERS=8 \
FORKSCORE_BENCH_HEADS=16 FORKSCORE_BENCH_KV_HEADS=4 FORKSCORE_BENCH_REPEATS=1 FORKSCORE_BENCH_OUT=/tmp/b \
  timeout 150 $B/run.sh $B/modes-bench > /tmp/bench.log 2>&1; echo "bench pass exit $?"
M=/tmp/forkscore-bench-qwen25-h1024-l8-a16-kv4-i2816
python3 - <<'PY'
import json, random
random.seed(11)
w = "customer payment outage checkout invoice refund login error latency database region enterprise contract urgent broken slow report security password account billing api".split()
ctx = " ".join(random.choice(w) for _ in range(1500)) + "."
open('/tmp/ctx.txt','w').write(ctx)
qs = [f"Question {i}: is the {random.choice(w)} related to {random.choice(w)}?" for i in range(128)]
with open('/tmp/qs.jsonl','w') as f:
    for i,q in enumerate(qs): f.write(json.dumps({"id": i, "question": q})+"\n")
with open('/tmp/qd.jsonl','w') as f:
    for i,q in enumerate(qs): f.write(json.dumps({"id": i, "question": q, "context": ctx})+"\n")
PY
for dtype in bf16 f32; do
  rm -f /tmp/os-$dtype.jsonl /tmp/od-$dtype.jsonl
  t0=$(date +%s.%N); $B/run.sh $B/forkscore batch --quiet --model $M --revision bench --device cuda --dtype $dtype --input /tmp/qs.jsonl --output /tmp/os-$dtype.jsonl --batch-mode shared --context-file /tmp/ctx.txt
  echo "RESULT shared dtype=$dtype exit=$? wall=$(python3 -c "print(round($(date +%s.%N)-$t0,2))")s"
  t0=$(date +%s.%N); $B/run.sh $B/forkscore batch --quiet --model $M --revision bench --device cuda --dtype $dtype --input /tmp/qd.jsonl --output /tmp/od-$dtype.jsonl --batch-mode direct
  echo "RESULT direct dtype=$dtype exit=$? wall=$(python3 -c "print(round($(date +%s.%N)-$t0,2))")s"
  python3 - /tmp/os-$dtype.jsonl /tmp/od-$dtype.jsonl <<'PY'
import json, sys
a=[json.loads(l) for l in open(sys.argv[1])]; b=[json.loads(l) for l in open(sys.argv[2])]
errs=[x for x in a+b if 'error' in x]
if errs: print('ERRORS', errs[:2]); sys.exit()
ch=sum(x['output']!=y['output'] for x,y in zip(a,b))
md=max(abs(x['fields']['answer']['scores'][k]-y['fields']['answer']['scores'][k]) for x,y in zip(a,b) for k in ('true','false'))
print(f"COMPARE {sys.argv[1]}: lines={len(a)} prefix={a[0]['telemetry']['prefix_tokens']} reused={a[0]['telemetry'].get('reused_prefix_tokens')} changed={ch} max_dp={md:.3g}")
PY
done
echo done
