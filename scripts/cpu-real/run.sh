#!/usr/bin/env bash
# The CPU bench in one command: forkscore (f32, q8_0, q4k, bf16 weights, bf16), transformers and llama.cpp
# (F32 and Q8_0 GGUF) on the same seeded Qwen2.5-0.5B-Instruct-shaped checkpoint and the same
# token ids, in one run.
#
#   PYTHON=/path/to/python-with-torch-and-transformers bash scripts/cpu-real/run.sh OUTDIR
#
# Writes OUTDIR/{modes-*.json, dump-*.json, peer*.json, llama-*.json, llama-bench.jsonl,
# gemm_peak.json, qmatmul.json, report.md, report.json, run.log}. Env: MODEL_DIR (default
# OUTDIR/ckpt; the checkpoint is written there once), WORDS (context words, default 80 -> a
# ~480-token prefix at 8 fields), REPEATS (3), SKIP_LLAMA=1 (no llama.cpp peer; see
# scripts/cpu-real/llama.sh for its own knobs, e.g. LLAMA_DIR where its build is kept),
# F32_ONLY=1 (f32 only: no q8_0 / q4k / bf16 / independent runs, llama.cpp F32 only; ~12 min
# instead of ~30 — for a change that touches the f32 path alone), FEATURES (cargo features of
# the forkscore build, e.g. `openblas`: f32 linear layers through the system OpenBLAS).
set -euo pipefail
OUT=${1:?usage: run.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
WORDS=${WORDS:-80}
REPEATS=${REPEATS:-3}
MODEL_DIR=${MODEL_DIR:-$OUT/ckpt}
exec > >(tee -a "$OUT/run.log") 2>&1
cd "$REPO"
echo "== $(date -u +%FT%TZ) commit $(git rev-parse HEAD 2>/dev/null || echo unknown), $(nproc) cores, features: ${FEATURES:-none}, load: $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. the seeded checkpoint (transformers' own init under torch.manual_seed(0), f32)
if [ ! -f "$MODEL_DIR/qwen25-0.5b/.done" ]; then
  "$PYTHON" scripts/gpu-real/write_checkpoints.py "$MODEL_DIR" --models qwen25-0.5b --device cpu --dtype float32
fi
CKPT=$MODEL_DIR/qwen25-0.5b

# 2. build once, then time each configuration
FEAT=(${FEATURES:+--features "$FEATURES"})
cargo bench -p forkscore-benches "${FEAT[@]}" --bench modes --no-run
cargo bench -p forkscore-benches "${FEAT[@]}" --bench qmatmul --no-run
bench() { # NAME FIELDS MODES [QUANTIZE]
  local name=$1 fields=$2 modes=$3 q=${4:-}
  echo "== forkscore $name: fields $fields, modes $modes, quantize ${q:-none}"
  env FORKSCORE_BENCH_MODEL="$CKPT" FORKSCORE_BENCH_FIELDS="$fields" FORKSCORE_BENCH_WORDS="$WORDS" \
    FORKSCORE_BENCH_REPEATS="$REPEATS" FORKSCORE_BENCH_MODES="$modes" FORKSCORE_BENCH_OUT="$OUT/$name" \
    FORKSCORE_BENCH_DUMP="$OUT/dump-$name.json" FORKSCORE_BENCH_PROFILE=1 \
    ${q:+FORKSCORE_BENCH_QUANTIZE=$q} cargo bench -p forkscore-benches "${FEAT[@]}" --bench modes
  mv "$OUT/$name/modes.json" "$OUT/modes-$name.json" && rmdir "$OUT/$name"
}
bench f32 3,8,28 parallel,cached-serial
"$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32.json" --model "$CKPT" --out "$OUT/peer.json" \
  --label cpu --device cpu --dtype float32 --repeats "$REPEATS" --budget-s 20 \
  --modes prefill,cached_serial,prefix_batched
# full prompts as one padded batch (what a transformers user without a cache writes): one run
# each, and only up to 8 fields (28 full prompts of ~1,000 tokens take minutes)
"$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32.json" --model "$CKPT" --out "$OUT/peer-batched.json" \
  --label cpu --device cpu --dtype float32 --repeats 1 --budget-s 1 --modes batched \
  --cases "3:$WORDS,8:$WORDS"
if [ "${F32_ONLY:-0}" != 1 ]; then
bench q8_0 8,28 parallel,cached-serial q8_0
bench q4k 8,28 parallel,cached-serial q4k
# linear weights rounded to bf16 (--quantize bf16: the AVX-512 BF16 kernel where the CPU has it)
bench bf16w 8,28 parallel,cached-serial bf16
# bf16 compute on this CPU (no native bf16 arithmetic on AVX2: measured, not assumed)
FORKSCORE_BENCH_DTYPE=bf16 bench bf16 8 parallel
# independent (one full forward per field) at 8 fields only: 8 prefills per run
REPEATS_SAVE=$REPEATS; REPEATS=1
bench f32-independent 8 independent
REPEATS=$REPEATS_SAVE
"$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32-independent.json" --model "$CKPT" \
  --out "$OUT/peer-independent.json" --label cpu --device cpu --dtype float32 --repeats 1 \
  --budget-s 1 --modes independent
fi
if [ "${SKIP_LLAMA:-0}" != 1 ]; then
  TYPES=$([ "${F32_ONLY:-0}" = 1 ] && echo f32 || echo "f32 q8_0")
  PYTHON="$PYTHON" CKPT="$CKPT" DUMP="$OUT/dump-f32.json" REPEATS="$REPEATS" TYPES="$TYPES" \
    bash scripts/cpu-real/llama.sh "$OUT"
fi
"$PYTHON" scripts/cpu-real/gemm_peak.py --out "$OUT/gemm_peak.json"
FORKSCORE_BENCH_OUT="$OUT" cargo bench -p forkscore-benches "${FEAT[@]}" --bench qmatmul
"$PYTHON" scripts/cpu-real/report.py "$OUT"
echo "== $(date -u +%FT%TZ) done, load: $(cut -d' ' -f1-3 /proc/loadavg)"
