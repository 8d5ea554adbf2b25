#!/usr/bin/env bash
O=$1; mkdir -p $O
B=/tmp/fb; mkdir -p $B
for f in lib modes; do xz -dc carry/cpu/$f.xz > $B/$f; chmod +x $B/$f; done
[ -e /work/main ] || { mkdir -p /work; ln -s $PWD /work/main; }
export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
T="taskset -c 0,1"
lscpu > $O/lscpu.txt
$T $B/lib cpu_ --test-threads=2 2>&1 | grep "test result" | sed 's/^/lib cpu_ tests: /'
$T python3 scripts/gpu-real/write_checkpoints.py /tmp/ckpt --models qwen25-0.5b --device cpu --dtype float32 > $O/ckpt.log 2>&1
run() { local n=$1; shift
  env "$@" FORKSCORE_BENCH_MODEL=/tmp/ckpt/qwen25-0.5b FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
  FORKSCORE_BENCH_REPEATS=2 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT=$O/$n \
  FORKSCORE_BENCH_DUMP=$O/dump-$n.json $T $B/modes --bench 2>&1 | grep -E "^ +(8|28) " | cut -c1-40 | sed "s/^/$n /"
}
run f32-1; run q8_0-1 FORKSCORE_BENCH_QUANTIZE=q8_0; run q8_0-2 FORKSCORE_BENCH_QUANTIZE=q8_0; run f32-2
python3 -c "
import json
a=json.load(open('$O/dump-f32-1.json')); b=json.load(open('$O/dump-q8_0-1.json'))
print('dump keys', list(a)[:5] if isinstance(a,dict) else len(a))" 2>&1 | tail -1
$T python3 scripts/gpu-real/peer.py --dump $O/dump-f32-1.json --model /tmp/ckpt/qwen25-0.5b --out $O/peer.json \
  --label cpu --device cpu --dtype float32 --repeats 2 --budget-s 20 --modes prefill,prefix_batched 2>&1 | grep "prefix\b\|prefill\|batched" | tail -4
rm -f $O/dump-q8_0-2.json $O/dump-f32-2.json
