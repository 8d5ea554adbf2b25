// Exact top-K log-probabilities and the logsumexp of full-vocabulary rows, on the GPU.
//
// One block of 1024 threads per row of f32 logits (row-major, `vocab` columns). Per row:
//   lse      = m + ln Σ exp(x − m)   (m the row maximum; exp in f32, the sum in f64, summed in a
//              fixed order, so the result is deterministic; −inf for a row of only −inf)
//   logprob  = x − lse in f32 (−inf stays −inf)
//   top K    = the K best (logprob descending, token id ascending), exactly the first K entries of
//              the full log-softmax sorted in that order.
// Rows holding NaN or +inf are refused: status[row] = the lowest such id (else −1) and nothing
// else of the row is written.
//
// Selection (block-max prefilter): pass 1 takes the maximum of every block of 64 logits, pass 2
// the logsumexp. τ is the K-th best block maximum's log-probability: K distinct blocks hold a
// logit at least that probable, so every member of the top K has logprob ≥ τ, and only blocks
// whose maximum reaches τ are visited. Their members with logprob ≥ τ are gathered in shared
// memory and sorted (bitonic, by logprob then id). When more than CAP logits tie at or above τ
// (e.g. a row of −inf), the exact fallback selects the K-th best logprob v by a radix select over
// the whole row, takes every logit strictly above v and the lowest ids equal to v.
//
// Limits (checked by the caller): 1 ≤ K ≤ MAX_K, vocab ≤ MAX_BLOCKS · 64.

#include <cstdint>
#include <cfloat>

#define NO_BAD 0x7fffffff

#define THREADS 1024
#define BLOCK 64
#define MAX_BLOCKS 6144
#define CAP 2048
#define MAX_K 256

