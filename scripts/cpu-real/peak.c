// The CPU's peak rates per core, for the FLOP floor beside the CPU bench: independent chains of
// one instruction in registers (no memory traffic), timed on one thread.
//   f32 FMA (vfmadd231ps zmm and ymm), int8 dot products (vpdpbusd zmm), bf16 dot products
//   (vdpbf16ps zmm) where the CPU has them, and AMX tiles (tdpbusd, tdpbf16ps) where the CPU
//   and the kernel allow them (Linux arch_prctl permission).
// Build and run (gcc 11 or later):
//   gcc -O3 -mamx-tile -mamx-int8 -mamx-bf16 -o peak scripts/cpu-real/peak.c && taskset -c 0 ./peak
// (-O3: at -O2 gcc keeps the twelve chains in memory and times the store forwarding instead)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define ITERS 20000000L

__attribute__((target("avx512f"))) static double fma512(void) {
  __m512 a[12], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-9f);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  double t = now();
  for (long n = 0; n < ITERS; n++)
    for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
  t = now() - t;
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  if (s == 1234.5f) puts("");
  return ITERS * 12.0 * 16 * 2 / t / 1e9;  // GFLOP/s
}

__attribute__((target("avx2,fma"))) static double fma256(void) {
  __m256 a[12], b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-9f);
  for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
  double t = now();
  for (long n = 0; n < ITERS; n++)
    for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  t = now() - t;
  float s = 0, o[8];
  for (int i = 0; i < 12; i++) { _mm256_storeu_ps(o, a[i]); s += o[0]; }
  if (s == 1234.5f) puts("");
  return ITERS * 12.0 * 8 * 2 / t / 1e9;
}

__attribute__((target("avx512f,avx512vnni"))) static double vnni512(void) {
  __m512i a[12], b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(2);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
  double t = now();
  for (long n = 0; n < ITERS; n++)
    for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], b, c);
  t = now() - t;
  long s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
  if (s == 12345) puts("");
  return ITERS * 12.0 * 64 * 2 / t / 1e9;  // GOP/s (a multiply-add = 2)
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_512(void) {
  __m512 a[12];
  __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  double t = now();
  for (long n = 0; n < ITERS; n++)
    for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], b, c);
  t = now() - t;
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  if (s == 1234.5f) puts("");
  return ITERS * 12.0 * 32 * 2 / t / 1e9;
}

#ifdef __AMX_TILE__
struct tilecfg {
  uint8_t palette, start;
  uint8_t pad[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

static double amx(int bf16) {
  struct tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
  _tile_loadconfig(&cfg);
  static int8_t buf[16 * 64] __attribute__((aligned(64)));
  memset(buf, 0, sizeof buf);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
  long iters = ITERS / 8;
  double t = now();
  if (bf16) {
    for (long n = 0; n < iters; n++) {
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
  } else {
    for (long n = 0; n < iters; n++) {
      _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
    }
  }
  t = now() - t;
  _tile_stored(0, buf, 64);
  _tile_release();
  // one tile product: 16 x 16 outputs x (64 int8 or 32 bf16) multiply-adds
  double macs = bf16 ? 16 * 16 * 32 : 16 * 16 * 64;
  return iters * 4.0 * macs * 2 / t / 1e9;
}
#endif

int main(void) {
  __builtin_cpu_init();
  printf("{\n  \"fma_ymm_gflops\": %.1f", fma256());
  if (__builtin_cpu_supports("avx512f")) printf(",\n  \"fma_zmm_gflops\": %.1f", fma512());
  if (__builtin_cpu_supports("avx512vnni")) printf(",\n  \"vnni_zmm_gops\": %.1f", vnni512());
  if (__builtin_cpu_supports("avx512bf16")) printf(",\n  \"bf16_zmm_gflops\": %.1f", bf16_512());
#ifdef __AMX_TILE__
  // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18); refused without AMX
  if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) {
    printf(",\n  \"amx_int8_gops\": %.1f", amx(0));
    printf(",\n  \"amx_bf16_gflops\": %.1f", amx(1));
  } else {
    printf(",\n  \"amx\": \"no AMX tile permission (no AMX, or the kernel refused)\"");
  }
#endif
  printf("\n}\n");
  return 0;
}
