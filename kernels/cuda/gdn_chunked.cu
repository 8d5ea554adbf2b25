// The gated delta rule of a Gated DeltaNet layer in chunked (WY) form on the GPU, for prefill:
// the same function as the token-by-token kernel (gdn_recurrent.cu) and as the candle chunked
// path (backends/src/candle/gated_deltanet/chunked.rs, transformers' torch_chunk_gated_delta_rule),
// with the sequential dependency cut from L token steps to L/64 chunk steps and every product of
// matrices on the tensor cores (WMMA, TF32 inputs with f32 accumulation; the state and all
// element-wise work stay f32).
//
// Per chunk of C = 64 tokens (q̂ = q·rsqrt(Σq² + eps)·scale, k̂ = k·rsqrt(Σk² + eps), Γ the
// in-chunk cumulative sum of the log-decays g, zero-padded past L):
//   A   = strictly_lower(β_i k̂_i·k̂_j e^{Γ_i − Γ_j})            T = (I + A)^{-1}
//   W   = T (β ⊙ e^Γ ⊙ K̂)        U = T (β ⊙ V)
//   Aqk = lower_incl(q̂_i·k̂_j e^{Γ_i − Γ_j})   Qg = q̂ ⊙ e^Γ   Kd = k̂ ⊙ e^{Γ_last − Γ}
// then, chunk after chunk, with the state S (DK × dv):
//   V' = U − W S;   O = Qg S + Aqk V';   S ← e^{Γ_last} S + Kdᵀ V'
//
// Kernel 1 (gdn_chunk_prep_dk*): one block per (chunk, value head, row), all chunks in parallel:
// K̂K̂ᵀ and Q̂K̂ᵀ on the tensor cores, the unit-lower-triangular inverse by forward substitution
// in shared memory (f32), then W and U as tensor-core products with T, written to a workspace.
// Kernel 2 (gdn_chunk_scan_dk*): one block per (tile of 32 value columns, value head, row) runs
// the chunks in order with its tile of S in shared memory (f32): the three products per chunk on
// the tensor cores, fragments of W, Qg, Kd, U and Aqk read straight from the workspace.
//
// Requirements (the Rust launcher checks them and otherwise runs gdn_recurrent.cu): DK ∈ {32, 64,
// 128}, dv a multiple of 16. TF32 rounds the matrix inputs to 10 mantissa bits, so the outputs
// differ from the f32 recurrence by ~1e-3 relative: the launcher takes this form only when the
// model computes in bf16 / f16 (whose own rounding is coarser), never for f32 models.
//
// Dynamic shared memory (floats): prep max(C·(DK+8), 2·C·(C+4)) + C·(DK+8) +
// max(C·(dv+8), 2·C·(C+4)) + 5·C (regions reused: two blocks per SM at DK = dv = 128); scan
// DK·(T+8) + 3·C·(T+8) + 3·C·(DK+8) + C·(C+8) with T = 32 (the chunk's W, Qg, Kd, Aqk and U
// tile are copied in asynchronously while the previous chunk computes).
//
// Layout (f32, row-major, contiguous), as gdn_recurrent.cu:
//   qkv (B, L, Cc) = [q heads | k heads | v heads], beta, g (B, L, Hv), s0 (S, Hv, DK, dv) with
//   slot_of_row (B) int32 or nullptr, out (B, L, Hv, dv), s1 (B, Hv, DK, dv) or nullptr (the final
//   state not written).
//   Workspace per (row, head, chunk), padded to a multiple of 8 floats (WMMA pointers must be
//   32-byte aligned): W (C·DK) | Qg (C·DK) | Kd (C·DK) | U (C·dv) | Aqk (C·C) | dec.

#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

