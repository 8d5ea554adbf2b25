// Residual add fused with the RMSNorm that follows it in a pre-norm decoder layer, one pass:
//
//   sum    = x + m                                  (rounded to T, the new residual stream)
//   normed = sum · rsqrt(mean(sum²) + eps) · w      (statistics in f32, rounded once to T)
//
// the same function as candle's add followed by its rmsnorm kernel (which reads the rounded
// sum back from memory): the squares are of the rounded sum, and the product order is
// candle's (scale · x · w). Only the f32 summation order of mean(sum²) differs.
//
// Layout: x, m, sum, normed (rows, D) row-major contiguous in T (f32 or bf16), w (D) in T,
// D even (pairs of elements are loaded and stored together; the launcher checks).
// Launch: one block per row (grid rows ≤ 2^31 − 1), ADD_NORM_THREADS threads, dynamic shared
// memory D floats (the row's rounded sum, kept for the second pass).

#include <cuda_bf16.h>
#include <stdint.h>

namespace {
constexpr int THREADS = 256;

__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 ld2(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
// Rounds to T and returns the rounded values as f32.
__device__ __forceinline__ float2 st2(float* p, float2 v) {
    *reinterpret_cast<float2*>(p) = v;
    return v;
}
__device__ __forceinline__ float2 st2(__nv_bfloat16* p, float2 v) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(v.x, v.y);
    *reinterpret_cast<__nv_bfloat162*>(p) = r;
    return __bfloat1622float2(r);
}

template <typename T>
__device__ void add_rms_norm_body(const T* __restrict__ x, const T* __restrict__ m,
                                  const T* __restrict__ w, T* __restrict__ sum,
                                  T* __restrict__ normed, int d, float eps) {
    extern __shared__ float row_sum[];
    const size_t base = (size_t)blockIdx.x * d;
    float sq = 0.f;
    for (int c = 2 * threadIdx.x; c < d; c += 2 * THREADS) {
        const float2 a = ld2(x + base + c), b = ld2(m + base + c);
        const float2 s = st2(sum + base + c, make_float2(a.x + b.x, a.y + b.y));
        row_sum[c] = s.x;
        row_sum[c + 1] = s.y;
        sq += s.x * s.x;
        sq += s.y * s.y;
    }
    // block sum of the squares
    __shared__ float warp_sums[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffff, sq, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sq;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < THREADS / 32; ++i) total += warp_sums[i];
    const float scale = rsqrtf(total / d + eps);
    for (int c = 2 * threadIdx.x; c < d; c += 2 * THREADS) {
        const float2 a = ld2(w + c);
        st2(normed + base + c, make_float2(scale * row_sum[c] * a.x, scale * row_sum[c + 1] * a.y));
    }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS)
    add_rms_norm_f32(const float* x, const float* m, const float* w, float* sum, float* normed,
                     int d, float eps) {
    add_rms_norm_body(x, m, w, sum, normed, d, eps);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    add_rms_norm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* m, const __nv_bfloat16* w,
                      __nv_bfloat16* sum, __nv_bfloat16* normed, int d, float eps) {
    add_rms_norm_body(x, m, w, sum, normed, d, eps);
}
