// The gated delta rule of a Gated DeltaNet layer, token by token, fused on the GPU.
//
// Computes exactly what the plain recurrence of the candle path computes
// (backends/src/candle/gated_deltanet/recurrence.rs), for prefill and for forked scoring rows:
//
//   per step t:  q̂ = q·rsqrt(Σq² + eps)·scale, k̂ = k·rsqrt(Σk² + eps)
//                S ← e^{g_t} S;  e = (v_t − Sᵀk̂)·β_t;  S ← S + k̂ eᵀ;  o_t = Sᵀq̂
//
// and fuses around it what the candle path does with separate copies: the split of the conv
// output into q | k | v, the L2 normalisation of q and k, the q scale, the key-head → value-head
// sharing (value head h reads key head h / (Hv/Hk)), the head-major transposes, and the gather of
// each row's starting state from its slot (`slot_of_row`).
//
// Layout (all f32, row-major, contiguous):
//   qkv   (B, L, Cc)      Cc = 2·Hk·DK + Hv·dv: [q heads | k heads | v heads] after conv + SiLU
//   beta  (B, L, Hv)      β (0 at right-padded positions)
//   g     (B, L, Hv)      log-decay (0 at right-padded positions)
//   s0    (S, Hv, DK, dv) starting states of S slots; row b starts from slot slot_of_row[b]
//                         (slot_of_row == nullptr: row b starts from slot b)
//   out   (B, L, Hv, dv)  o_t
//   s1    (B, Hv, DK, dv) state after the last step, or nullptr: not written (a scoring pass,
//                         whose branch state nobody reads)
//
// Parallel decomposition: the value columns of S evolve independently (column j only reads
// v_t[j] and the shared k̂, q̂), so a block owns (row b, value head h, a tile of columns). Inside a
// warp, lane (rg, cg) holds DK/8 consecutive rows of CPL columns in registers, so the state never
// leaves registers between steps, and the two dot products over DK per column share one
// 3-level butterfly of warp shuffles over the 8 row groups. Step inputs are staged in
// shared memory a chunk of tokens at a time (asynchronous copies of chunk c+1 overlap the steps
// of chunk c), where q and k are L2-normalised and q̂·k̂, e^g are precomputed off the sequential
// path.

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

// Lane layout inside a warp: RG row groups × CG column groups. Lane (rg, cg) holds rows
// [rg·ROWS, (rg+1)·ROWS) of CPL value columns; a dot product over DK is ROWS in-lane FMAs and a
// 3-level butterfly over the RG lanes of its column group.
constexpr int RG = 8;
constexpr int CG = 4;

// Tokens staged per chunk, so that the double-buffered q and k (padded rows of QK floats) take
// at most 36 KiB of shared memory and everything stays under the 48 KiB static limit.
template <int QK>
struct Chunk {
    static constexpr int TC = 2304 / QK < 32 ? 2304 / QK : 32;
};