namespace {

using namespace nvcuda;

constexpr int C = 64;        // tokens per chunk
constexpr int NT = 256;      // threads per block (8 warps)
constexpr int WARPS = NT / 32;
#ifndef GDN_SCAN_TILE
#define GDN_SCAN_TILE 32
#endif
constexpr int TILE = GDN_SCAN_TILE;  // value columns per scan block (16 or 32)
// The scan's warps: one per 16 × 16 tile of a chunk's C × TILE block of V' and O.
constexpr int SCAN_WARPS = (C / 16) * (TILE / 16);
constexpr int SCAN_NT = 32 * SCAN_WARPS;
constexpr int PC = C + 8;    // padded row of a C × C matrix in the scan's shared memory
constexpr int PCT = C + 4;   // the same in prep (keeps its three regions at 2 · C · PCT each)
constexpr int SLD = TILE + 8;  // padded row of a scan tile

__host__ __device__ constexpr int64_t ws_per_chunk(int dk, int dv) {
    return ((int64_t)C * dk * 3 + (int64_t)C * dv + (int64_t)C * C + 1 + 7) / 8 * 8;
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

template <typename F>
__device__ __forceinline__ void tf32(F& f) {
#pragma unroll
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

template <typename F>
__device__ __forceinline__ void tf32_neg(F& f) {
#pragma unroll
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(-f.x[i]);
}

// acc += Σ_k A_k · B_k over `steps` k-steps of 8 on the tensor cores (TF32): A_k is the fragment
// at a + k·a_step (leading dimension lda), B_k the one at b + k·b_step (ldb); the fragment
// types say whether each side is read row- or column-major.
template <typename FA, typename FB>
__device__ __forceinline__ void mma_steps(FragC& acc, const float* a, int lda, int a_step,
                                          const float* b, int ldb, int b_step, int steps) {
#pragma unroll 4
    for (int k = 0; k < steps; ++k) {
        FA fa;
        FB fb;
        wmma::load_matrix_sync(fa, a + k * a_step, lda);
        wmma::load_matrix_sync(fb, b + k * b_step, ldb);
        tf32(fa);
        tf32(fb);
        wmma::mma_sync(acc, fa, fb, acc);
    }
}

template <int DK>
__device__ void prep_body(const float* __restrict__ qkv, const float* __restrict__ beta,
                          const float* __restrict__ g, float* __restrict__ ws, int L, int Hk,
                          int Hv, int dv, float q_scale, float eps) {
    constexpr int PK = DK + 8;      // padded row of q̂ / k̂
    const int PV = dv + 8;          // padded row of v
    // Three regions, reused as the kernel goes, so that two blocks fit one SM (Qwen3.5-4B:
    // 3 × 34 KiB): R1 q̂, then A | T; R2 k̂, then β e^Γ k̂; R3 Q̂K̂ᵀ | K̂K̂ᵀ, then v, then β v.
    constexpr int R1 = C * PK > 2 * C * PCT ? C * PK : 2 * C * PCT;
    const int R3 = C * PV > 2 * C * PCT ? C * PV : 2 * C * PCT;
    extern __shared__ __align__(32) float sm[];
    float* qs = sm;                 // R1: [C][PK]  q̂
    float* A = sm;                  // R1: [C][PCT] A (once q̂ is spent)
    float* T = sm + C * PCT;        // R1: [C][PCT] T = (I + A)^{-1}
    float* ks = sm + R1;            // R2: [C][PK]  k̂, later β e^Γ k̂
    float* Aq = ks + C * PK;        // R3: [C][PCT] Q̂K̂ᵀ
    float* KK = Aq + C * PCT;       // R3: [C][PCT] K̂K̂ᵀ
    float* Vs = Aq;                 // R3: [C][PV]  v (once the products are spent), later β v
    float* Gs = Aq + R3;            // [C] Γ
    float* Bs = Gs + C;             // [C] β
    float* BE = Bs + C;             // [C] β e^Γ
    float* EG = BE + C;             // [C] e^Γ
    float* EL = EG + C;             // [C] e^{Γ_last − Γ}
    const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int nc = gridDim.x;
    const int t0 = chunk * C;
    const int hk = h / (Hv / Hk);
    const int Cc = 2 * Hk * DK + Hv * dv;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    // q and k of the chunk's tokens (zero past L), all copies in flight at once
    for (int e = tid; e < C * (2 * DK) / 4; e += NT) {
        const int i = e / (2 * DK / 4), c = 4 * (e % (2 * DK / 4));
        const int t = t0 + i;
        const bool ok = t < L;
        const float* row = qkv + ((int64_t)b * L + (ok ? t : 0)) * Cc;
        float* dst = c < DK ? qs + i * PK + c : ks + i * PK + (c - DK);
        const float* src = c < DK ? row + hk * DK + c : row + Hk * DK + hk * DK + (c - DK);
        __pipeline_memcpy_async(dst, src, 16, ok ? 0 : 16);
    }
    __pipeline_commit();
    // Γ: inclusive cumulative sum of g over the chunk (warp 0: two halves of 32 tokens)
    if (warp == 0) {
        float lo, hi;
        {
            const int t = t0 + lane;
            lo = t < L ? g[((int64_t)b * L + t) * Hv + h] : 0.f;
            Bs[lane] = t < L ? beta[((int64_t)b * L + t) * Hv + h] : 0.f;
        }
        {
            const int t = t0 + 32 + lane;
            hi = t < L ? g[((int64_t)b * L + t) * Hv + h] : 0.f;
            Bs[32 + lane] = t < L ? beta[((int64_t)b * L + t) * Hv + h] : 0.f;
        }
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            const float a = __shfl_up_sync(0xffffffffu, lo, o);
            const float c = __shfl_up_sync(0xffffffffu, hi, o);
            if (lane >= o) {
                lo += a;
                hi += c;
            }
        }
        hi += __shfl_sync(0xffffffffu, lo, 31);
        Gs[lane] = lo;
        Gs[32 + lane] = hi;
        __syncwarp();
        const float last = __shfl_sync(0xffffffffu, hi, 31);
        EG[lane] = expf(lo);
        EG[32 + lane] = expf(hi);
        EL[lane] = expf(last - lo);
        EL[32 + lane] = expf(last - hi);
        BE[lane] = Bs[lane] * EG[lane];
        BE[32 + lane] = Bs[32 + lane] * EG[32 + lane];
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    // q̂ = q·rsqrt(Σq² + eps)·scale, k̂ = k·rsqrt(Σk² + eps) in place, one warp per token
    for (int i = warp; i < C; i += WARPS) {
        float qv[DK / 32], kv[DK / 32];
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int r = 0; r < DK / 32; ++r) {
            qv[r] = qs[i * PK + lane + 32 * r];
            kv[r] = ks[i * PK + lane + 32 * r];
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
            qs[i * PK + lane + 32 * r] = qv[r] * iq;
            ks[i * PK + lane + 32 * r] = kv[r] * ik;
        }
    }
    __syncthreads();

    // K̂K̂ᵀ → KK and Q̂K̂ᵀ → Aq, lower 16 × 16 tiles only (the masks below zero the rest)
    for (int job = warp; job < 32; job += WARPS) {
        const int mat = job / 16, rt = (job % 16) / 4, ct = job % 4;
        if (ct > rt) continue;
        const float* left = mat ? qs : ks;
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
        mma_steps<FragA, FragBT>(acc, left + rt * 16 * PK, PK, 8, ks + ct * 16 * PK, PK, 8, DK / 8);
        wmma::store_matrix_sync((mat ? Aq : KK) + rt * 16 * PCT + ct * 16, acc, PCT,
                                wmma::mem_row_major);
    }
    __syncthreads();

    float* wsb = ws + (((int64_t)b * Hv + h) * nc + chunk) * ws_per_chunk(DK, dv);
    float* W = wsb;
    float* Qg = W + C * DK;
    float* Kd = Qg + C * DK;
    float* U = Kd + C * DK;
    float* Aqk = U + C * dv;
    float* dec = Aqk + C * C;
    const float g_last = Gs[C - 1];

    // Aqk (lower incl. diagonal) to the workspace; Qg = q̂ e^Γ, Kd = k̂ e^{Γ_last − Γ}
    for (int e = tid; e < C * C; e += NT) {
        const int i = e / C, j = e % C;
        Aqk[e] = j <= i ? Aq[i * PCT + j] * expf(Gs[i] - Gs[j]) : 0.f;
    }
    for (int e = tid; e < C * DK; e += NT) {
        const int i = e / DK, d = e % DK;
        Qg[e] = qs[i * PK + d] * EG[i];
        Kd[e] = ks[i * PK + d] * EL[i];
    }
    __syncthreads();  // q̂ spent: R1 takes A
    // A (strictly lower) = β_i K̂K̂ᵀ e^{Γ_i − Γ_j}
    for (int e = tid; e < C * C; e += NT) {
        const int i = e / C, j = e % C;
        A[i * PCT + j] = j < i ? Bs[i] * KK[i * PCT + j] * expf(Gs[i] - Gs[j]) : 0.f;
    }
    __syncthreads();  // the products spent: R3 takes v, copied in while T is solved
    for (int e = tid; e < C * dv / 4; e += NT) {
        const int i = e / (dv / 4), c = 4 * (e % (dv / 4));
        const int t = t0 + i;
        const bool ok = t < L;
        const float* row = qkv + ((int64_t)b * L + (ok ? t : 0)) * Cc;
        __pipeline_memcpy_async(Vs + i * PV + c, row + 2 * Hk * DK + h * dv + c, 16, ok ? 0 : 16);
    }
    __pipeline_commit();
    // T = (I + A)^{-1} (unit lower triangular), by 16 × 16 blocks M_ij of M = I + A:
    // the four diagonal blocks by forward substitution, one thread per column, in registers;
    // then, by distance from the diagonal, T_ij = −T_ii · Σ_{j≤k<i} A_ik T_kj.
    if (tid < C) {
        const int blk = tid / 16, j = tid % 16;
        const float* Ab = A + blk * 16 * PCT + blk * 16;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float v = r == j ? 1.f : 0.f;
#pragma unroll
            for (int k = 0; k < r; ++k) v -= Ab[r * PCT + k] * x[k];
            x[r] = v;
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) T[(blk * 16 + r) * PCT + blk * 16 + j] = x[r];
    } else {
        // the upper blocks of T are zero
        for (int e = tid - C; e < 6 * 256; e += NT - C) {
            const int blk = e / 256, r = (e % 256) / 16, c = e % 16;
            const int bi = blk < 3 ? 0 : blk < 5 ? 1 : 2;
            const int bj = blk < 3 ? 1 + blk : blk < 5 ? blk - 1 : 3;
            T[(bi * 16 + r) * PCT + bj * 16 + c] = 0.f;
        }
    }
    __syncthreads();
    for (int dist = 1; dist < 4; ++dist) {
        const int n = 4 - dist;  // blocks (i, i − dist), i = dist..3
        // P = Σ_{j≤k<i} A_ik T_kj, kept in the (free, zero) upper block (j, i) of A
        for (int e = tid; e < n * 256; e += NT) {
            const int i = dist + e / 256, j = i - dist, r = (e % 256) / 16, c = e % 16;
            float acc = 0.f;
            for (int k = j * 16; k < i * 16; ++k) acc += A[(i * 16 + r) * PCT + k] * T[k * PCT + j * 16 + c];
            A[(j * 16 + r) * PCT + i * 16 + c] = acc;
        }
        __syncthreads();
        // T_ij = −T_ii P
        for (int e = tid; e < n * 256; e += NT) {
            const int i = dist + e / 256, j = i - dist, r = (e % 256) / 16, c = e % 16;
            float acc = 0.f;
#pragma unroll
            for (int m = 0; m < 16; ++m)
                acc += T[(i * 16 + r) * PCT + i * 16 + m] * A[(j * 16 + m) * PCT + i * 16 + c];
            T[(i * 16 + r) * PCT + j * 16 + c] = -acc;
        }
        __syncthreads();
    }
    // the right-hand sides β e^Γ k̂ and β v
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int e = tid; e < C * DK; e += NT) {
        const int i = e / DK, d = e % DK;
        ks[i * PK + d] *= BE[i];
    }
    for (int e = tid; e < C * dv; e += NT) {
        const int i = e / dv, c = e % dv;
        Vs[i * PV + c] *= Bs[i];
    }
    if (tid == 0) dec[0] = expf(g_last);
    __syncthreads();

