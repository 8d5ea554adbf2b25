// The point-wise passes around the delta rule of a Gated DeltaNet layer, one kernel each instead
// of a dozen small candle ops (each a launch and a pass over memory):
//
//   gdn_gates:       β = σ(b),  g = −exp(A_log[h]) · softplus(a + dt_bias[h]),  both 0 at
//                    right-padded positions (t ≥ lengths[b]) — backends/src/candle/gated_deltanet/gates.rs
//   gdn_gated_norm:  y = (w · x · rsqrt(mean(x²) + eps)) · SiLU(z) over the last dim, written in
//                    the activation dtype for the output projection — .../gated_deltanet/norm.rs
//
// with the same formulas (softplus as max(x, 0) + ln(1 + e^{−|x|}), σ and SiLU through expf) so
// the result matches the candle path to f32 rounding.
//
// Layout (row-major, contiguous):
//   gdn_gates:      b, a (B, L, Hv) f32; a_log, dt_bias (Hv) f32; lengths (B) u32 or nullptr
//                   (no padding); out (2, B, L, Hv) f32 = [β | g]
//   gdn_gated_norm: x, z (rows, dv) f32; w (dv) f32; out (rows, dv) f32 or bf16

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float ld(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }

// b and a in TI (f32, or bf16 straight from the projections: upcasting bf16 is exact, so both
// variants compute the same values).
template <typename TI>
__device__ void gates_body(const TI* __restrict__ b, const TI* __restrict__ a,
                           const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                           const uint32_t* __restrict__ lengths, float* __restrict__ out, int B,
                           int L, int Hv) {
    const size_t n = static_cast<size_t>(B) * L * Hv;
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const int h = static_cast<int>(i % Hv);
        const int t = static_cast<int>((i / Hv) % L);
        const int row = static_cast<int>(i / (static_cast<size_t>(Hv) * L));
        const bool valid = lengths == nullptr || t < static_cast<int>(lengths[row]);
        float beta = 0.f, g = 0.f;
        if (valid) {
            beta = 1.f / (1.f + expf(-ld(b, i)));
            const float x = ld(a, i) + dt_bias[h];
            const float sp = fmaxf(x, 0.f) + logf(expf(-fabsf(x)) + 1.f);
            g = -(sp * expf(a_log[h]));
        }
        out[i] = beta;
        out[n + i] = g;
    }
}

}  // namespace

extern "C" __global__ void gdn_gates(const float* b, const float* a, const float* a_log,
                                     const float* dt_bias, const uint32_t* lengths, float* out,
                                     int B, int L, int Hv) {
    gates_body(b, a, a_log, dt_bias, lengths, out, B, L, Hv);
}

extern "C" __global__ void gdn_gates_bf16(const __nv_bfloat16* b, const __nv_bfloat16* a,
                                          const float* a_log, const float* dt_bias,
                                          const uint32_t* lengths, float* out, int B, int L,
                                          int Hv) {
    gates_body(b, a, a_log, dt_bias, lengths, out, B, L, Hv);
}

namespace {

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// One warp per row of dv values.
template <typename T, typename TZ>
__device__ void gated_norm_body(const float* __restrict__ x, const TZ* __restrict__ z,
                                const float* __restrict__ w, T* __restrict__ out, int rows,
                                int dv, float eps) {
    const int warps = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += gridDim.x * warps) {
        const float* xr = x + static_cast<size_t>(r) * dv;
        const TZ* zr = z + static_cast<size_t>(r) * dv;
        float ss = 0.f;
        for (int j = lane; j < dv; j += 32) ss += xr[j] * xr[j];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffff, ss, o);
        const float inv = 1.f / sqrtf(ss / static_cast<float>(dv) + eps);
        T* yr = out + static_cast<size_t>(r) * dv;
        for (int j = lane; j < dv; j += 32) {
            const float zj = ld(zr, j);
            const float silu = zj / (1.f + expf(-zj));
            store(yr + j, xr[j] * inv * w[j] * silu);
        }
    }
}

}  // namespace

extern "C" __global__ void gdn_gated_norm_f32(const float* x, const float* z, const float* w,
                                              float* out, int rows, int dv, float eps) {
    gated_norm_body(x, z, w, out, rows, dv, eps);
}

extern "C" __global__ void gdn_gated_norm_bf16(const float* x, const float* z, const float* w,
                                               __nv_bfloat16* out, int rows, int dv, float eps) {
    gated_norm_body(x, z, w, out, rows, dv, eps);
}

// z straight from the bf16 projection (exact upcast: same values as the f32-z variant).
extern "C" __global__ void gdn_gated_norm_bf16_zbf16(const float* x, const __nv_bfloat16* z,
                                                     const float* w, __nv_bfloat16* out, int rows,
                                                     int dv, float eps) {
    gated_norm_body(x, z, w, out, rows, dv, eps);
}
