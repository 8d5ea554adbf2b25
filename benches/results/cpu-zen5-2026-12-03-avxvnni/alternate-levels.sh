#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/../../.."
OUT=${1:?usage: alternate-levels.sh OUTDIR (MODEL_DIR: the folder holding qwen25-0.5b)}; mkdir -p "$OUT"
cargo bench -p forkscore-benches --bench modes --no-run
exe=target/release/deps/$(ls -t target/release/deps/ | grep -E '^modes-[0-9a-f]+$' | head -1)
echo "exe $exe"
export RAYON_NUM_THREADS=2
for i in 1 2 3; do
  for cfg in "avxvnni:" "avxvnni:q8_0" "avx2:q8_0" "avxvnni:q4k" "avx2:q4k"; do
    isa=${cfg%%:*}; q=${cfg#*:}
    name=r$i-$isa-${q:-f32}
    env FORKSCORE_CPU_ISA=$isa FORKSCORE_BENCH_MODEL=${MODEL_DIR:?}/qwen25-0.5b FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
      FORKSCORE_BENCH_REPEATS=2 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT=$OUT/$name \
      ${q:+FORKSCORE_BENCH_QUANTIZE=$q} $exe --bench > $OUT/$name.log 2>&1
    python3 -c "
import json; m=json.load(open('$OUT/$name/modes.json'))
print('$name', m.get('cpu_kernel_isa'), [(r['fields'], round(r['parallel_ms'])) for r in m['rows']])"
  done
done