    // W = T (β e^Γ K̂)  (C × DK) and U = T (β V)  (C × dv); T is lower triangular, so row tile
    // rt only needs the first (rt + 1)·16 columns of T
    const int wt = DK / 16, ut = dv / 16;
    for (int job = warp; job < 4 * (wt + ut); job += WARPS) {
        const bool is_w = job < 4 * wt;
        const int j2 = is_w ? job : job - 4 * wt;
        const int cols = is_w ? wt : ut;
        const int rt = j2 / cols, ct = j2 % cols;
        const float* rhs = is_w ? ks : Vs;
        const int ld = is_w ? PK : PV;
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
        mma_steps<FragA, FragB>(acc, T + rt * 16 * PCT, PCT, 8, rhs + ct * 16, ld, 8 * ld, 2 * (rt + 1));
        if (is_w)
            wmma::store_matrix_sync(W + rt * 16 * DK + ct * 16, acc, DK, wmma::mem_row_major);
        else
            wmma::store_matrix_sync(U + rt * 16 * dv + ct * 16, acc, dv, wmma::mem_row_major);
    }
}

// Asynchronous copy of a rows × cols block of floats (cols a multiple of 4, 16-byte aligned rows)
// from global memory (row stride gs) to shared memory (row stride ss).
__device__ __forceinline__ void copy_async(float* dst, int ss, const float* src, int64_t gs,
                                           int rows, int cols) {
    const int q = cols / 4;
    for (int e = threadIdx.x; e < rows * q; e += SCAN_NT) {
        const int r = e / q, c = 4 * (e % q);
        __pipeline_memcpy_async(dst + r * ss + c, src + r * gs + c, 16);
    }
}

