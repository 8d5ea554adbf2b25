#!/usr/bin/env bash
# The CPU table of every precision in one command: forkscore f32, `--quantize bf16`,
# `--dtype bf16` (runs as `--quantize bf16` where the CPU has AMX or AVX-512 BF16),
# `--quantize q8_0` and `--quantize int8` (AMX-INT8 CPUs only: elsewhere its load is refused
# and the run stops there) against transformers f32 and bf16 (prefill alone and the prefix-batched
# decision) on a seeded Qwen2.5-0.5B-Instruct-shaped checkpoint and the same token ids, at 8 and
# 28 fields, pinned to two cores, in one run; plus each forkscore configuration's peak RSS, its
# labels and max |Δp| against our f32, and torch's f32 and bf16 matmul rates for the FLOP floor.
#
#   PYTHON=/path/to/python-with-torch-and-transformers bash scripts/cpu-real/precision.sh OUTDIR
#
# Env: MODEL_DIR (default OUTDIR/ckpt; the checkpoint is written there once), CORES (default
# 0,1: taskset list; the thread counts follow it), WORDS (80: a ~480-token prefix at 8 fields),
# REPEATS (3), FIELDS (8,28), ISA (avx2 | avxvnni: caps both sides at that instruction level —
# forkscore's FORKSCORE_CPU_ISA, which also keeps the AMX tiles out; oneDNN's ONEDNN_MAX_CPU_ISA,
# MKL's MKL_ENABLE_INSTRUCTIONS (torch's f32 GEMM) and ATen's ATEN_CPU_CAPABILITY — standing for a
# laptop-class CPU on this one; a scheme without a kernel at that level is refused and its row
# stays empty), PEER_DTYPES (transformers' precisions, default "float32 bfloat16"). Writes OUTDIR/{modes-*.json, dump-*.json, rss-*.txt, peer-*.json,
# peak-*.json, precision.md, precision.json, run.log}.
set -euo pipefail
OUT=${1:?usage: precision.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
WORDS=${WORDS:-80}
REPEATS=${REPEATS:-3}
FIELDS=${FIELDS:-8,28}
CORES=${CORES:-0,1}
NCORES=$(awk -F, '{print NF}' <<<"$CORES")
MODEL_DIR=${MODEL_DIR:-$OUT/ckpt}
export RAYON_NUM_THREADS=$NCORES OMP_NUM_THREADS=$NCORES MKL_NUM_THREADS=$NCORES
case "${ISA:-}" in
  "") ;;
  avx2) export FORKSCORE_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  avxvnni) export FORKSCORE_CPU_ISA=avxvnni ONEDNN_MAX_CPU_ISA=AVX2_VNNI ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2_E1 ;;
  *) echo "ISA=$ISA: expected avx2 or avxvnni" >&2; exit 2 ;;
esac
exec > >(tee -a "$OUT/run.log") 2>&1
cd "$REPO"
echo "== $(date -u +%FT%TZ) commit $(git rev-parse HEAD 2>/dev/null || echo unknown), cores $CORES, ISA cap ${ISA:-none}, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"

if [ ! -f "$MODEL_DIR/qwen25-0.5b/.done" ]; then
  "$PYTHON" scripts/gpu-real/write_checkpoints.py "$MODEL_DIR" --models qwen25-0.5b --device cpu --dtype float32
fi
CKPT=$MODEL_DIR/qwen25-0.5b

cargo bench -p forkscore-benches --bench modes --no-run
BENCH=$(cargo bench -p forkscore-benches --bench modes --no-run --message-format=json 2>/dev/null \
  | "$PYTHON" -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "modes":
        print(m["executable"])' | tail -1)
scheme() { # NAME [ENV...]
  local name=$1; shift
  echo "== forkscore $name"
  env "$@" FORKSCORE_BENCH_MODEL="$CKPT" FORKSCORE_BENCH_FIELDS="$FIELDS" FORKSCORE_BENCH_WORDS="$WORDS" \
    FORKSCORE_BENCH_REPEATS="$REPEATS" FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT="$OUT/$name" \
    FORKSCORE_BENCH_DUMP="$OUT/dump-$name.json" \
    /usr/bin/time -f %M -o "$OUT/rss-$name.txt" taskset -c "$CORES" "$BENCH" --bench \
    || { echo "== forkscore $name: refused or failed here (row left empty)"; rm -f "$OUT/rss-$name.txt"; return 0; }
  mv "$OUT/$name/modes.json" "$OUT/modes-$name.json" && rmdir "$OUT/$name"
}
scheme f32
scheme bf16 FORKSCORE_BENCH_QUANTIZE=bf16
scheme dtype-bf16 FORKSCORE_BENCH_DTYPE=bf16
scheme q8_0 FORKSCORE_BENCH_QUANTIZE=q8_0
scheme int8 FORKSCORE_BENCH_QUANTIZE=int8
for dt in ${PEER_DTYPES:-float32 bfloat16}; do
  echo "== transformers $dt"
  taskset -c "$CORES" "$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32.json" --model "$CKPT" \
    --out "$OUT/peer-$dt.json" --label cpu --device cpu --dtype "$dt" --repeats "$REPEATS" \
    --budget-s 30 --modes prefill,prefix_batched
  taskset -c "$CORES" "$PYTHON" scripts/cpu-real/gemm_peak.py --dtype "$dt" --out "$OUT/peak-$dt.json"
done
"$PYTHON" scripts/cpu-real/precision_report.py "$OUT"