template <int ROWS, int CPL, int WARPS>
__device__ void gdn_recurrent_body(const float* __restrict__ qkv, const float* __restrict__ beta,
                                   const float* __restrict__ g, const float* __restrict__ s0,
                                   const int32_t* __restrict__ slot_of_row,
                                   float* __restrict__ out, float* __restrict__ s1, int L, int Hk,
                                   int Hv, int dv, float q_scale, float eps) {
    constexpr int DK = ROWS * RG;
    constexpr int WC = CG * CPL;       // value columns of a warp
    constexpr int BC = WC * WARPS;     // value columns of the block
    constexpr int NT = 32 * WARPS;
    constexpr int RP = ROWS + 4;       // padded row-group stride: 16-byte loads without conflicts
    constexpr int QK = RG * RP;        // padded length of one staged q or k
    constexpr int TC = Chunk<QK>::TC;

    // Double-buffered chunk of step inputs; q and k are normalised in place once they land.
    // stage_qk[0] holds q, stage_qk[1] k; the whole array also stages the state tile.
    __shared__ __align__(16) float stage_qk[2][2][TC][QK];
    auto& sq = stage_qk[0];
    auto& sk = stage_qk[1];
    __shared__ float sv[2][TC][BC];
    __shared__ float sbeta[2][TC];
    __shared__ float salpha[2][TC];  // holds g until normalised, then e^g
    __shared__ float sqk[2][TC];     // q̂·k̂
    static_assert(sizeof(stage_qk) >= sizeof(float) * DK * BC, "state tile fits the q/k stage");

    const int b = blockIdx.x / Hv;
    const int h = blockIdx.x % Hv;
    const int hk = h / (Hv / Hk);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int rg = lane % RG;
    const int cg = lane / RG;
    const int tile0 = blockIdx.y * BC;          // first column of the block
    const int wcol = warp * WC + cg * CPL;      // first column of this lane, within the tile
    const int Cc = 2 * Hk * DK + Hv * dv;
    const int slot = slot_of_row ? slot_of_row[b] : b;
    const int64_t tok0 = (int64_t)b * L;
    const int chunks = (L + TC - 1) / TC;
    const int tile_cols = min(BC, dv - tile0);
    auto pad = [](int e) { return (e / ROWS) * RP + e % ROWS; };

    // The starting state tile (DK × BC), through shared memory so global reads are coalesced.
    float* tile = &stage_qk[0][0][0][0];
    {
        const float* src = s0 + ((int64_t)slot * Hv + h) * DK * dv + tile0;
        for (int e = threadIdx.x; e < DK * BC; e += NT) {
            const int r = e / BC, j = e % BC;
            tile[e] = j < tile_cols ? src[(int64_t)r * dv + j] : 0.f;
        }
    }
    __syncthreads();
    float S[ROWS][CPL];
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < CPL; ++j) S[i][j] = tile[(rg * ROWS + i) * BC + wcol + j];
    __syncthreads();

    // Issue the asynchronous copies of chunk c into buffer c & 1 (zero-filled past L / dv).
    auto stage = [&](int c) {
        const int buf = c & 1;
        for (int e = threadIdx.x; e < TC * DK; e += NT) {
            const int t = e / DK, i = e % DK;
            const int tok = c * TC + t;
            const bool ok = tok < L;
            const float* row = qkv + (tok0 + (ok ? tok : 0)) * (int64_t)Cc;
            __pipeline_memcpy_async(&sq[buf][t][pad(i)], row + hk * DK + i, 4, ok ? 0 : 4);
            __pipeline_memcpy_async(&sk[buf][t][pad(i)], row + Hk * DK + hk * DK + i, 4, ok ? 0 : 4);
        }
        for (int e = threadIdx.x; e < TC * BC; e += NT) {
            const int t = e / BC, j = e % BC;
            const int tok = c * TC + t;
            const bool ok = tok < L && j < tile_cols;
            const float* row = qkv + (tok0 + (ok ? tok : 0)) * (int64_t)Cc;
            __pipeline_memcpy_async(&sv[buf][t][j], row + 2 * Hk * DK + h * dv + (ok ? tile0 + j : 0), 4,
                                    ok ? 0 : 4);
        }
        for (int t = threadIdx.x; t < TC; t += NT) {
            const int tok = c * TC + t;
            const bool ok = tok < L;
            const int64_t at = (tok0 + (ok ? tok : 0)) * Hv + h;
            __pipeline_memcpy_async(&sbeta[buf][t], beta + at, 4, ok ? 0 : 4);
            __pipeline_memcpy_async(&salpha[buf][t], g + at, 4, ok ? 0 : 4);
        }
        __pipeline_commit();
    };

    if (chunks > 0) stage(0);
    for (int c = 0; c < chunks; ++c) {
        const int buf = c & 1;
        if (c + 1 < chunks) {
            stage(c + 1);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();

        // Normalise the chunk's q and k (each warp takes every WARPS-th token) and precompute
        // the per-token scalars, off the sequential path.
        for (int t = warp; t < TC; t += WARPS) {
            float qq = 0.f, kk = 0.f, qk = 0.f;
            for (int e = lane; e < DK; e += 32) {
                const float q = sq[buf][t][pad(e)], k = sk[buf][t][pad(e)];
                qq += q * q;
                kk += k * k;
                qk += q * k;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                qq += __shfl_xor_sync(0xffffffffu, qq, o);
                kk += __shfl_xor_sync(0xffffffffu, kk, o);
                qk += __shfl_xor_sync(0xffffffffu, qk, o);
            }
            const float qs = q_scale / sqrtf(qq + eps);
            const float ks = 1.f / sqrtf(kk + eps);
            for (int e = lane; e < DK; e += 32) {
                sq[buf][t][pad(e)] *= qs;
                sk[buf][t][pad(e)] *= ks;
            }
            if (lane == 0) {
                sqk[buf][t] = qk * qs * ks;
                salpha[buf][t] = expf(salpha[buf][t]);
            }
        }
        __syncthreads();

        // The sequential steps. With S the state before step t (undecayed):
        //   e = (v − α·k̂ᵀS)·β,  o = α·q̂ᵀS + (q̂·k̂)·e,  S ← α·S + k̂ eᵀ
        // which is the module's definition with the decay, write and read-out expanded, so
        // both dot products over DK share one butterfly.
        const int steps = min(TC, L - c * TC);
        for (int t = 0; t < steps; ++t) {
            float k[ROWS], q[ROWS];
            const float4* k4 = reinterpret_cast<const float4*>(&sk[buf][t][rg * RP]);
            const float4* q4 = reinterpret_cast<const float4*>(&sq[buf][t][rg * RP]);
#pragma unroll
            for (int i = 0; i < ROWS / 4; ++i) {
                const float4 a = k4[i], bq = q4[i];
                k[4 * i] = a.x; k[4 * i + 1] = a.y; k[4 * i + 2] = a.z; k[4 * i + 3] = a.w;
                q[4 * i] = bq.x; q[4 * i + 1] = bq.y; q[4 * i + 2] = bq.z; q[4 * i + 3] = bq.w;
            }
            float dots[2 * CPL];
#pragma unroll
            for (int j = 0; j < CPL; ++j) {
                float ak0 = 0.f, ak1 = 0.f, aq0 = 0.f, aq1 = 0.f;
#pragma unroll
                for (int i = 0; i < ROWS; i += 2) {
                    ak0 += k[i] * S[i][j];
                    aq0 += q[i] * S[i][j];
                    ak1 += k[i + 1] * S[i + 1][j];
                    aq1 += q[i + 1] * S[i + 1][j];
                }
                dots[j] = ak0 + ak1;
                dots[CPL + j] = aq0 + aq1;
            }
#pragma unroll
            for (int o = RG / 2; o > 0; o >>= 1)
#pragma unroll
                for (int j = 0; j < 2 * CPL; ++j)
                    dots[j] += __shfl_xor_sync(0xffffffffu, dots[j], o);
            const float alpha = salpha[buf][t];
            const float bt = sbeta[buf][t];
            const float qk = sqk[buf][t];
#pragma unroll
            for (int j = 0; j < CPL; ++j) {
                const float e = (sv[buf][t][wcol + j] - alpha * dots[j]) * bt;
                const float o = alpha * dots[CPL + j] + qk * e;
                const int col = tile0 + wcol + j;
                if (rg == 0 && wcol + j < tile_cols)
                    out[((tok0 + c * TC + t) * Hv + h) * (int64_t)dv + col] = o;
#pragma unroll
                for (int i = 0; i < ROWS; ++i) S[i][j] = alpha * S[i][j] + k[i] * e;
            }
        }
        __syncthreads();  // the buffer is refilled by the next iteration's stage()
    }

    // The final state tile, through shared memory for coalesced writes (the stage is free: the
    // last barrier above follows the last step); none where the caller keeps no state (s1 null,
    // the same for every thread of the block).
    if (s1 == nullptr) return;
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < CPL; ++j) tile[(rg * ROWS + i) * BC + wcol + j] = S[i][j];
    __syncthreads();
    {
        float* dst = s1 + ((int64_t)b * Hv + h) * DK * dv + tile0;
        for (int e = threadIdx.x; e < DK * BC; e += NT) {
            const int r = e / BC, j = e % BC;
            if (j < tile_cols) dst[(int64_t)r * dv + j] = tile[e];
        }
    }
}

}  // namespace

