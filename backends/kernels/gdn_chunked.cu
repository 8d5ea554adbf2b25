// The gated delta rule of a Gated DeltaNet layer in chunked (WY) form on the GPU, for prefill:
// the same function as the token-by-token kernel (gdn_recurrent.cu) and as the candle chunked
// path (backends/src/candle/gated_deltanet/chunked.rs, transformers' torch_chunk_gated_delta_rule),
// with the sequential dependency cut from L token steps to L/64 chunk steps.
//
// Per chunk of C = 64 tokens (q̂ = q·rsqrt(Σq² + eps)·scale, k̂ = k·rsqrt(Σk² + eps), Γ the
// in-chunk cumulative sum of the log-decays g, zero-padded past L):
//   A   = strictly_lower(β_i k̂_i·k̂_j e^{Γ_i − Γ_j})            T = (I + A)^{-1}
//   W   = T (β ⊙ e^Γ ⊙ K̂)        U = T (β ⊙ V)
//   Aqk = lower_incl(q̂_i·k̂_j e^{Γ_i − Γ_j})   Qg = q̂ ⊙ e^Γ   Kd = k̂ ⊙ e^{Γ_last − Γ}
// then, chunk after chunk, with the state S (DK × dv):
//   V' = U − W S;   O = Qg S + Aqk V';   S ← e^{Γ_last} S + Kdᵀ V'
//
// Dynamic shared memory: prep (2·C·(DK+1) + C·(C+1) + 3·C + C·dv) floats, scan
// (DK·32 + C·DK + C·32 + C·C) floats (both need the opt-in above 48 KiB).
// Kernel 1 (gdn_chunk_prep_dk*): one block per (chunk, value head, row), all chunks in parallel,
// writes W, U, Aqk, Qg, Kd and e^{Γ_last} to a workspace. Kernel 2 (gdn_chunk_scan_dk*): one block
// per (column tile of 32 value columns, value head, row) runs the chunks in order with its tile of
// S in shared memory and writes the outputs and the final state. All arithmetic in f32.
//
// Layout (f32, row-major, contiguous), as gdn_recurrent.cu:
//   qkv (B, L, Cc) = [q heads | k heads | v heads], beta, g (B, L, Hv), s0 (S, Hv, DK, dv) with
//   slot_of_row (B) int32 or nullptr, out (B, L, Hv, dv), s1 (B, Hv, DK, dv).
//   Workspace per (row, head, chunk): W (C·DK) | Qg (C·DK) | Kd (C·DK) | U (C·dv) | Aqk (C·C) | dec.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int C = 64;        // tokens per chunk
constexpr int NT = 256;      // threads per block
constexpr int TILE = 32;     // value columns per scan block

__host__ __device__ constexpr int64_t ws_per_chunk(int dk, int dv) {
    return (int64_t)C * dk * 3 + (int64_t)C * dv + (int64_t)C * C + 1;
}

