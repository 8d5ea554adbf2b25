// The f32 linear kernel's structure, varied, on one CPU: which weight layout, tile shape, `k`
// block and prefetch make `y = x Wᵀ` fastest at the 0.5B model's shapes. A lab, not the
// product: the product's kernel is kernels/src/cpu/gemm/ (Rust: x86/avx512.rs); the variant named
// `ours` here mirrors its AVX-512 form (weight panels of 16 columns, k-major; activations in
// groups of `mr` rows, k-major; tiles of `mr` rows × 2 panels; panel blocks of 8, row blocks,
// `k` blocks; `k` innermost up to 1,536, outermost above), so the others compare against it in
// one process on the same cores. Each variant's result is checked against a plain product.
//
//   gcc -O3 -march=native -fopenmp scripts/cpu-real/gemm_lab.c -o /tmp/gemm_lab
//   OMP_NUM_THREADS=2 taskset -c 0,1 /tmp/gemm_lab [rows] [repeats] [shapes, e.g. down,o]
// LAB_VARIANTS: `;`-separated substrings of the variants' names to run (default: all).
//
// Layouts of the weight (n × k): L16 = panels of 16 columns (the product's), L32 / L48 / L64 =
// panels of 32 / 48 / 64 columns, so a tile's vectors of one `k` are one contiguous run.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *alloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes ? bytes : 64)) abort();
  memset(p, 0, bytes);
  return p;
}

// C (MR, 16·NV) (+)= A (MR, kc) · B (kc, 16·NV); vector j of step kk at b + j·vs + kk·adv.
#define KERNEL(MR, NV)                                                                        \
  static void k_##MR##_##NV(int kc, const float *a, const float *b, long vs, long adv,       \
                            float *c, long ldc, int first, int pf) {                          \
    __m512 acc[MR][NV];                                                                       \
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++)                                     \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[r][j] =                      \
            first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16 * j);              \
    for (int kk = 0; kk < kc; kk++) {                                                         \
      __m512 bv[NV];                                                                          \
      _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) bv[j] = _mm512_loadu_ps(b + j * vs); \
      if (pf) {                                                                               \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)                                  \
            _mm_prefetch((const char *)(b + j * vs + pf * adv), _MM_HINT_T0);                 \
      }                                                                                       \
      _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++) {                                 \
        __m512 av = _mm512_set1_ps(a[r]);                                                     \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) acc[r][j] =                      \
            _mm512_fmadd_ps(av, bv[j], acc[r][j]);                                            \
      }                                                                                       \
      a += MR;                                                                                \
      b += adv;                                                                               \
    }                                                                                         \
    _Pragma("GCC unroll 16") for (int r = 0; r < MR; r++)                                     \
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)                                  \
            _mm512_storeu_ps(c + r * ldc + 16 * j, acc[r][j]);                                \
  }

KERNEL(14, 2)
KERNEL(12, 2)
KERNEL(8, 2)
KERNEL(9, 3)
KERNEL(8, 3)
KERNEL(7, 4)
KERNEL(6, 4)

typedef void (*kern_t)(int, const float *, const float *, long, long, float *, long, int, int);

static kern_t kernel_for(int mr, int nv) {
  if (nv == 2 && mr == 14) return k_14_2;
  if (nv == 2 && mr == 12) return k_12_2;
  if (nv == 2 && mr == 8) return k_8_2;
  if (nv == 3 && mr == 9) return k_9_3;
  if (nv == 3 && mr == 8) return k_8_3;
  if (nv == 4 && mr == 7) return k_7_4;
  if (nv == 4 && mr == 6) return k_6_4;
  return NULL;
}

