#!/usr/bin/env bash
# Every CPU precision on trained weights: the same labelled items scored by one forkscore binary
# in f32 and under each --quantize scheme, code-letter and literal scoring, then each scheme's
# labels and probabilities compared with f32's, item by item (precision.sh does the same on a
# seeded checkpoint, where probabilities mean nothing).
#
#   BIN=target/release/forkscore MODEL=/path/to/checkpoint-folder DATA=/path/to/bbc-data \
#     bash scripts/cpu-real/real_fidelity.sh OUTDIR
#
# MODEL: a checkpoint folder (e.g. a real GGUF dequantized to F16 by
# scripts/bbc-report/gguf_to_folder.py) or a GGUF file. DATA: a folder with all.jsonl and
# schema.json (scripts/bbc-report/prepare.py). SCHEMES (default "bf16 q8_0 int8"; a scheme this
# CPU refuses is skipped), CORES (default 0,1). Writes OUTDIR/<scheme>-<scoring>.{jsonl,report.json}
# and OUTDIR/fidelity.md (labels equal to f32, max |Δp|, accuracy, wall seconds, peak RSS).
set -euo pipefail
OUT=${1:?usage: real_fidelity.sh OUTDIR}
BIN=${BIN:?set BIN to a forkscore binary}
MODEL=${MODEL:?set MODEL to a checkpoint folder or GGUF file}
DATA=${DATA:?set DATA to a folder with all.jsonl and schema.json}
CORES=${CORES:-0,1}
mkdir -p "$OUT"
for scheme in f32 ${SCHEMES:-bf16 q8_0 int8}; do
  q=(); [ "$scheme" = f32 ] || q=(--quantize "$scheme")
  for scoring in code literal; do
    s=(); [ "$scoring" = literal ] && s=(--scoring literal)
    name=$scheme-$scoring
    if ! /usr/bin/time -f "%e %M" -o "$OUT/$name.time" taskset -c "$CORES" "$BIN" eval \
      --model "$MODEL" --revision fidelity "${q[@]}" "${s[@]}" --schema-file "$DATA/schema.json" \
      --input "$DATA/all.jsonl" --predictions "$OUT/$name.jsonl" --report "$OUT/$name.report.json" \
      --quiet --force > "$OUT/$name.txt" 2> "$OUT/$name.err"; then
      echo "== $name: refused or failed (see $OUT/$name.err)"; rm -f "$OUT/$name.time"
    fi
  done
done
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]

def decisions(path):
    d = {}
    for line in open(path):
        r = json.loads(line)
        for name, f in r.get("fields", {}).items():
            d[(r["id"], name)] = (f["value"], f["scores"])
    return d

rows = ["| scheme, scoring | labels equal to f32 | max \\|Δp\\| | accuracy | wall s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|"]
for scoring in ["code", "literal"]:
    ref_path = f"{out}/f32-{scoring}.jsonl"
    if not os.path.exists(ref_path):
        continue
    ref = decisions(ref_path)
    for scheme in ["f32"] + os.environ.get("SCHEMES", "bf16 q8_0 int8").split():
        path = f"{out}/{scheme}-{scoring}.jsonl"
        if not os.path.exists(f"{out}/{scheme}-{scoring}.time"):
            continue
        got = decisions(path)
        same = sum(got[k][0] == ref[k][0] for k in ref if k in got)
        dp = max((abs(got[k][1][c] - ref[k][1][c]) for k in ref if k in got for c in ref[k][1]), default=0.0)
        rep = json.load(open(f"{out}/{scheme}-{scoring}.report.json"))
        acc = "; ".join(f"{f['accuracy']:.2f}" for f in rep["fields"].values())
        wall, rss = open(f"{out}/{scheme}-{scoring}.time").read().split()
        rows.append(f"| {scheme}, {scoring} | {same}/{len(ref)} | {dp:.4f} | {acc} | {float(wall):.1f} | {int(rss) // 1024:,} |")
open(f"{out}/fidelity.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