template <int DK>
__device__ void prep_body(const float* __restrict__ qkv, const float* __restrict__ beta,
                          const float* __restrict__ g, float* __restrict__ ws, int L, int Hk,
                          int Hv, int dv, float q_scale, float eps) {
    constexpr int P = DK + 1;  // padded row (bank conflicts)
    extern __shared__ float sm[];
    float* qs = sm;                 // [C][P]  q̂
    float* ks = qs + C * P;         // [C][P]  k̂
    float* A = ks + C * P;          // [C][C+1] A, then T
    float* Gs = A + C * (C + 1);    // [C] Γ
    float* Bs = Gs + C;             // [C] β
    float* BE = Bs + C;             // [C] β e^Γ
    float* Vs = BE + C;             // [C][dv] v
    const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int nc = gridDim.x;
    const int t0 = chunk * C;
    const int hk = h / (Hv / Hk);
    const int Cc = 2 * Hk * DK + Hv * dv;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    // q̂, k̂ of the chunk's tokens (zero past L), one warp per token
    for (int i = warp; i < C; i += NT / 32) {
        const int t = t0 + i;
        const float* row = qkv + ((int64_t)b * L + t) * Cc;
        float sq = 0.f, sk = 0.f;
        float qv[DK / 32], kv[DK / 32];
#pragma unroll
        for (int r = 0; r < DK / 32; ++r) {
            const int d = lane + 32 * r;
            qv[r] = t < L ? row[hk * DK + d] : 0.f;
            kv[r] = t < L ? row[Hk * DK + hk * DK + d] : 0.f;
            sq += qv[r] * qv[r];
            sk += kv[r] * kv[r];
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) {
            sq += __shfl_xor_sync(0xffffffffu, sq, o);
            sk += __shfl_xor_sync(0xffffffffu, sk, o);
        }
        const float iq = rsqrtf(sq + eps) * q_scale, ik = rsqrtf(sk + eps);
#pragma unroll
        for (int r = 0; r < DK / 32; ++r) {
            qs[i * P + lane + 32 * r] = qv[r] * iq;
            ks[i * P + lane + 32 * r] = kv[r] * ik;
        }
    }
    if (tid < C) {
        const int t = t0 + tid;
        Bs[tid] = t < L ? beta[((int64_t)b * L + t) * Hv + h] : 0.f;
        Gs[tid] = t < L ? g[((int64_t)b * L + t) * Hv + h] : 0.f;
    }
    __syncthreads();
    for (int e = tid; e < C * dv; e += NT) {
        const int j = e / dv, c = e % dv;
        const int t = t0 + j;
        Vs[e] = t < L ? qkv[((int64_t)b * L + t) * Cc + 2 * Hk * DK + h * dv + c] : 0.f;
    }
    if (tid == 0) {  // Γ: inclusive cumulative sum, in token order (as the candle path)
        float acc = 0.f;
        for (int i = 0; i < C; ++i) {
            acc += Gs[i];
            Gs[i] = acc;
        }
    }
    __syncthreads();
    if (tid < C) BE[tid] = Bs[tid] * expf(Gs[tid]);
    __syncthreads();

    float* wsb = ws + (((int64_t)b * Hv + h) * nc + chunk) * ws_per_chunk(DK, dv);
    float* W = wsb;
    float* Qg = W + C * DK;
    float* Kd = Qg + C * DK;
    float* U = Kd + C * DK;
    float* Aqk = U + C * dv;
    float* dec = Aqk + C * C;
    const float g_last = Gs[C - 1];

    // A (strictly lower) and Aqk (lower incl. diagonal)
    for (int e = tid; e < C * C; e += NT) {
        const int i = e / C, j = e % C;
        float kk = 0.f, qk = 0.f;
        if (j <= i) {
#pragma unroll 8
            for (int d = 0; d < DK; ++d) {
                kk += ks[i * P + d] * ks[j * P + d];
                qk += qs[i * P + d] * ks[j * P + d];
            }
        }
        const float decay = j <= i ? expf(Gs[i] - Gs[j]) : 0.f;
        A[i * (C + 1) + j] = j < i ? Bs[i] * kk * decay : 0.f;
        Aqk[e] = qk * decay;
    }
    __syncthreads();
    // T = (I + A)^{-1} in place (strictly lower part; the unit diagonal is implicit):
    // T[i][j] = −A[i][j] − Σ_{j<k<i} A[i][k] T[k][j], row after row
    for (int i = 1; i < C; ++i) {
        float v = 0.f;
        const int j = tid;
        if (j < i) {
            v = -A[i * (C + 1) + j];
            for (int k = j + 1; k < i; ++k) v -= A[i * (C + 1) + k] * A[k * (C + 1) + j];
        }
        __syncthreads();
        if (j < i) A[i * (C + 1) + j] = v;
        __syncthreads();
    }
    // W = T (β e^Γ K̂), Qg = q̂ e^Γ, Kd = k̂ e^{Γ_last − Γ}
    for (int e = tid; e < C * DK; e += NT) {
        const int i = e / DK, d = e % DK;
        float acc = BE[i] * ks[i * P + d];
        for (int j = 0; j < i; ++j) acc += A[i * (C + 1) + j] * BE[j] * ks[j * P + d];
        W[e] = acc;
        Qg[e] = qs[i * P + d] * expf(Gs[i]);
        Kd[e] = ks[i * P + d] * expf(g_last - Gs[i]);
    }
    // U = T (β V)
    for (int e = tid; e < C * dv; e += NT) {
        const int i = e / dv, c = e % dv;
        float acc = Bs[i] * Vs[i * dv + c];
        for (int j = 0; j < i; ++j) acc += A[i * (C + 1) + j] * Bs[j] * Vs[j * dv + c];
        U[e] = acc;
    }
    if (tid == 0) dec[0] = expf(g_last);
}

