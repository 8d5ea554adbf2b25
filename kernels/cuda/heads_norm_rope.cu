// One projection's output into head-major attention heads, with the projection's bias, the
// per-head RMSNorm and the rotary embedding of the first R dims fused into the same pass (bf16):
//
//   x      = bf16( x + bias[h·hd + c] )                 (skipped without a bias: the bias add
//                                                        the product left out, rounded as
//                                                        candle's bf16 add rounds it)
//   n      = bf16( x · rsqrt(mean(x²) + eps) · w )      (statistics in f32; skipped without w)
//   y[j]   = n[j]·cos[j] − n[j + R/2]·sin[j]            (j < R/2)
//   y[j+R/2] = n[j + R/2]·cos[j] + n[j]·sin[j]          (j < R/2; products and sums in f32)
//   y[c]   = n[c]                                       (c ≥ R)
//
// rounded once to bf16. It replaces the candle form — candle's rmsnorm, the head-major
// transpose copy, the rotary part's narrow copy, candle's rope kernel and the concatenation with
// the pass-through dims, five passes over the heads — by one read and one write. The candle form
// rounds the rope's products to bf16 on the way; here they stay f32 until the single rounding,
// so the two agree to a bf16 rounding step (the GPU tests hold the fused path to the CPU f32
// reference like the rest of the bf16 layer).
//
// Layout: element c of head h of token t (t = b·L + l over B rows of L tokens) is read at
// x[t·tok_stride + h·head_stride + c] (bf16; the q | gate interleave of a gated attention layer is
// read in place through head_stride = 2·hd), bias (H·hd) bf16 or null (head h's at h·hd), w (hd)
// bf16 or null, cos / sin (T, R/2) bf16 rows of the call's positions (null when R = 0: no
// rotation, the heads are only laid out head-major, as a value projection's are), out
// (B, H, L, hd) bf16 contiguous. hd even and ≤
// MAX_HD, R even and ≤ hd, strides even (pairs are loaded as bf16x2); the launcher checks.
// Launch: WARPS warps per block, one warp per (token, head), grid ceil(T·H / WARPS).

#include <cuda_bf16.h>
#include <stdint.h>

namespace {
constexpr int WARPS = 8;
constexpr int MAX_HD = 512;
}  // namespace

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    heads_norm_rope_bf16(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ bias,
                         const __nv_bfloat16* __restrict__ w,
                         const __nv_bfloat16* __restrict__ cos_t,
                         const __nv_bfloat16* __restrict__ sin_t, __nv_bfloat16* __restrict__ out,
                         int tokens, int len, int heads, int hd, int rot, long long tok_stride,
                         long long head_stride, float eps) {
    __shared__ float row[WARPS][MAX_HD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long item = (long long)blockIdx.x * WARPS + warp;
    if (item >= (long long)tokens * heads) return;
    const int t = (int)(item / heads), h = (int)(item % heads);
    const __nv_bfloat16* src = x + t * tok_stride + h * head_stride;
    float* r = row[warp];
    float sq = 0.f;
    const __nv_bfloat16* hb = bias != nullptr ? bias + (long long)h * hd : nullptr;
    for (int c = 2 * lane; c < hd; c += 64) {
        float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src + c));
        if (hb != nullptr) {
            const float2 bv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(hb + c));
            v.x = __bfloat162float(__float2bfloat16(v.x + bv.x));
            v.y = __bfloat162float(__float2bfloat16(v.y + bv.y));
        }
        r[c] = v.x;
        r[c + 1] = v.y;
        sq += v.x * v.x + v.y * v.y;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffff, sq, o);
    if (w != nullptr) {
        const float scale = rsqrtf(sq / hd + eps);
        for (int c = 2 * lane; c < hd; c += 64) {
            const float2 wv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(w + c));
            // the normalised value rounded to bf16, as candle's rmsnorm stores it
            r[c] = __bfloat162float(__float2bfloat16(r[c] * scale * wv.x));
            r[c + 1] = __bfloat162float(__float2bfloat16(r[c + 1] * scale * wv.y));
        }
    }
    __syncwarp();
    const int b = t / len, l = t % len;
    __nv_bfloat16* dst = out + (((long long)b * heads + h) * len + l) * hd;
    const int half = rot / 2;
    const __nv_bfloat16* ct = cos_t + (long long)t * half;
    const __nv_bfloat16* st = sin_t + (long long)t * half;
    for (int c = 2 * lane; c < hd; c += 64) {
        float y0 = r[c], y1 = r[c + 1];
        if (c < rot) {
            // c + 1 < rot too (both even); each of the pair may fall on either side of half
            float o[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const int j = c + k;
                if (j < half) {
                    const float cs = __bfloat162float(ct[j]), sn = __bfloat162float(st[j]);
                    o[k] = r[j] * cs - r[j + half] * sn;
                } else {
                    const float cs = __bfloat162float(ct[j - half]), sn = __bfloat162float(st[j - half]);
                    o[k] = r[j] * cs + r[j - half] * sn;
                }
            }
            y0 = o[0];
            y1 = o[1];
        }
        *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(y0, y1);
    }
}
