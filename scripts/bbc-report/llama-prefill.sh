#!/usr/bin/env bash
# llama.cpp as the speed peer of the real-data report: its prefill of N prompt tokens on the
# same GGUF file and cores, beside one forkscore decision on a prompt of N prefix tokens.
#
#   scripts/bbc-report/llama-prefill.sh MODEL.gguf TOKENS [THREADS] > llama-bench.jsonl
#
# llama-bench (built by scripts/cpu-real/llama-build.sh) times a prefill of TOKENS tokens
# (`-p TOKENS -n 0`, its own token ids: the cost does not depend on which ids), median of
# REPEATS (5) runs, one JSON line. Env: LLAMA_DIR (/tmp/llama-peer), LLAMA_VERSION, PYTHON,
# LLAMA_AVX512=1 (the AVX-512 build without AMX; see llama-build.sh).
set -euo pipefail
MODEL=${1:?usage: llama-prefill.sh MODEL.gguf TOKENS [THREADS]}
TOKENS=${2:?usage: llama-prefill.sh MODEL.gguf TOKENS [THREADS]}
THREADS=${3:-2}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_VERSION:-11434.0.0}
L=${LLAMA_DIR:-/tmp/llama-peer}
source "$REPO/scripts/cpu-real/llama-build.sh" >&2
"$LLAMA_BIN/llama-bench" -m "$MODEL" -p "$TOKENS" -n 0 -t "$THREADS" -r "${REPEATS:-5}" -o jsonl