template <int DK>
__device__ void scan_body(const float* __restrict__ ws, const float* __restrict__ s0,
                          const int32_t* __restrict__ slot_of_row, float* __restrict__ out,
                          float* __restrict__ s1, int L, int Hv, int dv, int nc) {
    extern __shared__ float sm[];
    float* S = sm;                    // [DK][TILE]
    float* buf = S + DK * TILE;       // [C][DK]   W, then Qg, then Kd
    float* Vn = buf + C * DK;         // [C][TILE] V'
    float* Aq = Vn + C * TILE;        // [C][C]
    const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int c0 = tile * TILE;
    const int tid = threadIdx.x, tx = tid % TILE, ty = tid / TILE;  // ty in [0, 8)
    constexpr int RY = NT / TILE;     // 8 row groups
    const bool col_ok = c0 + tx < dv;
    const int slot = slot_of_row ? slot_of_row[b] : b;
    const float* S0 = s0 + ((int64_t)slot * Hv + h) * DK * dv;
    for (int d = ty; d < DK; d += RY) S[d * TILE + tx] = col_ok ? S0[(int64_t)d * dv + c0 + tx] : 0.f;
    for (int chunk = 0; chunk < nc; ++chunk) {
        const float* wsb = ws + (((int64_t)b * Hv + h) * nc + chunk) * ws_per_chunk(DK, dv);
        const float* W = wsb;
        const float* Qg = W + C * DK;
        const float* Kd = Qg + C * DK;
        const float* U = Kd + C * DK;
        const float* Aqk = U + C * dv;
        const float dec = Aqk[C * C];
        __syncthreads();  // S written, buf free
        for (int e = tid; e < C * DK; e += NT) buf[e] = W[e];
        __syncthreads();
        // V' = U − W S
        for (int i = ty; i < C; i += RY) {
            float acc = 0.f;
#pragma unroll 8
            for (int d = 0; d < DK; ++d) acc += buf[i * DK + d] * S[d * TILE + tx];
            Vn[i * TILE + tx] = (col_ok ? U[i * dv + c0 + tx] : 0.f) - acc;
        }
        __syncthreads();
        for (int e = tid; e < C * DK; e += NT) buf[e] = Qg[e];
        for (int e = tid; e < C * C; e += NT) Aq[e] = Aqk[e];
        __syncthreads();
        // O = Qg S + Aqk V'
        for (int i = ty; i < C; i += RY) {
            float acc = 0.f;
#pragma unroll 8
            for (int d = 0; d < DK; ++d) acc += buf[i * DK + d] * S[d * TILE + tx];
            for (int j = 0; j <= i; ++j) acc += Aq[i * C + j] * Vn[j * TILE + tx];
            const int t = chunk * C + i;
            if (col_ok && t < L) out[(((int64_t)b * L + t) * Hv + h) * dv + c0 + tx] = acc;
        }
        __syncthreads();
        for (int e = tid; e < C * DK; e += NT) buf[e] = Kd[e];
        __syncthreads();
        // S ← e^{Γ_last} S + Kdᵀ V'
        for (int d = ty; d < DK; d += RY) {
            float acc = dec * S[d * TILE + tx];
#pragma unroll 8
            for (int j = 0; j < C; ++j) acc += buf[j * DK + d] * Vn[j * TILE + tx];
            S[d * TILE + tx] = acc;
        }
    }
    __syncthreads();
    float* S1 = s1 + ((int64_t)b * Hv + h) * DK * dv;
    if (col_ok)
        for (int d = ty; d < DK; d += RY) S1[(int64_t)d * dv + c0 + tx] = S[d * TILE + tx];
}

}  // namespace

#define GDN_CHUNK_KERNELS(DK)                                                                      \
    extern "C" __global__ void __launch_bounds__(NT) gdn_chunk_prep_dk##DK(                      \
        const float* qkv, const float* beta, const float* g, float* ws, int L, int Hk, int Hv,   \
        int dv, float q_scale, float eps) {                                                      \
        prep_body<DK>(qkv, beta, g, ws, L, Hk, Hv, dv, q_scale, eps);                            \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(NT) gdn_chunk_scan_dk##DK(                      \
        const float* ws, const float* s0, const int32_t* slot_of_row, float* out, float* s1,     \
        int L, int Hv, int dv, int nc) {                                                         \
        scan_body<DK>(ws, s0, slot_of_row, out, s1, L, Hv, dv, nc);                              \
    }

GDN_CHUNK_KERNELS(32)
GDN_CHUNK_KERNELS(64)
GDN_CHUNK_KERNELS(128)
