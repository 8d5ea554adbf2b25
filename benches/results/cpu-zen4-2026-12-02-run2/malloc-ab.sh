#!/usr/bin/env bash
# /tmp/modes-ab: a copy of the modes bench binary (`cargo bench -p forkscore-benches --bench modes --no-run`)
# page faults and time: default malloc vs no-trim/no-mmap tunables, ABBA
O=/work/main/benches/results/cpu-zen4-2026-12-02-run2/malloc-ab.txt
echo "# Zen 4, f32 parallel, 8 and 28 fields, 80 words, REPEATS=2; A = default glibc malloc, B = GLIBC_TUNABLES mmap_threshold=1 GiB, trim_threshold=4 GiB (freed blocks stay in the heap); minor page faults of the whole process from /usr/bin/time" > $O
for r in A-1 B-1 B-2 A-2; do
  T=""; [ "${r%-*}" = B ] && T="glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"
  GLIBC_TUNABLES=$T RAYON_NUM_THREADS=2 FORKSCORE_BENCH_MODEL=/work/cpu-real/qwen25-0.5b FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
  FORKSCORE_BENCH_REPEATS=2 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT=/tmp/pf-$r /usr/bin/time -f "$r minor-faults %R wall %e s" /tmp/modes-ab --bench 2>&1 | grep -E "^ +(8|28) |minor" | cut -c1-50 | sed "s/^/$r /" >> $O
done
echo done >> $O