template <int DK>
__device__ void scan_body(const float* __restrict__ ws, const float* __restrict__ s0,
                          const int32_t* __restrict__ slot_of_row, float* __restrict__ out,
                          float* __restrict__ s1, int L, int Hv, int dv, int nc) {
    constexpr int PK = DK + 8;
    extern __shared__ __align__(32) float sm[];
    float* S = sm;                  // [DK][SLD] the state tile
    float* Vn = S + DK * SLD;       // [C][SLD]  V'
    float* Os = Vn + C * SLD;       // [C][SLD]  O
    float* Ws = Os + C * SLD;       // [C][PK]   W of the chunk
    float* Qs = Ws + C * PK;        // [C][PK]   Qg
    float* Ks = Qs + C * PK;        // [C][PK]   Kd
    float* As = Ks + C * PK;        // [C][PC]   Aqk
    float* Us = As + C * PC;        // [C][SLD]  the tile's columns of U
    const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int c0 = tile * TILE;
    const int tid = threadIdx.x, warp = tid / 32;
    const int slot = slot_of_row ? slot_of_row[b] : b;
    const int tile_cols = min(TILE, dv - c0);  // a multiple of 16 (dv is)
    const float* S0 = s0 + ((int64_t)slot * Hv + h) * DK * dv;
    for (int e = tid; e < DK * TILE; e += SCAN_NT) {
        const int d = e / TILE, j = e % TILE;
        S[d * SLD + j] = j < tile_cols ? S0[(int64_t)d * dv + c0 + j] : 0.f;
    }
    auto chunk_ws = [&](int chunk) {
        return ws + (((int64_t)b * Hv + h) * nc + chunk) * ws_per_chunk(DK, dv);
    };
    // Three groups of copies per chunk, each issued as soon as the previous chunk is done with
    // its buffers: G1 = W, Qg, U (read by step 1), G2 = Aqk (step 2), G3 = Kd (step 3). Past the
    // last chunk the groups are empty, so "all but the 2 newest groups done" always means "the
    // group this step needs has landed".
    auto issue = [&](int chunk, int group) {
        if (chunk < nc) {
            const float* W = chunk_ws(chunk);
            if (group == 1) {
                copy_async(Ws, PK, W, DK, C, DK);
                copy_async(Qs, PK, W + C * DK, DK, C, DK);
                copy_async(Us, SLD, W + 3 * C * DK + c0, dv, C, tile_cols);
            } else if (group == 2) {
                copy_async(As, PC, W + 3 * C * DK + C * dv, C, C, C);
            } else {
                copy_async(Ks, PK, W + 2 * C * DK, DK, C, DK);
            }
        }
        __pipeline_commit();
    };
    issue(0, 1);
    issue(0, 2);
    issue(0, 3);
    // the (row tile, column tile) of V' and O this warp computes: C/16 × TILE/16 = SCAN_WARPS
    const int rt = warp / (TILE / 16), ct = warp % (TILE / 16);
    const bool ct_ok = ct * 16 < tile_cols;
    for (int chunk = 0; chunk < nc; ++chunk) {
        const float dec = chunk_ws(chunk)[3 * C * DK + C * dv + C * C];
        __pipeline_wait_prior(2);
        __syncthreads();  // S written, G1 landed
        // step 1: V' = U − W S, and the first half of O = Qg S (shares the fragments of S);
        // even and odd k-steps accumulate apart, so four products are in flight
        FragC acc_o, acc_o2, acc, acc2;
        wmma::fill_fragment(acc_o, 0.f);
        wmma::fill_fragment(acc_o2, 0.f);
        wmma::fill_fragment(acc2, 0.f);
        if (ct_ok)
            wmma::load_matrix_sync(acc, Us + rt * 16 * SLD + ct * 16, SLD, wmma::mem_row_major);
        else
            wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int k = 0; k < DK / 8; k += 2) {
            FragA a, aq, a2, aq2;
            FragB bm, bm2;
            wmma::load_matrix_sync(bm, S + k * 8 * SLD + ct * 16, SLD);
            wmma::load_matrix_sync(a, Ws + rt * 16 * PK + k * 8, PK);
            wmma::load_matrix_sync(aq, Qs + rt * 16 * PK + k * 8, PK);
            wmma::load_matrix_sync(bm2, S + (k + 1) * 8 * SLD + ct * 16, SLD);
            wmma::load_matrix_sync(a2, Ws + rt * 16 * PK + (k + 1) * 8, PK);
            wmma::load_matrix_sync(aq2, Qs + rt * 16 * PK + (k + 1) * 8, PK);
            tf32(bm);
            tf32_neg(a);
            tf32(aq);
            tf32(bm2);
            tf32_neg(a2);
            tf32(aq2);
            wmma::mma_sync(acc, a, bm, acc);
            wmma::mma_sync(acc_o, aq, bm, acc_o);
            wmma::mma_sync(acc2, a2, bm2, acc2);
            wmma::mma_sync(acc_o2, aq2, bm2, acc_o2);
        }
#pragma unroll
        for (int i = 0; i < acc.num_elements; ++i) {
            acc.x[i] += acc2.x[i];
            acc_o.x[i] += acc_o2.x[i];
        }
        wmma::store_matrix_sync(Vn + rt * 16 * SLD + ct * 16, acc, SLD, wmma::mem_row_major);
        __syncthreads();  // V' complete; W, Qg, U free
        issue(chunk + 1, 1);
        __pipeline_wait_prior(2);
        __syncthreads();  // G2 landed
        // step 2: O += Aqk V'  (Aqk lower triangular: row tile rt needs (rt + 1)·16 columns)
        mma_steps<FragA, FragB>(acc_o, As + rt * 16 * PC, PC, 8, Vn + ct * 16, SLD, 8 * SLD,
                                2 * (rt + 1));
        wmma::store_matrix_sync(Os + rt * 16 * SLD + ct * 16, acc_o, SLD, wmma::mem_row_major);
        __syncthreads();  // O complete, every read of S and Aqk for this chunk done
        issue(chunk + 1, 2);
        __pipeline_wait_prior(2);
        __syncthreads();  // G3 landed
        for (int e = tid; e < C * TILE; e += SCAN_NT) {
            const int i = e / TILE, j = e % TILE;
            const int t = chunk * C + i;
            if (t < L && j < tile_cols)
                out[(((int64_t)b * L + t) * Hv + h) * dv + c0 + j] = Os[i * SLD + j];
        }
        // step 3: S ← e^{Γ_last} S + Kdᵀ V'  (DK/16 × TILE/16 tiles; Kdᵀ read column-major).
        // A warp's tiles (job warp + 8m) share their column of V', so one B fragment serves all.
        {
            constexpr int JOBS = (DK / 16) * (TILE / 16);
            constexpr int M = (JOBS + SCAN_WARPS - 1) / SCAN_WARPS;
            const int sc = warp % (TILE / 16);
            FragC sacc[M];
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const int job = warp + SCAN_WARPS * m;
                if (job < JOBS) {
                    wmma::load_matrix_sync(sacc[m], S + (job / (TILE / 16)) * 16 * SLD + sc * 16,
                                           SLD, wmma::mem_row_major);
#pragma unroll
                    for (int i = 0; i < sacc[m].num_elements; ++i) sacc[m].x[i] *= dec;
                }
            }
#pragma unroll
            for (int k = 0; k < C / 8; ++k) {
                FragB bm;
                wmma::load_matrix_sync(bm, Vn + k * 8 * SLD + sc * 16, SLD);
                tf32(bm);
#pragma unroll
                for (int m = 0; m < M; ++m) {
                    const int job = warp + SCAN_WARPS * m;
                    if (job < JOBS) {
                        FragAT a;
                        wmma::load_matrix_sync(a, Ks + k * 8 * PK + (job / (TILE / 16)) * 16, PK);
                        tf32(a);
                        wmma::mma_sync(sacc[m], a, bm, sacc[m]);
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const int job = warp + SCAN_WARPS * m;
                if (job < JOBS)
                    wmma::store_matrix_sync(S + (job / (TILE / 16)) * 16 * SLD + sc * 16, sacc[m],
                                            SLD, wmma::mem_row_major);
            }
        }
        __syncthreads();  // S updated; Kd free
        issue(chunk + 1, 3);
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    if (s1 == nullptr) return;  // the caller keeps no final state
    float* S1 = s1 + ((int64_t)b * Hv + h) * DK * dv;
    for (int e = tid; e < DK * TILE; e += SCAN_NT) {
        const int d = e / TILE, j = e % TILE;
        if (j < tile_cols) S1[(int64_t)d * dv + c0 + j] = S[d * SLD + j];
    }
}

}  // namespace

#define GDN_CHUNK_KERNELS(DK)                                                                      \
    extern "C" __global__ void __launch_bounds__(NT) gdn_chunk_prep_dk##DK(                      \
        const float* qkv, const float* beta, const float* g, float* ws, int L, int Hk, int Hv,   \
        int dv, float q_scale, float eps) {                                                      \
        prep_body<DK>(qkv, beta, g, ws, L, Hk, Hv, dv, q_scale, eps);                            \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(SCAN_NT) gdn_chunk_scan_dk##DK(                      \
        const float* ws, const float* s0, const int32_t* slot_of_row, float* out, float* s1,     \
        int L, int Hv, int dv, int nc) {                                                         \
        scan_body<DK>(ws, s0, slot_of_row, out, s1, L, Hv, dv, nc);                              \
    }

GDN_CHUNK_KERNELS(32)
GDN_CHUNK_KERNELS(64)
GDN_CHUNK_KERNELS(128)
