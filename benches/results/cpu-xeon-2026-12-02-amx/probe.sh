#!/usr/bin/env bash
# scratch probe for the AMX kernel (not committed)
O=$1; mkdir -p $O
B=/tmp/fb; mkdir -p $B
for f in lib cpu_linear modes quantized reference_transformers; do xz -dc carry/cpu/$f.xz > $B/$f; chmod +x $B/$f; done
[ -e /work/main ] || { mkdir -p /work; ln -s $PWD /work/main; }
export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
T="taskset -c 0,1"
lscpu > $O/lscpu.txt
for t in lib quantized reference_transformers; do $T $B/$t --test-threads=2 > $O/test-$t.log 2>&1; echo "$t rc $? $(grep 'test result' $O/test-$t.log | tail -1)"; done
$T python3 scripts/gpu-real/write_checkpoints.py /tmp/ckpt --models qwen25-0.5b --device cpu --dtype float32 > $O/ckpt.log 2>&1
FORKSCORE_BENCH_BLOCKINGS=";mr=14,kc=384,mc=84" FORKSCORE_BENCH_AMX_BLOCKINGS="${AMXB}" \
  FORKSCORE_BENCH_ROWS=512,40 FORKSCORE_BENCH_REPEATS=5 FORKSCORE_BENCH_OUT=$O/cpu_linear.json $T $B/cpu_linear --bench > $O/cpu_linear.txt 2>&1
grep "one layer" $O/cpu_linear.txt
run() { # name env...
  local n=$1; shift
  env "$@" FORKSCORE_BENCH_MODEL=/tmp/ckpt/qwen25-0.5b FORKSCORE_BENCH_FIELDS=8,28 FORKSCORE_BENCH_WORDS=80 \
  FORKSCORE_BENCH_REPEATS=2 FORKSCORE_BENCH_MODES=parallel FORKSCORE_BENCH_OUT=$O/$n \
  FORKSCORE_BENCH_DUMP=$O/dump-$n.json $T $B/modes --bench 2>&1 | grep -E "^ +(8|28) " | sed "s/^/$n /"
}
run packed FORKSCORE_CPU_GEMM=packed
run amx1 FORKSCORE_CPU_AMX=$AMX1
run packed14 FORKSCORE_CPU_GEMM=packed FORKSCORE_CPU_GEMM_BLOCKING=mr=14,kc=384,mc=84
run amx2 FORKSCORE_CPU_AMX=$AMX2
$T python3 scripts/gpu-real/peer.py --dump $O/dump-packed.json --model /tmp/ckpt/qwen25-0.5b --out $O/peer.json \
  --label cpu --device cpu --dtype float32 --repeats 2 --budget-s 20 --modes prefill,prefix_batched 2>&1 | tail -5