typedef struct {
  const char *name;
  int lw;     // layout width: 16 (the product's panels, a tile reads NV of them) or 16·NV
  int mr, nv; // tile
  int kc, mc, nc; // k block, row block, columns per block (a multiple of the tile's 16·NV)
  int pf;     // prefetch distance in k steps (0: none)
  int rows_outer; // 1: for each row tile, every column tile of the block (A stays in L1)
  int order;      // 0: k innermost up to 1,536, outermost above (the product's); 1: k innermost; 2: outermost
  int split;      // 0: one run of column tiles per thread (the product's); 1: one run of row groups
} variant;

// m, k, n multiples of what every variant needs (m of 252 = lcm of the tile rows' groups is not
// required: ragged row tiles are padded rows in the packed activations)
typedef struct {
  int m, k, n;
  float *x, *w, *ref;
} problem;

static float *pack_a(const float *x, int m, int k, int mr, int *groups) {
  int g = (m + mr - 1) / mr;
  float *a = alloc((size_t)g * mr * k * sizeof(float));
  for (int gi = 0; gi < g; gi++)
    for (int r = 0; r < mr && gi * mr + r < m; r++)
      for (int kk = 0; kk < k; kk++) a[((size_t)gi * k + kk) * mr + r] = x[(size_t)(gi * mr + r) * k + kk];
  *groups = g;
  return a;
}

static float *pack_w(const float *w, int n, int k, int lw) {
  float *p = alloc((size_t)n * k * sizeof(float)); // n a multiple of lw
  for (int pi = 0; pi < n / lw; pi++)
    for (int kk = 0; kk < k; kk++)
      for (int c = 0; c < lw; c++) p[((size_t)pi * k + kk) * lw + c] = w[(size_t)(pi * lw + c) * k + kk];
  return p;
}

