#!/usr/bin/env bash
# One binary, two settings, alternating processes on the same cores (A, B, A, B, …): an A/B of a
# FORKSCORE_* switch end to end (the modes bench, parallel mode) on a CPU without a Rust
# toolchain, e.g. a remote Xeon, so a drift of its speed falls on both sides.
#
#   here:  bash scripts/cpu-real/env_ab.sh pack              # modes + cpu_linear into carry/ab/
#   there: bash scripts/cpu-real/env_ab.sh run OUTDIR "A_ENV" "B_ENV"
#          e.g. run out "FORKSCORE_CPU_GEMM_BLOCKING=pf=0" "FORKSCORE_CPU_GEMM_BLOCKING=pf=16"
#
# `run` writes the seeded Qwen2.5-0.5B-shaped checkpoint (transformers, f32), then ROUNDS (2)
# rounds of A and B at FIELDS (8,28), REPEATS (3) decisions each, and, with LINEAR (a `;`-list of
# f32 blockings for the cpu_linear bench, e.g. "pf=0;pf=16"), the kernels alone round-robin.
# Out: OUTDIR/{ab.txt, A-<round>/modes.json, B-<round>/modes.json, cpu_linear.txt}. CORES (0,1).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
case "${1:-}" in
pack)
  set -e
  mkdir -p carry/ab
  cargo bench -p forkscore-benches --bench modes --bench cpu_linear --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"] in ("modes","cpu_linear"): print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
      strip -o "/tmp/ab-$name" "$exe" && xz -T2 -6 -c "/tmp/ab-$name" > "carry/ab/$name.xz"
      echo "carry/ab/$name.xz <- $exe"
    done
  ;;
run)
  OUT=${2:?usage: env_ab.sh run OUTDIR A_ENV B_ENV}; A=${3:?A_ENV}; B=${4:?B_ENV}
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/ab.txt") 2>&1
  BIN=/tmp/ab-bin; mkdir -p "$BIN"
  for f in carry/ab/*.xz; do xz -dc "$f" > "$BIN/$(basename "$f" .xz)"; chmod +x "$BIN/$(basename "$f" .xz)"; done
  export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
  T=(taskset -c "${CORES:-0,1}")
  echo "== $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo), cores ${CORES:-0,1}; A: $A; B: $B"
  if [ -n "${LINEAR:-}" ]; then
    FORKSCORE_BENCH_BLOCKINGS="$LINEAR" FORKSCORE_BENCH_ROWS=${ROWS:-512,40} FORKSCORE_BENCH_WEIGHT_COPIES=3 \
      "${T[@]}" "$BIN/cpu_linear" --bench | tee "$OUT/cpu_linear.txt"
  fi
  python3 scripts/gpu-real/write_checkpoints.py /tmp/ckpt --models qwen25-0.5b --device cpu \
    --dtype float32 > "$OUT/ckpt.log" 2>&1 || { echo "checkpoint failed"; tail "$OUT/ckpt.log"; exit 1; }
  for i in $(seq 1 "${ROUNDS:-2}"); do
    for side in A B; do
      [ "$side" = A ] && setting=$A || setting=$B
      env $setting FORKSCORE_BENCH_MODEL=/tmp/ckpt/qwen25-0.5b FORKSCORE_BENCH_FIELDS=${FIELDS:-8,28} \
        FORKSCORE_BENCH_WORDS=80 FORKSCORE_BENCH_REPEATS=${REPEATS:-3} FORKSCORE_BENCH_MODES=parallel \
        FORKSCORE_BENCH_OUT="$OUT/$side-$i" "${T[@]}" "$BIN/modes" --bench > "$OUT/$side-$i.log" 2>&1
      python3 -c "
import json,sys
d=json.load(open('$OUT/$side-$i/modes.json'))
print('$side-$i', ' '.join(f\"{r['fields']} fields {r['parallel_ms']:.0f} ms\" for r in d['rows']))"
    done
  done
  ;;
*) echo "usage: env_ab.sh pack | run OUTDIR A_ENV B_ENV"; exit 2 ;;
esac
