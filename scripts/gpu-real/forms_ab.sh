#!/usr/bin/env bash
# Opt-in CUDA forms against the default, ONE build, ONE call on the GPU machine: each side of
# SIDES is the same binaries under its own FORKSCORE_* switches (ENV_<side>), measured
# back to back on the same seeded Qwen3.5-4B and Qwen2.5-1.5B checkpoints:
#   0. the GPU conformance tests (carry/gpu-tests.xz; they call every form on tiny models
#      against the CPU f32 reference), unless SKIP_TESTS=1;
#   1. per side and model: the modes bench's single decisions (parallel, BENCH_FIELDS fields,
#      BENCH_WORDS-word contexts, BENCH_REPEATS repeats, no profile), and the candidate logits
#      it dumps compared with the first side's (largest |difference|, changed argmaxes);
#      (SKIP_BENCH=1 leaves the benches out);
#   2. per side of SERVE_SIDES (default SIDES) and model, unless SKIP_SERVE=1: `forkscore serve` at CLIENTS closed-loop clients
#      for LOAD_S seconds (serve_load.py, the fields-first layout as in the reports).
# Run from the repository root:
#   OUT=… SIDES="default qkv gdn both" ENV_qkv="FORKSCORE_QKV_HEADS=fused" \
#     ENV_gdn="FORKSCORE_GDN_PROJ=stacked" ENV_both="FORKSCORE_QKV_HEADS=fused FORKSCORE_GDN_PROJ=stacked" \
#     bash scripts/gpu-real/forms_ab.sh
# Needs carry/{forkscore.xz,modes-bench.xz,run.sh} (scripts/build-cuda.sh).
# Output ($OUT): run.log, forms.json (every side's figures), bench-<side>-<model>.json,
# load-<side>-<model>.json (the load generator's own report, token counts included).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
T0=$(date +%s)
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
S=scripts/gpu-real
B=/tmp/forkscore-bin
W=/tmp/forms-ab
MODELS="${MODELS:-qwen35-4b,qwen25-1.5b}"
SIDES="${SIDES:-default qkv gdn both}"
mkdir -p "$B" "$W/ckpt"
unxz() { python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' "$1" "$2"; chmod +x "$2"; }
cp -f carry/run.sh "$B/"
pids=()
for n in forkscore modes-bench gpu-tests; do
  if [[ -f carry/$n.xz && ! -x $B/$n ]]; then unxz carry/$n.xz "$B/$n" & pids+=($!); fi
done
# (a bare `wait` would also wait for the tee above, forever)
(( ${#pids[@]} )) && wait "${pids[@]}"
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) commit ${COMMIT:-unknown}"

if [[ -x $B/gpu-tests && -z "${SKIP_TESTS:-}" ]]; then
  say "GPU conformance tests"
  timeout "${TESTS_TIMEOUT:-240}" "$B/run.sh" "$B/gpu-tests" --test-threads 1 > "$W/gpu-tests.log" 2>&1
  echo "gpu-tests exit $?: $(grep -c ' ok$' "$W/gpu-tests.log") ok"
  grep -E "^test .*(FAILED|ignored)|test result|panicked" "$W/gpu-tests.log" | head -20
fi

say "checkpoints"
for m in ${MODELS//,/ }; do
  [[ -f $W/ckpt/$m/.done ]] || timeout 150 python3 $S/write_checkpoints.py "$W/ckpt" --models "$m" \
    --device cuda --dtype bfloat16 > /dev/null 2>&1 && touch "$W/ckpt/$m/.done"
  ls "$W/ckpt/$m" > /dev/null || echo "checkpoint $m FAILED"
done

for side in $SIDES; do
  envv=ENV_$side
  for m in ${MODELS//,/ }; do
    [[ -n "${SKIP_BENCH:-}" ]] && break
    say "bench $side $m (${!envv:-no switches})"
    env ${!envv:-} FORKSCORE_BENCH_PROFILE=0 FORKSCORE_BENCH_MODEL="$W/ckpt/$m" FORKSCORE_BENCH_DEVICE=cuda \
      FORKSCORE_BENCH_DTYPE=bf16 FORKSCORE_BENCH_REPEATS="${BENCH_REPEATS:-7}" FORKSCORE_BENCH_OUT="$W/bench-$side-$m" \
      FORKSCORE_BENCH_DUMP="$W/dump-$side-$m.json" FORKSCORE_BENCH_MODES=parallel \
      FORKSCORE_BENCH_FIELDS="${BENCH_FIELDS:-8,28}" FORKSCORE_BENCH_WORDS="${BENCH_WORDS:-600}" \
      timeout 120 "$B/run.sh" "$B/modes-bench" > "$W/bench-$side-$m.log" 2>&1 || echo "bench $side $m FAILED"
    cp -f "$W/bench-$side-$m/modes.json" "$OUT/bench-$side-$m.json" 2>/dev/null
  done
  if [[ -z "${SKIP_SERVE:-}" && " ${SERVE_SIDES:-$SIDES} " == *" $side "* ]]; then
    port=18180
    for m in ${MODELS//,/ }; do
      port=$((port + 1))
      say "serve $side $m"
      env ${!envv:-} "$B/run.sh" "$B/forkscore" serve --model "$W/ckpt/$m" --revision bench --device cuda --dtype bf16 \
        --port "$port" --queue-capacity 4096 > "$W/serve-$side-$m.log" 2>&1 &
      spid=$!
      timeout 120 python3 $S/serve_load.py --url "http://127.0.0.1:$port" --model "$W/ckpt/$m" \
        --clients "${CLIENTS:-64}" --duration-s "${LOAD_S:-6}" --ready-s 45 --words "${WORDS:-150:250}" \
        --options '{"layout": "fields-first"}' --label "$side-$m" --out "$W/load-$side-$m.json" \
        > "$W/load-$side-$m.log" 2>&1 || { echo "serve $side $m FAILED"; tail -5 "$W/load-$side-$m.log"; }
      kill -TERM "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
      cp -f "$W/load-$side-$m.json" "$OUT/" 2>/dev/null
    done
  fi
done

say "summary"
python3 - "$W" "$OUT/forms.json" $SIDES <<'PY'
import json, os, sys
w, out, sides = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
res = {}
for m in os.environ.get("MODELS", "qwen35-4b,qwen25-1.5b").split(","):
    base = load(f"{w}/dump-{sides[0]}-{m}.json")
    for s in sides:
        b = load(f"{w}/bench-{s}-{m}/modes.json") or {}
        rows = [(r.get("fields"), r.get("prefix_tokens"), r.get("parallel_ms")) for r in b.get("rows", [])]
        d = load(f"{w}/dump-{s}-{m}.json")
        diff, changed = None, None
        if base and d and s != sides[0]:
            diff, changed = 0.0, 0
            for cb, cd in zip(base.get("cases", []), d.get("cases", [])):
                for rb, rd in zip(cb.get("rows", []), cd.get("rows", [])):
                    lb, ld = rb.get("logits", []), rd.get("logits", [])
                    diff = max([diff] + [abs(x - y) for x, y in zip(lb, ld)])
                    changed += int(rb.get("argmax_code_id") != rd.get("argmax_code_id"))
        l = load(f"{w}/load-{s}-{m}.json") or {}
        load_rows = [(r.get("clients"), r.get("decisions_per_s"), r.get("p50_ms"), r.get("p99_ms"), r.get("errors")) for r in l.get("rows", [])]
        res[f"{s}/{m}"] = {"single": rows, "max_logit_diff_vs_first": diff, "argmax_changed_vs_first": changed, "serve": load_rows}
        print(s, m, "single (fields, prefix, ms):", rows, "| max|dlogit| vs", sides[0], diff, "changed", changed, "| serve:", load_rows)
json.dump(res, open(out, "w"), indent=1)
PY
say "done"
