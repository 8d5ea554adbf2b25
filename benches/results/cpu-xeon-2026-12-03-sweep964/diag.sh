set -u
O=/tmp/d; mkdir -p $O /tmp/fb
xz -dc carry/cpu/cpu_linear.xz > /tmp/fb/cpu_linear && chmod +x /tmp/fb/cpu_linear
S=qkv:1152x896,o:896x896,gate_up:9728x896,down:896x4864
lin() { FORKSCORE_BENCH_ROWS=964 FORKSCORE_BENCH_SHAPES=$S FORKSCORE_BENCH_REPEATS=9 FORKSCORE_BENCH_OUT=$O/x.json "$@" /tmp/fb/cpu_linear --bench 2>&1 | grep "rows"; }
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
echo "== ours 2 threads"; RAYON_NUM_THREADS=2 lin taskset -c 0,1
echo "== ours 2 threads, glibc mmap threshold 512M"; GLIBC_TUNABLES=glibc.malloc.mmap_threshold=536870912:glibc.malloc.trim_threshold=1073741824 RAYON_NUM_THREADS=2 lin taskset -c 0,1
echo "== ours 1 thread"; RAYON_NUM_THREADS=1 lin taskset -c 0
echo "== ours 2 threads on cores 0,8"; RAYON_NUM_THREADS=2 lin taskset -c 0,8
echo "== torch 2 threads"; taskset -c 0,1 python3 scripts/cpu-real/gemm_peak.py --out $O/t2.json --rows 964 --shapes $S
echo "== torch 1 thread"; OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 0 python3 scripts/cpu-real/gemm_peak.py --out $O/t1.json --rows 964 --shapes $S
echo "== ours 2 threads again"; RAYON_NUM_THREADS=2 lin taskset -c 0,1
