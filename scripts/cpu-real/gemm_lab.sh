#!/usr/bin/env bash
# The f32 kernel-structure lab (gemm_lab.c) on a remote CPU, with the product's own kernel (the
# cpu_linear bench, from `device.sh pack`), torch's linear and the peak rates in the same call:
#   bash scripts/cpu-real/gemm_lab.sh OUTDIR [ROWS]
# Also asks whether the two cores the bench pins share anything: the lab on one core, on cores
# 0,1 and on cores 0,8 (LAB_CORES, default "0,1 0 0,8"). PEAK=0 skips peak.c.
set -uo pipefail
OUT=${1:?usage: gemm_lab.sh OUTDIR [ROWS]}; ROWS=${2:-512}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lab.log") 2>&1
gcc -O3 -march=native -fopenmp scripts/cpu-real/gemm_lab.c -o /tmp/gemm_lab -lm || exit 1
gcc -O3 -mamx-tile -mamx-int8 -mamx-bf16 -o /tmp/peak scripts/cpu-real/peak.c || exit 1
echo "== $(grep -m1 'model name' /proc/cpuinfo)"
[ "${PEAK:-1}" = 1 ] && { echo "== peak.c on core 0"; timeout 120 taskset -c 0 /tmp/peak; }
export OMP_PROC_BIND=close
for c in ${LAB_CORES:-0,1 0 0,8}; do
  n=$(echo "$c" | tr ',' '\n' | wc -l)
  echo "== gemm_lab on cores $c"; OMP_NUM_THREADS=$n timeout 150 taskset -c "$c" /tmp/gemm_lab "$ROWS" 7
done
if [ -f carry/cpu/cpu_linear.xz ]; then
  xz -dc carry/cpu/cpu_linear.xz > /tmp/cpu_linear && chmod +x /tmp/cpu_linear
  echo "== the product's kernel (cpu_linear bench), cores 0,1"
  RAYON_NUM_THREADS=2 FORKSCORE_BENCH_ROWS=$ROWS taskset -c 0,1 /tmp/cpu_linear --bench
fi
echo "== torch linear, cores 0,1"
OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 taskset -c 0,1 python3 scripts/cpu-real/gemm_peak.py \
  --out "$OUT/torch_linear.json" --rows "$ROWS" --shapes qkv:1152x896,o:896x896,gate_up:9728x896,down:896x4864
