#!/usr/bin/env bash
# Two builds of forkscore side by side on the GPU machine, in ONE call: for each side of SIDES
# (default "base new"), `throughput.sh` with the fields-first layout (the 4B batch job grouped vs
# direct on the first two sides, then `serve` under load on both seeded models); then the same
# 64-context grouped jobs (1.5B and 4B) through both builds, with the count of field values that
# differ and the largest difference of any reported number; then a FORKSCORE_PROFILE run of the
# new build (profile_many.sh on PROFILE_MODELS, default qwen25-1.5b) and, where nsys exists and
# SKIP_NSYS is unset, its kernel summary.
#   OUT=… [SIDES="base new"] [CLIENTS=64] [LOAD_S=5] bash scripts/gpu-real/builds_ab.sh
# Needs carry/{forkscore.xz (new), forkscore-base.xz (base), run.sh} (scripts/build-cuda.sh; copy
# the base build's forkscore.xz to forkscore-base.xz before building the change), and
# carry/gpu-tests.xz runs the GPU tests first when present (skip with SKIP_TESTS=1).
# A side may be one build under switches: BINOF_<side>=new ENV_<side>="FORKSCORE_X=y …" runs the
# new build with those variables set (e.g. SIDES="gather rows" BINOF_gather=new BINOF_rows=new
# ENV_rows="FORKSCORE_ROW_SPLIT=rows"); the decision comparison then runs base = the first side.
# SIDES="" with SKIP_CMP=1 SKIP_PROFILE=1 runs the GPU tests alone (binaries left in /tmp/bins by
# an earlier call on the same warm machine are reused).
# Output ($OUT): <side>-… JSON of each side, ab.tgz (every side's files), profile-*.txt.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
S=scripts/gpu-real
unxz() { python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2"; chmod +x "$2"; }
mkdir -p /tmp/bins/base /tmp/bins/new /tmp/forkscore-bin
[[ -f carry/forkscore-base.xz ]] && unxz carry/forkscore-base.xz /tmp/bins/base/forkscore
[[ -f carry/forkscore.xz ]] && unxz carry/forkscore.xz /tmp/bins/new/forkscore
if [[ -f carry/gpu-tests.xz && -z "${SKIP_TESTS:-}" ]]; then
  unxz carry/gpu-tests.xz /tmp/gpu-tests
  timeout 300 carry/run.sh /tmp/gpu-tests --test-threads 1 > /tmp/gpu-tests.log 2>&1
  echo "gpu-tests exit $?"; grep -E "^test |test result|panicked" /tmp/gpu-tests.log | grep -v " ok$" | head -20; grep -c " ok$" /tmp/gpu-tests.log
fi
i=0
for side in ${SIDES-base new}; do
  i=$((i+1))
  sb=1; [[ $i -le 2 ]] && sb=0
  binv=BINOF_$side envv=ENV_$side
  BIN="carry/run.sh /tmp/bins/${!binv:-$side}/forkscore" OUT=/tmp/ab/$i-$side env ${!envv:-} SKIP_BATCH=$sb BATCH_CONTEXTS=256 CLIENTS=${CLIENTS:-64} LOAD_S=${LOAD_S:-5} \
    BATCH_EXTRA="--layout fields-first" LOAD_OPTIONS='{"layout": "fields-first"}' timeout 240 bash $S/throughput.sh > /dev/null 2>&1
  echo "=== $i $side"
  python3 - /tmp/ab/$i-$side <<'PY'
import json,glob,sys
for f in sorted(glob.glob(sys.argv[1]+"/*.json")):
    d=json.load(open(f))
    if "modes" in d:
        print(f.split("/")[-1], {m:(round(e.get("prefix_tokens_per_s_job") or 0), e.get("job_s"), e.get("group_sizes")) for m,e in d["modes"].items()})
    else:
        for r in d["rows"]:
            print(r["label"], r["clients"], r["decisions_per_s"], r["p50_ms"], r["p99_ms"], r.get("mean_contexts_per_merged_call"), r.get("errors"))
PY
done
tar czf $OUT/ab.tgz -C /tmp ab 2>/dev/null
# the same 1.5B and 4B grouped jobs through both binaries: do the decisions agree?
for m in $([[ -z "${SKIP_CMP:-}" ]] && echo qwen25-1.5b qwen35-4b); do
  timeout 100 python3 $S/batch_case.py --forkscore "carry/run.sh /tmp/bins/new/forkscore" --model /tmp/gpu-tput/ckpt/$m --device cuda \
    --dtype bf16 --out /tmp/cmp-$m.json --contexts 64 --fields 8 --tokens 260 --modes grouped --timeout-s 90 --work /tmp/cmp-$m --extra "--layout fields-first" > /dev/null 2>&1
  cp /tmp/cmp-$m/out-grouped.jsonl /tmp/cmp-$m/new.jsonl
  timeout 100 carry/run.sh /tmp/bins/base/forkscore batch --model /tmp/gpu-tput/ckpt/$m --revision bench --device cuda --dtype bf16 \
    --input /tmp/cmp-$m/in.jsonl --output /tmp/cmp-$m/base.jsonl --schema-file /tmp/cmp-$m/schema.json --batch-mode grouped --quiet --layout fields-first
  python3 - /tmp/cmp-$m/base.jsonl /tmp/cmp-$m/new.jsonl <<'PY'
import json,sys
def leaves(o,p=""):
    if isinstance(o,dict):
        for k,v in o.items():
            if k in ("telemetry","provenance") or k.endswith("_ms"): continue
            yield from leaves(v,p+"/"+k)
    elif isinstance(o,list):
        for i,v in enumerate(o): yield from leaves(v,p+"/"+str(i))
    else: yield p,o
a=[json.loads(l) for l in open(sys.argv[1])]; b=[json.loads(l) for l in open(sys.argv[2])]
diff=0; dmax=0.0; vals=0; vdiff=0
for x,y in zip(a,b):
    lx=dict(leaves(x)); ly=dict(leaves(y))
    for k in lx:
        u,v=lx[k],ly.get(k)
        if isinstance(u,float) and isinstance(v,float): dmax=max(dmax,abs(u-v))
        elif u!=v and "/value" in k: vdiff+=1
        if k.endswith("/value"): vals+=1
print(sys.argv[1], "records", len(a), len(b), "values", vals, "differing values", vdiff, "max |d number|", dmax)
PY
done
cp /tmp/bins/new/forkscore /tmp/forkscore-bin/forkscore; cp carry/run.sh /tmp/forkscore-bin/
if [[ -z "${SKIP_PROFILE:-}" ]]; then
mkdir -p /tmp/prof
CKPT=/tmp/gpu-tput/ckpt MODELS=${PROFILE_MODELS:-qwen25-1.5b} CONTEXTS=128 TOKENS=260 BATCH_FLAGS="--layout fields-first" OUT=/tmp/prof \
  timeout 200 bash $S/profile_many.sh > /dev/null 2>&1
for f in /tmp/prof/profile-*.txt; do cp "$f" "$OUT/"; echo "--- $f"; grep -v "^$" "$f" | tail -30; done
for f in /tmp/prof/batch-*.json; do python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], {m:(round(e.get("prefix_tokens_per_s_job") or 0), e.get("job_s")) for m,e in d["modes"].items()})' $f; done
fi
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "NSYS=$NSYS"
if [[ -n "$NSYS" && -z "${SKIP_NSYS:-}" ]]; then
  timeout 90 $NSYS profile -o /tmp/rep --force-overwrite true -t cuda carry/run.sh /tmp/bins/new/forkscore batch --model /tmp/gpu-tput/ckpt/qwen25-1.5b --revision bench --device cuda --dtype bf16 \
    --input /tmp/profile-qwen25-1.5b/in.jsonl --output /tmp/nsys.jsonl --schema-file /tmp/profile-qwen25-1.5b/schema.json --batch-mode grouped --quiet --layout fields-first > /tmp/nsys.log 2>&1; tail -3 /tmp/nsys.log
  timeout 100 $NSYS stats -r cuda_gpu_kern_sum,cuda_api_sum --format csv -o /tmp/st /tmp/rep.nsys-rep > /dev/null 2>&1
  for f in /tmp/st*.csv; do cp $f $OUT/; echo "--- $f"; head -25 $f | cut -c1-200; done
fi