// Columns per lane and warps per block (the Rust launcher uses the defaults): a block owns
// 4·GDN_CPL·GDN_WARPS value columns.
#ifndef GDN_CPL
#define GDN_CPL 2
#endif
#ifndef GDN_WARPS
#define GDN_WARPS 4
#endif

// One entry point per supported key-head dim (DK = 8·ROWS). Launch: grid
// (B·Hv, ceil(dv / (4·GDN_CPL·GDN_WARPS))), block 32·GDN_WARPS threads.
#define GDN_ENTRY(NAME, ROWS)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * GDN_WARPS)                                  \
        NAME(const float* __restrict__ qkv, const float* __restrict__ beta,                      \
             const float* __restrict__ g, const float* __restrict__ s0,                          \
             const int32_t* __restrict__ slot_of_row, float* __restrict__ out,                   \
             float* __restrict__ s1, int L, int Hk, int Hv, int dv, float q_scale, float eps) {  \
        gdn_recurrent_body<ROWS, GDN_CPL, GDN_WARPS>(qkv, beta, g, s0, slot_of_row, out, s1, L, Hk, Hv, dv,    \
                                       q_scale, eps);                                            \
    }

GDN_ENTRY(gdn_recurrent_dk32, 4)
GDN_ENTRY(gdn_recurrent_dk64, 8)
GDN_ENTRY(gdn_recurrent_dk128, 16)
GDN_ENTRY(gdn_recurrent_dk256, 32)

