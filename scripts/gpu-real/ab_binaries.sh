#!/usr/bin/env bash
# Two builds of forkscore (or one build under two settings) on the same grouped batch job, in
# ABBA order, in ONE call on the GPU machine: the ratio of a change measured side by side (a
# drift of the machine falls on both), and whether the two give the same decisions.
#   OUT=… [ROUNDS=2] [CONTEXTS=256] [MODEL=qwen35-4b] [A_ENV=FORKSCORE_…=…] bash scripts/gpu-real/ab_binaries.sh
# Needs carry/{forkscore.xz (B, this build), run.sh} from scripts/build-cuda.sh and either
# carry/forkscore-base.xz (A, the base build: copy the base's forkscore.xz there before building
# the change) or A_ENV (A = this build under that dev switch). Prints prefix tokens/s (the job's
# own timing) per run, the mean ratio B ÷ A and the count of records whose decisions differ.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
S=scripts/gpu-real
W=/tmp/gpu-ab
MODEL="${MODEL:-qwen35-4b}"
mkdir -p "$W/a" "$W/b" "$W/ckpt"
for side in a b; do
  src=carry/forkscore.xz; [[ $side == a && -z "${A_ENV:-}" ]] && src=carry/forkscore-base.xz
  python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    "$src" "$W/$side/forkscore"
  chmod +x "$W/$side/forkscore"
done
[[ -d /tmp/gpu-tput/ckpt/$MODEL ]] && W_CK=/tmp/gpu-tput/ckpt || {
  W_CK=$W/ckpt
  timeout 150 python3 $S/write_checkpoints.py "$W_CK" --models "$MODEL" --device cuda --dtype bfloat16 \
    > "$OUT/write.log" 2>&1 || { echo "write_checkpoints FAILED"; tail -5 "$OUT/write.log"; }
}
run() { # side round
  local envs=(); [[ $1 == a && -n "${A_ENV:-}" ]] && envs=("$A_ENV")
  env "${envs[@]}" timeout 120 python3 $S/batch_case.py --forkscore "carry/run.sh $W/$1/forkscore" --model "$W_CK/$MODEL" \
    --device cuda --dtype bf16 --out "$OUT/ab-$1-$2.json" --contexts "${CONTEXTS:-256}" --fields 8 \
    --tokens 830 --timeout-s 100 --work "$W/work-$1" --modes grouped > "$OUT/ab-$1-$2.log" 2>&1
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["modes"]["grouped"]["prefix_tokens_per_s_job"])' \
    "$OUT/ab-$1-$2.json" 2>/dev/null || echo nan
}
echo "side round prefix_tokens_per_s" > "$OUT/ab.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in a b b a; do
    echo "$side $r $(run $side $r)" | tee -a "$OUT/ab.txt"
  done
done
python3 - "$OUT/ab.txt" <<'PY'
import sys, statistics as st
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[1:]]
v = {s: [float(x) for side, _, x in rows if side == s and x != "nan"] for s in "ab"}
if v["a"] and v["b"]:
    print(f"A (base) mean {st.mean(v['a']):,.0f}, B (change) mean {st.mean(v['b']):,.0f} prefix tokens/s: B ÷ A = {st.mean(v['b']) / st.mean(v['a']):.3f}")
PY
python3 - "$W/work-a/out-grouped.jsonl" "$W/work-b/out-grouped.jsonl" <<'PY'
import json, sys
def clean(o):  # the decisions only: no provenance, timings or commit
    if isinstance(o, dict):
        return {k: clean(v) for k, v in o.items()
                if not any(s in k for s in ("provenance", "telemetry", "timing", "elapsed", "ms", "commit"))}
    return [clean(v) for v in o] if isinstance(o, list) else o
a, b = ([clean(json.loads(l)) for l in open(f)] for f in sys.argv[1:3])
print(f"records {len(a)} / {len(b)}; records whose decisions differ: {sum(x != y for x, y in zip(a, b))}")
PY
