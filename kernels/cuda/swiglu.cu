// SwiGLU activation of a fused gate|up projection, one pass: out = SiLU(gate) · up.
//
// In:  gu (rows, 2F) row-major, each row [gate (F) | up (F)] — the output of ONE matrix product
//      with the gate and up weights stacked — in T (f32 or bf16).
// Out: out (rows, F) in T. SiLU and the product are computed in f32 and rounded once (the
//      candle path rounds SiLU(gate) to T before the product, so bf16 results may differ from it
//      by an ulp of T; f32 results are the same function).

#include <cuda_bf16.h>
#include <stdint.h>

namespace {
__device__ __forceinline__ float ld(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ void swiglu_one(const T* __restrict__ gu, T* __restrict__ out, size_t e,
                                           size_t r, size_t c, size_t f) {
    const float g = ld(gu, r * 2 * f + c);
    const float u = ld(gu, r * 2 * f + f + c);
    st(out, e, g / (1.f + expf(-g)) * u);
}

template <typename T>
__device__ void swiglu_body(const T* __restrict__ gu, T* __restrict__ out, int64_t rows, int64_t f) {
    const int64_t n = rows * f;
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (n <= INT32_MAX) {
        // 32-bit index arithmetic (every call of a real model): the division by f that splits an
        // element index into (row, column) is a few instructions, not a 64-bit divide. No wrap:
        // i < n < 2^31 and the stride is below 2^29.
        const uint32_t fu = (uint32_t)f, nu = (uint32_t)n;
        for (uint32_t i = (uint32_t)first; i < nu; i += (uint32_t)stride) {
            const uint32_t r = i / fu;
            swiglu_one(gu, out, i, r, i - r * fu, fu);
        }
    } else {
        for (int64_t e = first; e < n; e += stride) swiglu_one(gu, out, e, e / f, e % f, f);
    }
}

// The same function over 16-byte vectors (8 bf16 or 4 f32 per thread: one load of the gate,
// one of the up half, one store), for F a multiple of the vector width and 16-byte aligned
// rows (the launcher checks both); each element's arithmetic is swiglu_one's, so the results
// are bit-identical to the scalar kernels. n = rows · F / V < 2^32 (the launcher checks).
template <typename T>
__device__ void swiglu_vec_body(const T* __restrict__ gu, T* __restrict__ out, int64_t rows,
                                int64_t f) {
    constexpr int V = 16 / sizeof(T);
    const uint32_t fv = (uint32_t)(f / V);
    const uint32_t n = (uint32_t)(rows * (f / V));
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const uint32_t r = i / fv;
        const size_t c = (size_t)(i - r * fv) * V;
        const T* row = gu + (size_t)r * 2 * f;
        const uint4 gv = *reinterpret_cast<const uint4*>(row + c);
        const uint4 uv = *reinterpret_cast<const uint4*>(row + f + c);
        const T* g = reinterpret_cast<const T*>(&gv);
        const T* u = reinterpret_cast<const T*>(&uv);
        uint4 ov;
        T* o = reinterpret_cast<T*>(&ov);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const float gj = ld(g, j);
            st(o, j, gj / (1.f + expf(-gj)) * ld(u, j));
        }
        *reinterpret_cast<uint4*>(out + (size_t)r * f + c) = ov;
    }
}
}  // namespace

extern "C" __global__ void swiglu_vec_f32(const float* gu, float* out, int64_t rows, int64_t f) {
    swiglu_vec_body(gu, out, rows, f);
}

extern "C" __global__ void swiglu_vec_bf16(const __nv_bfloat16* gu, __nv_bfloat16* out,
                                           int64_t rows, int64_t f) {
    swiglu_vec_body(gu, out, rows, f);
}

extern "C" __global__ void swiglu_f32(const float* gu, float* out, int64_t rows, int64_t f) {
    swiglu_body(gu, out, rows, f);
}

extern "C" __global__ void swiglu_bf16(const __nv_bfloat16* gu, __nv_bfloat16* out, int64_t rows,
                                       int64_t f) {
    swiglu_body(gu, out, rows, f);
}