// Causal depthwise conv + SiLU of a Gated DeltaNet layer, with its conv state (what
// backends/src/candle/gated_deltanet/conv.rs computes with separate candle ops):
//
//   x = [state (Kc−1 rows) ; p (L rows)] per row b,   out[b, t, c] = SiLU(Σ_j w[c, j]·x[b, t + j, c])
//   new_state[b, i, c] = x[b, len_b + i, c]  (the Kc−1 inputs ending at row b's last real token)
//
// Layout (f32, contiguous): p (B, L, Cc), state (B, Kc−1, Cc), w (Cc, Kc), lens (B) int32 (the
// real tokens of each row; nullptr: all L) -> out (B, L, Cc), new_state (B, Kc−1, Cc).
// Outputs at right-padded positions (t ≥ len_b) are unspecified, as in the candle path.
// Launch: grid (ceil(Cc / blockDim.x), any number of row blocks ≤ 65,535), 1-D blocks. A thread
// owns one channel and takes runs of CONV_ROWS consecutive rows (the B·L output rows, then the
// B·(Kc−1) state rows), so consecutive threads touch consecutive channels (coalesced), a block
// has enough work to pay for its launch, and the index arithmetic is 32-bit (a flat 64-bit
// element index cost three 64-bit divisions per element). Measured: no change in the layer's
// conv time (4.5–5.4 ms per 4B decision across runs, within noise).
constexpr int CONV_ROWS = 16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename TP>
__device__ void causal_conv_silu_body(const TP* __restrict__ p,
                                                const float* __restrict__ state,
                                                const float* __restrict__ w,
                                                const int32_t* __restrict__ lens,
                                                float* __restrict__ out,
                                                float* __restrict__ new_state, int B, int L,
                                                int Cc, int Kc) {
    const int keep = Kc - 1;
    const int rows_out = B * L, rows = B * L + B * keep;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= Cc) return;
    // x[b, s, c] for s in [0, Kc−1+L): state rows first, then p.
    auto x = [&](int b, int s) -> float {
        return s < keep ? state[((int64_t)b * keep + s) * Cc + c]
                        : to_f32(p[((int64_t)b * L + (s - keep)) * Cc + c]);
    };
    for (int y0 = blockIdx.y * CONV_ROWS; y0 < rows; y0 += gridDim.y * CONV_ROWS) {
        const int y1 = min(y0 + CONV_ROWS, rows);
        for (int y = y0; y < y1; ++y) {
            if (y < rows_out) {
                const int b = y / L, t = y - b * L;
                float acc = 0.f;
                for (int j = 0; j < Kc; ++j) acc += w[(int64_t)c * Kc + j] * x(b, t + j);
                out[(int64_t)y * Cc + c] = acc / (1.f + expf(-acc));
            } else {
                const int f = y - rows_out;
                const int b = f / keep, i = f - b * keep;
                const int len = lens ? lens[b] : L;
                new_state[(int64_t)f * Cc + c] = x(b, len + i);
            }
        }
    }
}

