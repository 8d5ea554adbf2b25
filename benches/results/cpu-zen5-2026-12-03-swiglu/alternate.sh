#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/../../.."
cargo bench -p forkscore-benches --bench modes --no-run
OUT=$1; mkdir -p $OUT
exe=target/release/deps/$(ls -t target/release/deps/ | grep -E '^modes-[0-9a-f]+$' | head -1)
export RAYON_NUM_THREADS=2
for i in 1 2; do
  for cfg in "avx512:tiles" "avx512:stacked" "avxvnni:tiles" "avxvnni:stacked"; do
    isa=${cfg%%:*}; mlp=${cfg#*:}
    name=r$i-$isa-$mlp
    env FORKSCORE_CPU_ISA=$isa FORKSCORE_MLP=$mlp FORKSCORE_BENCH_QUANTIZE=${Q:-q8_0} FORKSCORE_BENCH_MODEL=${MODEL_DIR:?}/qwen25-0.5b FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
      FORKSCORE_BENCH_REPEATS=3 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT=$OUT/$name $exe --bench > $OUT/$name.log 2>&1
    python3 -c "
import json; m=json.load(open('$OUT/$name/modes.json'))
print('$name', m.get('cpu_kernel_isa'), [(r['fields'], round(r['parallel_ms'])) for r in m['rows']])"
  done
done
