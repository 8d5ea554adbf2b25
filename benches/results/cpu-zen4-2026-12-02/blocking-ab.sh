#!/usr/bin/env bash
# /tmp/modes-ab: a copy of the modes bench binary (`cargo bench -p forkscore-benches --bench modes --no-run`)
O=/work/main/benches/results/cpu-zen4-2026-12-02/blocking-ab.txt
echo "# Zen 4, 2 cores: AVX-512 f32 kernel, default blocking (mr=6,kc=256,mc=72) vs mr=14,kc=384,mc=84, ABBA, parallel mode, 80 words, REPEATS=2" > $O
for r in def-1 m14-1 m14-2 def-2; do
  B=""; [ "${r%-*}" = m14 ] && B="mr=14,kc=384,mc=84"
  FORKSCORE_CPU_GEMM_BLOCKING=$B RAYON_NUM_THREADS=2 FORKSCORE_BENCH_MODEL=/work/cpu-real/qwen25-0.5b FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
  FORKSCORE_BENCH_REPEATS=2 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT=/tmp/zab-$r /tmp/modes-ab --bench 2>&1 | grep -E "^ +(8|28) " | sed "s/^/$r /" | cut -c1-40 >> $O
done
echo done >> $O