extern "C" __global__ void gdn_causal_conv_silu(const float* p, const float* state, const float* w,
                                                const int32_t* lens, float* out, float* new_state,
                                                int B, int L, int Cc, int Kc) {
    causal_conv_silu_body(p, state, w, lens, out, new_state, B, L, Cc, Kc);
}

// p straight from the bf16 projection (exact upcast: same values as the f32 variant).
extern "C" __global__ void gdn_causal_conv_silu_bf16(const __nv_bfloat16* p, const float* state,
                                                     const float* w, const int32_t* lens,
                                                     float* out, float* new_state, int B, int L,
                                                     int Cc, int Kc) {
    causal_conv_silu_body(p, state, w, lens, out, new_state, B, L, Cc, Kc);
}

// The same conv + SiLU with two adjacent channels per thread and a sliding window in registers:
// a thread owns channels (c, c + 1) of one batch row over a run of CONV_RUN consecutive tokens,
// reads each input once (a bf16 pair or a float2), keeps the last KC inputs in registers and
// writes a float2 per token; the sums are taken in the same order as causal_conv_silu_body
// (taps 0 … KC−1 from zero), so the outputs are bit-identical to it. The last row block of each
// batch row writes that row's new state. A row may start from another row's state:
// slot_of_row (B) int32 picks the state row of each batch row (nullptr: row b reads state row
// b), so a scoring pass forked from S retained states needs no gathered copy of them.
// A packed input needs no padded copy: with row_start (B) int32, batch row b's tokens are read
// from p at rows row_start[b] … row_start[b] + lens[b] − 1 of a (T, Cc) input (tokens of several
// prefixes back to back) and positions past lens[b] read as zeros — exactly what a right-padded
// copy holds, so the outputs are bit-identical to the padded call's; out stays (B, L, Cc).
// nullptr: row b starts at b · L.
// Needs Cc even and p, out 8-byte aligned (the launcher checks), 2 ≤ Kc ≤ 8.
// Launch: grid (ceil(Cc / (2 · blockDim.x)), ceil(L / CONV_RUN) + 1, B), 1-D blocks.
constexpr int CONV_RUN = 16;