// y (m_pad, n) = packed a · packed wᵀ with variant v, columns split into one run per thread
static void product(const variant *v, const float *a, int groups, const float *wp, int k, int n,
                    float *y) {
  int tw = 16 * v->nv; // tile width
  int tiles = n / tw;
  int m_pad = groups * v->mr;
  kern_t kern = kernel_for(v->mr, v->nv);
  int short_k = v->order == 0 ? k <= 1536 : v->order == 1;
#pragma omp parallel
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int t0 = (int)((long)tiles * t / nt), t1 = (int)((long)tiles * (t + 1) / nt);
    int r0 = 0, r1 = m_pad; // rows of this thread (split 1: a run of whole row groups)
    if (v->split) {
      int g = m_pad / v->mr;
      r0 = (int)((long)g * t / nt) * v->mr;
      r1 = (int)((long)g * (t + 1) / nt) * v->mr;
      t0 = 0;
      t1 = tiles;
    }
    int ntile_blk = v->nc / tw;
    if (ntile_blk < 1) ntile_blk = 1;
    int mc = (v->mc + v->mr - 1) / v->mr * v->mr;
    // B of tile `ti` at k0; vector stride and per-k advance by layout
    long vs, adv;
    if (v->lw == 16) {
      vs = (long)k * 16;
      adv = 16;
    } else {
      vs = 16;
      adv = v->lw;
    }
#define BPTR(ti, k0) (v->lw == 16 ? wp + ((size_t)(ti) * v->nv * k + (k0)) * 16 : wp + ((size_t)(ti) * k + (k0)) * v->lw)
#define BLOCK(jc, ic, pc)                                                                      \
  do {                                                                                         \
    int je = jc + ntile_blk < t1 ? jc + ntile_blk : t1;                                        \
    int me = ic + mc < r1 ? ic + mc : r1;                                                      \
    int kc = v->kc < k - pc ? v->kc : k - pc;                                                  \
    if (!v->rows_outer) {                                                                      \
      for (int ti = jc; ti < je; ti++)                                                         \
        for (int r = ic; r < me; r += v->mr)                                                   \
          kern(kc, a + (size_t)r * k + (size_t)pc * v->mr, BPTR(ti, pc), vs, adv,              \
               y + (size_t)r * n + (size_t)ti * tw, n, pc == 0, v->pf);                        \
    } else {                                                                                   \
      for (int r = ic; r < me; r += v->mr)                                                     \
        for (int ti = jc; ti < je; ti++)                                                       \
          kern(kc, a + (size_t)r * k + (size_t)pc * v->mr, BPTR(ti, pc), vs, adv,              \
               y + (size_t)r * n + (size_t)ti * tw, n, pc == 0, v->pf);                        \
    }                                                                                          \
  } while (0)
    if (short_k) {
      for (int jc = t0; jc < t1; jc += ntile_blk)
        for (int ic = r0; ic < r1; ic += mc)
          for (int pc = 0; pc < k; pc += v->kc) BLOCK(jc, ic, pc);
    } else {
      for (int pc = 0; pc < k; pc += v->kc)
        for (int jc = t0; jc < t1; jc += ntile_blk)
          for (int ic = r0; ic < r1; ic += mc) BLOCK(jc, ic, pc);
    }
  }
}

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
  int m = argc > 1 ? atoi(argv[1]) : 512;
  int reps = argc > 2 ? atoi(argv[2]) : 7;
  struct { const char *name; int n, k; } shapes[] = {
      {"qkv", 1152, 896}, {"o", 896, 896}, {"gate_up", 9728, 896}, {"down", 896, 4864}};
  variant vars[] = {
      {"ours L16 14x2 kc384 mc84", 16, 14, 2, 384, 84, 128, 0, 0},
      {"ours L16 14x2 kc384 pf8", 16, 14, 2, 384, 84, 128, 8, 0},
      {"L32 14x2 kc384 mc84", 32, 14, 2, 384, 84, 128, 0, 0},
      {"L32 14x2 kc384 pf8", 32, 14, 2, 384, 84, 128, 8, 0},
      {"L32 14x2 kc192 mc84", 32, 14, 2, 192, 84, 128, 0, 0},
      {"L32 14x2 kc384 rows-outer", 32, 14, 2, 384, 84, 128, 0, 1},
      {"L32 12x2 kc256 mc96", 32, 12, 2, 256, 96, 128, 0, 0},
      {"L48 9x3 kc384 mc90", 48, 9, 3, 384, 90, 144, 0, 0},
      {"L48 8x3 kc256 mc96", 48, 8, 3, 256, 96, 144, 0, 0},
      {"L64 7x4 kc384 mc84", 64, 7, 4, 384, 84, 128, 0, 0},
      {"L64 7x4 kc256 pf8", 64, 7, 4, 256, 84, 128, 8, 0},
      {"L64 6x4 kc256 mc96", 64, 6, 4, 256, 96, 128, 0, 0},
      {"L64 7x4 kc384 nc256", 64, 7, 4, 384, 84, 256, 0, 0},
      // the long-k product (down) and the split between threads
      {"ours k-inner", 16, 14, 2, 384, 84, 128, 0, 0, 1, 0},
      {"ours k-outer kc768", 16, 14, 2, 768, 84, 128, 0, 0, 2, 0},
      {"ours k-outer kc1216", 16, 14, 2, 1216, 84, 128, 0, 0, 2, 0},
      {"ours mc28", 16, 14, 2, 384, 28, 128, 0, 0, 0, 0},
      {"ours k-inner nc32", 16, 14, 2, 384, 84, 32, 0, 0, 1, 0},
      {"ours k-inner nc32 mc252", 16, 14, 2, 384, 252, 32, 0, 0, 1, 0},
      {"ours rows-split", 16, 14, 2, 384, 84, 128, 0, 0, 0, 1},
      {"ours rows-split pf8", 16, 14, 2, 384, 84, 128, 8, 0, 0, 1},
      {"ours rows-split k-inner", 16, 14, 2, 384, 84, 128, 0, 0, 1, 1},
      {"L64 7x4 kc384 rows-split", 64, 7, 4, 384, 84, 128, 0, 0, 0, 1},
      {"L64 7x4 kc256 pf8 rows-split", 64, 7, 4, 256, 84, 128, 8, 0, 0, 1},
      {"L64 7x4 k-inner nc64", 64, 7, 4, 384, 84, 64, 0, 0, 1, 0},
  };
  const char *only = argc > 3 ? argv[3] : NULL; // shapes to run, e.g. "down,gate_up"
  const char *vonly = getenv("LAB_VARIANTS");    // substrings of variant names, `;`-separated
  int nv = sizeof vars / sizeof vars[0];
  printf("gemm_lab: %d rows, %d threads, %d repeats (median), GFLOP/s\n", m, omp_get_max_threads(), reps);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    if (only && !strstr(only, shapes[s].name)) continue;
    int n = shapes[s].n, k = shapes[s].k;
    float *x = alloc((size_t)m * k * 4), *w = alloc((size_t)n * k * 4);
    srand(1);
    for (size_t i = 0; i < (size_t)m * k; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    // reference rows: a few, in double
    int check_rows[] = {0, m / 2, m - 1};
    double *ref = alloc(3 * (size_t)n * sizeof(double));
    for (int ci = 0; ci < 3; ci++)
      for (int c = 0; c < n; c++) {
        double acc = 0;
        for (int kk = 0; kk < k; kk++) acc += (double)x[(size_t)check_rows[ci] * k + kk] * w[(size_t)c * k + kk];
        ref[(size_t)ci * n + c] = acc;
      }
    float *as[64], *ws[64], *ys[64];
    int groups[64];
    double *times = alloc(sizeof(double) * nv * reps);
    for (int vi = 0; vi < nv; vi++) {
      as[vi] = NULL;
      if (n % (16 * vars[vi].nv) || n % vars[vi].lw) continue; // the tile does not divide n
      if (vonly) {
        int hit = 0;
        char buf[512];
        snprintf(buf, sizeof buf, "%s", vonly);
        for (char *tok = strtok(buf, ";"); tok; tok = strtok(NULL, ";")) hit |= strstr(vars[vi].name, tok) != NULL;
        if (!hit) continue;
      }
      as[vi] = pack_a(x, m, k, vars[vi].mr, &groups[vi]);
      ws[vi] = pack_w(w, n, k, vars[vi].lw);
      ys[vi] = alloc((size_t)groups[vi] * vars[vi].mr * n * 4);
      product(&vars[vi], as[vi], groups[vi], ws[vi], k, n, ys[vi]); // warm-up + check
      double worst = 0;
      for (int ci = 0; ci < 3; ci++)
        for (int c = 0; c < n; c++) {
          double d = fabs(ys[vi][(size_t)check_rows[ci] * n + c] - ref[(size_t)ci * n + c]);
          if (d > worst) worst = d;
        }
      if (worst > 1e-3) {
        printf("  %s: WRONG (max |diff| %.3g)\n", vars[vi].name, worst);
        return 1;
      }
    }
    for (int rep = 0; rep < reps; rep++)
      for (int vi = 0; vi < nv; vi++) {
        if (!as[vi]) continue;
        double t = now();
        product(&vars[vi], as[vi], groups[vi], ws[vi], k, n, ys[vi]);
        times[vi * reps + rep] = now() - t;
      }
    for (int vi = 0; vi < nv; vi++) {
      if (!as[vi]) continue;
      qsort(times + vi * reps, reps, sizeof(double), cmp);
      double t = times[vi * reps + reps / 2];
      printf("%-8s %5dx%-5d %-30s %8.3f ms %7.1f GFLOP/s\n", shapes[s].name, n, k, vars[vi].name, t * 1e3,
             2.0 * m * n * k / t * 1e-9);
      free(as[vi]);
      free(ws[vi]);
      free(ys[vi]);
    }
    fflush(stdout);
    free(x);
    free(w);
    free(ref);
    free(times);
  }
  return 0;
}