// Float → unsigned key whose unsigned order is the float order (no NaN here).
__device__ __forceinline__ unsigned int fkey(float x) {
    unsigned int b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float log_prob(float x, float lse) {
    return x == -INFINITY ? x : x - lse;
}

// (key, id) pairs: "better" = larger key, then smaller id.
__device__ __forceinline__ bool better(unsigned int ka, unsigned int ia, unsigned int kb, unsigned int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

__device__ __forceinline__ float block_max_reduce(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = red[l];
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (l == 0) red[0] = v;
    }
    __syncthreads();
    float r = red[0];
    __syncthreads();
    return r;
}

// Fixed-order f64 sum over the block (deterministic: same tree every run).
__device__ __forceinline__ double block_sum_f64(double v, double* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = red[l];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (l == 0) red[0] = v;
    }
    __syncthreads();
    double r = red[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ int block_count(int v, int* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        v = red[l];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (l == 0) red[0] = v;
    }
    __syncthreads();
    int r = red[0];
    __syncthreads();
    return r;
}

// The k-th largest (1-based) key among n keys produced by key(i), by radix select (4 × 8 bits).
template <typename KeyFn>
__device__ unsigned int radix_select(int n, int k, KeyFn key, int* hist, unsigned int* sel) {
    unsigned int prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += THREADS) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += THREADS) {
            unsigned int kk = key(i);
            if ((kk & mask) == prefix) atomicAdd(&hist[(kk >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int acc = 0, d = 255;
            for (; d > 0; --d) {
                if (acc + hist[d] >= remaining) break;
                acc += hist[d];
            }
            sel[0] = (unsigned int)d;
            sel[1] = (unsigned int)(remaining - acc);
        }
        __syncthreads();
        prefix |= sel[0] << shift;
        mask |= 255u << shift;
        remaining = (int)sel[1];
        __syncthreads();
    }
    return prefix;
}

// Sort n (power of two ≤ CAP) pairs best first.
__device__ void bitonic_sort(unsigned int* keys, unsigned int* ids, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < n; i += THREADS) {
                int j = i ^ stride;
                if (j > i) {
                    bool up = (i & size) == 0;  // this half sorts best first
                    bool swap = up ? better(keys[j], ids[j], keys[i], ids[i])
                                   : better(keys[i], ids[i], keys[j], ids[j]);
                    if (swap) {
                        unsigned int tk = keys[i], ti = ids[i];
                        keys[i] = keys[j]; ids[i] = ids[j];
                        keys[j] = tk; ids[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) vocab_topk_f32(
    const float* __restrict__ logits, int rows, int vocab, int k,
    float* __restrict__ lse_out, unsigned int* __restrict__ top_ids, float* __restrict__ top_lp,
    int* __restrict__ status) {
    __shared__ float bmax[MAX_BLOCKS];
    __shared__ unsigned int ckey[CAP];
    __shared__ unsigned int cid[CAP];
    __shared__ double dred[32];
    __shared__ float fred[32];
    __shared__ int ired[32];
    __shared__ int hist[256];
    __shared__ unsigned int sel[2];
    __shared__ int count;
    __shared__ int bad;

    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* x = logits + (size_t)row * vocab;
    const int nb = (vocab + BLOCK - 1) / BLOCK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) { bad = NO_BAD; count = 0; }
    __syncthreads();

    // pass 1: block maxima (one warp per block of 64), the row maximum, NaN / +inf
    float tmax = -INFINITY;
    for (int b = warp; b < nb; b += THREADS / 32) {
        float m = -INFINITY;
        for (int j = lane; j < BLOCK; j += 32) {
            int i = b * BLOCK + j;
            if (i < vocab) {
                float v = x[i];
                if (isnan(v) || v == INFINITY) atomicMin(&bad, i);
                m = fmaxf(m, v);
            }
        }
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) bmax[b] = m;
        tmax = fmaxf(tmax, m);
    }
    const float m = block_max_reduce(tmax, fred);
    if (bad != NO_BAD) {
        if (threadIdx.x == 0) status[row] = bad;
        return;
    }

    // pass 2: the logsumexp
    float lse;
    if (m == -INFINITY) {
        lse = -INFINITY;
    } else {
        double s = 0.0;
        for (int i = threadIdx.x; i < vocab; i += THREADS) s += (double)expf(x[i] - m);
        s = block_sum_f64(s, dred);
        lse = (float)((double)m + log(s));
    }
    if (threadIdx.x == 0) { lse_out[row] = lse; status[row] = -1; }
    if (k <= 0) return;

    // τ: the k-th best block maximum's logprob key (all blocks when k > nb: the fallback)
    bool fallback = k > nb;
    unsigned int tau = 0;
    if (!fallback) {
        tau = radix_select(nb, k, [&](int b) { return fkey(log_prob(bmax[b], lse)); }, hist, sel);
        // gather every logit with key ≥ τ from the blocks that reach τ
        for (int b = warp; b < nb; b += THREADS / 32) {
            if (fkey(log_prob(bmax[b], lse)) < tau) continue;
            for (int j = lane; j < BLOCK; j += 32) {
                int i = b * BLOCK + j;
                if (i < vocab) {
                    unsigned int kk = fkey(log_prob(x[i], lse));
                    if (kk >= tau) {
                        int at = atomicAdd(&count, 1);
                        if (at < CAP) { ckey[at] = kk; cid[at] = (unsigned int)i; }
                    }
                }
            }
        }
        __syncthreads();
        fallback = count > CAP;
    }
    if (fallback) {
        // the k-th best logprob v over the whole row; all keys > v, then the lowest ids == v
        int kk = k < vocab ? k : vocab;
        unsigned int v = radix_select(vocab, kk, [&](int i) { return fkey(log_prob(x[i], lse)); }, hist, sel);
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < vocab; i += THREADS) {
            unsigned int key = fkey(log_prob(x[i], lse));
            if (key > v) {
                int at = atomicAdd(&count, 1);
                ckey[at] = key; cid[at] = (unsigned int)i;  // fewer than kk ≤ MAX_K
            }
        }
        __syncthreads();
        int need = kk - count;
        int base = count;
        __syncthreads();
        // ties at v in ascending id order, tile by tile
        for (int t0 = 0; t0 < vocab && need > 0; t0 += THREADS) {
            int i = t0 + threadIdx.x;
            bool eq = i < vocab && fkey(log_prob(x[i], lse)) == v;
            unsigned int ballot = __ballot_sync(0xffffffffu, eq);
            if (lane == 0) ired[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < THREADS / 32; ++w) {
                if (w < warp) before += ired[w];
                total += ired[w];
            }
            before += __popc(ballot & ((1u << lane) - 1u));
            if (eq && before < need) { ckey[base + before] = v; cid[base + before] = (unsigned int)i; }
            __syncthreads();
            int taken = total < need ? total : need;
            base += taken;
            need -= taken;
        }
        if (threadIdx.x == 0) count = base;
        __syncthreads();
    }

    // sort the gathered pairs best first and write the first k
    int n = count;
    int p = 1;
    while (p < n) p <<= 1;
    for (int i = n + threadIdx.x; i < p; i += THREADS) { ckey[i] = 0u; cid[i] = 0xffffffffu; }
    __syncthreads();
    bitonic_sort(ckey, cid, p);
    int kk = k < n ? k : n;
    for (int j = threadIdx.x; j < k; j += THREADS) {
        size_t o = (size_t)row * k + j;
        if (j < kk) {
            top_ids[o] = cid[j];
            top_lp[o] = log_prob(x[cid[j]], lse);
        } else {
            top_ids[o] = 0xffffffffu;
            top_lp[o] = NAN;
        }
    }
}