__device__ __forceinline__ float2 load_pair(const float* p) {
    return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

template <typename TP, int KC>
__device__ void conv_pairs_body(const TP* __restrict__ p, const float* __restrict__ state,
                                const float* __restrict__ w, const int32_t* __restrict__ lens,
                                const int32_t* __restrict__ slot_of_row,
                                const int32_t* __restrict__ row_start, float* __restrict__ out,
                                float* __restrict__ new_state, int L, int Cc) {
    constexpr int keep = KC - 1;
    const int c = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= Cc) return;
    const int b = blockIdx.z;
    const int sb = slot_of_row ? slot_of_row[b] : b;
    const int len = lens ? lens[b] : L;
    const float* st = state + (int64_t)sb * keep * Cc + c;
    const TP* pb = p + (row_start ? (int64_t)row_start[b] : (int64_t)b * L) * Cc + c;
    // x(s) for s in [0, keep + L): the state rows first, then p (zeros past the row's length
    // when it is read from a packed input).
    auto x = [&](int s) -> float2 {
        if (s < keep) return make_float2(st[(int64_t)s * Cc], st[(int64_t)s * Cc + 1]);
        if (row_start && s - keep >= len) return make_float2(0.f, 0.f);
        return load_pair(pb + (int64_t)(s - keep) * Cc);
    };
    const int runs = (L + CONV_RUN - 1) / CONV_RUN;
    if ((int)blockIdx.y == runs) {
#pragma unroll
        for (int i = 0; i < keep; ++i) {
            const float2 v = x(len + i);
            float* dst = new_state + ((int64_t)b * keep + i) * Cc + c;
            dst[0] = v.x;
            dst[1] = v.y;
        }
        return;
    }
    float w0[KC], w1[KC];
#pragma unroll
    for (int j = 0; j < KC; ++j) {
        w0[j] = w[(int64_t)c * KC + j];
        w1[j] = w[(int64_t)(c + 1) * KC + j];
    }
    const int t0 = blockIdx.y * CONV_RUN, t1 = min(t0 + CONV_RUN, L);
    float2 win[KC];
#pragma unroll
    for (int j = 0; j < keep; ++j) win[j] = x(t0 + j);
    float* ob = out + (int64_t)b * L * Cc + c;
    for (int t = t0; t < t1; ++t) {
        win[keep] = x(t + keep);
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int j = 0; j < KC; ++j) {
            a0 += w0[j] * win[j].x;
            a1 += w1[j] * win[j].y;
        }
        *reinterpret_cast<float2*>(ob + (int64_t)t * Cc) =
            make_float2(a0 / (1.f + expf(-a0)), a1 / (1.f + expf(-a1)));
#pragma unroll
        for (int j = 0; j < keep; ++j) win[j] = win[j + 1];
    }
}

template <typename TP>
__device__ void conv_pairs(const TP* p, const float* state, const float* w, const int32_t* lens,
                           const int32_t* slot_of_row, const int32_t* row_start, float* out,
                           float* new_state, int L, int Cc, int Kc) {
    switch (Kc) {
        case 2: conv_pairs_body<TP, 2>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        case 3: conv_pairs_body<TP, 3>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        case 4: conv_pairs_body<TP, 4>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        case 5: conv_pairs_body<TP, 5>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        case 6: conv_pairs_body<TP, 6>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        case 7: conv_pairs_body<TP, 7>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        case 8: conv_pairs_body<TP, 8>(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc); break;
        default: break;  // the launcher takes the per-channel kernel for other widths
    }
}

extern "C" __global__ void gdn_conv_pairs(const float* p, const float* state, const float* w,
                                          const int32_t* lens, const int32_t* slot_of_row,
                                          const int32_t* row_start, float* out, float* new_state,
                                          int L, int Cc, int Kc) {
    conv_pairs(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc, Kc);
}

extern "C" __global__ void gdn_conv_pairs_bf16(const __nv_bfloat16* p, const float* state,
                                               const float* w, const int32_t* lens,
                                               const int32_t* slot_of_row,
                                               const int32_t* row_start, float* out,
                                               float* new_state, int L, int Cc, int Kc) {
    conv_pairs(p, state, w, lens, slot_of_row, row_start, out, new_state, L, Cc, Kc);
}
