// Grouped-query attention of new tokens over a retained past plus themselves, without
// materialising the score matrix: the scores of one tile of keys live in registers, the softmax is
// the online (running max / running sum) form, and P·V accumulates in f32 registers. bf16 in,
// f32 accumulation and softmax, bf16 out.
//
// Computes what backends/src/candle/attention.rs computes (its candle path is the reference):
//
//   out[b, l, h·HD + d] = Σ_j softmax_j(q·k_j · HD^-½) v_j[d]
//
// over the keys j that query (b, h, l) sees, in this order: the past of row b's slot (keys
// past_start[b] .. P of slot b / (B/S); left padding before past_start[b] is hidden), then the
// row's own new keys 0 ..= l (causal) — or, for the nodes of a token tree packed into one
// sequence (parents first), only the new keys j <= l with tree[l·L + j] != 0 (the node itself and
// its ancestors). Query head h reads KV head h / G, G = H / Hkv.
//
// Layout (bf16, row-major, contiguous):
//   q       (B, H, L, HD)
//   k_new   (B, Hkv, L, HD)       v_new the same
//   k_past  (Hkv, S, P, HD)       v_past the same; nullptr when P == 0
//   past_start (B) int32          first visible past key per row; nullptr = 0 for every row
//   tree    (L, L) uint8          new key j visible to new query l; nullptr = causal. Every row's
//                                 visible keys must lie in 0 ..= l (parents come first).
//   seg_off (n_seg + 1) int32     varlen prefill (B == 1, no past): the new tokens are n_seg
//                                 segments packed back to back, segment s = positions
//                                 seg_off[s] .. seg_off[s+1]; each attends only to itself
//                                 (causal). nullptr = one segment of L tokens.
//   slot_past (S, 5) int64        the past as a table of S separately stored slots instead of
//                                 k_past / v_past: per slot its K and V addresses (KV head 0,
//                                 position 0), its own length P_s and its K and V head strides
//                                 in elements (positions HD apart). Row b reads slot b / (B/S),
//                                 all its keys visible. nullptr = k_past / v_past.
//   out     (B, L, H·HD)
//
// Batch invariance: a segment of a varlen call is computed by blocks laid out exactly as a solo
// call of that segment lays them out (query tiles and key tiles start at the segment's first
// position), and a slot of the table exactly as a solo call over that slot's stacked past (key
// tiles from position 0 of its own past), so both are bit-identical to the solo launches.
//
// Work decomposition: a block owns (row b, KV head, a tile of BM = 64 query rows), where the
// query rows of one KV head are its G query heads folded position-major (row m = l·G + g), so the
// G heads that share a KV head read each K/V tile once and a tile spans few positions (a tight
// causal bound). Each of the 4 warps owns 16 query rows; scores come from tensor-core
// mma.m16n8k16 (bf16 → f32) with the operands fetched by ldmatrix from padded shared memory
// (conflict-free), and the f32 score fragment is re-packed in registers as the A operand of P·V.
// The next K/V tile is fetched with cp.async while the current one is consumed (double buffer).

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int BM = 64;       // query rows per block
constexpr int WARPS = 4;     // 16 query rows per warp
constexpr int THREADS = 32 * WARPS;
constexpr int PAD = 8;       // bf16 of padding per shared row: 16 bytes, keeps ldmatrix conflict-free

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                            const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

// c += a · b, a 16×16 (row), b 16×8 (col), bf16 → f32.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Copy `rows` rows of HD bf16 (row stride HD in global) into shared rows of stride HD + PAD,
// zero-filling rows [rows, BN). 16-byte asynchronous copies.
template <int HD, int BN>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int rows) {
    constexpr int VEC = HD / 8;  // 16-byte vectors per row
    for (int i = threadIdx.x; i < BN * VEC; i += THREADS) {
        const int r = i / VEC, c = (i % VEC) * 8;
        __nv_bfloat16* d = dst + r * (HD + PAD) + c;
        if (r < rows) {
            __pipeline_memcpy_async(d, src + static_cast<size_t>(r) * HD + c, 16);
        } else {
            *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
        }
    }
}

template <int HD, int BN>
__device__ void flash_attn_body(const __nv_bfloat16* __restrict__ q,
                                const __nv_bfloat16* __restrict__ k_new,
                                const __nv_bfloat16* __restrict__ v_new,
                                const __nv_bfloat16* __restrict__ k_past,
                                const __nv_bfloat16* __restrict__ v_past,
                                const int32_t* __restrict__ past_start,
                                const uint8_t* __restrict__ tree,
                                const int32_t* __restrict__ seg_off, int n_seg,
                                const long long* __restrict__ slot_past,
                                __nv_bfloat16* __restrict__ out, int B, int H, int Hkv, int L,
                                int S, int P, float scale_log2) {
    constexpr int SR = HD + PAD;  // shared row stride (bf16)
    constexpr int NT = BN / 8;    // key n-tiles of a score tile
    constexpr int DT = HD / 8;    // output n-tiles
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // BM × SR
    __nv_bfloat16* sk = sq + BM * SR;                                // 2 × BN × SR
    __nv_bfloat16* sv = sk + 2 * BN * SR;                            // 2 × BN × SR

    const int G = H / Hkv;
    const int hkv = blockIdx.y, b = blockIdx.z;
    // LS: the position stride of q / k_new / v_new / out; base: this block's first position;
    // L becomes the length of the block's own segment.
    const int LS = L;
    int tile = blockIdx.x, base = 0;
    if (seg_off != nullptr) {
        int first = 0, s = 0;
        for (; s < n_seg; ++s) {
            const int tiles = (G * (seg_off[s + 1] - seg_off[s]) + BM - 1) / BM;
            if (tile < first + tiles) break;
            first += tiles;
        }
        if (s == n_seg) return;  // past the last segment's tiles (the grid is never larger)
        tile -= first;
        base = seg_off[s];
        L = seg_off[s + 1] - base;
    }
    const int rows_total = G * L;
    const int m0 = tile * BM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;

    // Query tile: row m = l·G + gh reads q[b, hkv·G + gh, l, :]; rows past the end are zero.
    for (int i = threadIdx.x; i < BM * (HD / 8); i += THREADS) {
        const int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
        const int m = m0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (m < rows_total) {
            const int l = m / G, gh = m % G;
            const size_t off =
                ((static_cast<size_t>(b) * H + hkv * G + gh) * LS + base + l) * HD + c;
            val = *reinterpret_cast<const uint4*>(q + off);
        }
        *reinterpret_cast<uint4*>(sq + r * SR + c) = val;
    }

    // The positions of this thread's two rows (g and g + 8 of its warp's 16).
    const int mr0 = m0 + warp * 16 + g, mr1 = mr0 + 8;
    const int l0 = mr0 / G, l1 = mr1 / G;
    // Keys of this block: the visible past, then new keys up to the block's last position.
    const int last_m = min(m0 + BM, rows_total) - 1;
    const int new_end = min(L, last_m / G + 1);
    // This block's past: a slot of the stacked (Hkv, S, P, HD) past, or of the slot table.
    const int slot = S > 0 ? b / (B / S) : 0;
    const __nv_bfloat16* kp = nullptr;
    const __nv_bfloat16* vp = nullptr;
    if (slot_past != nullptr) {
        const long long* e = slot_past + static_cast<size_t>(slot) * 5;
        P = static_cast<int>(e[2]);
        kp = reinterpret_cast<const __nv_bfloat16*>(e[0]) + static_cast<size_t>(hkv) * e[3];
        vp = reinterpret_cast<const __nv_bfloat16*>(e[1]) + static_cast<size_t>(hkv) * e[4];
    } else if (P > 0) {
        kp = k_past + (static_cast<size_t>(hkv) * S + slot) * P * HD;
        vp = v_past + (static_cast<size_t>(hkv) * S + slot) * P * HD;
    }
    const int start = (P > 0 && past_start != nullptr) ? past_start[b] : 0;
    const int past_first_tile = P > 0 ? start / BN : 0;
    const int past_tiles = P > 0 ? (P + BN - 1) / BN - past_first_tile : 0;
    const int new_tiles = (new_end + BN - 1) / BN;
    const int n_tiles = past_tiles + new_tiles;
    const __nv_bfloat16* kn = k_new + ((static_cast<size_t>(b) * Hkv + hkv) * LS + base) * HD;
    const __nv_bfloat16* vn = v_new + ((static_cast<size_t>(b) * Hkv + hkv) * LS + base) * HD;

    // Tile i covers keys [k0, k0 + BN) of the past (i < past_tiles) or of the new keys.
    auto tile_src = [&](int i, int& k0, int& rows, bool& is_past) {
        if (i < past_tiles) {
            is_past = true;
            k0 = (past_first_tile + i) * BN;
            rows = min(BN, P - k0);
        } else {
            is_past = false;
            k0 = (i - past_tiles) * BN;
            rows = min(BN, new_end - k0);
        }
    };
    auto issue = [&](int i, int buf) {
        int k0, rows;
        bool is_past;
        tile_src(i, k0, rows, is_past);
        const __nv_bfloat16* ks = (is_past ? kp : kn) + static_cast<size_t>(k0) * HD;
        const __nv_bfloat16* vs = (is_past ? vp : vn) + static_cast<size_t>(k0) * HD;
        load_tile<HD, BN>(sk + buf * BN * SR, ks, rows);
        load_tile<HD, BN>(sv + buf * BN * SR, vs, rows);
        __pipeline_commit();
    };

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};

    if (n_tiles > 0) issue(0, 0);
    for (int i = 0; i < n_tiles; ++i) {
        const int buf = i & 1;
        if (i + 1 < n_tiles) {
            issue(i + 1, buf ^ 1);
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        const __nv_bfloat16* ks = sk + buf * BN * SR;
        const __nv_bfloat16* vs = sv + buf * BN * SR;
        int k0, rows;
        bool is_past;
        tile_src(i, k0, rows, is_past);

        // S = Q · Kᵀ for the warp's 16 rows × BN keys.
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            uint32_t a0, a1, a2, a3;
            {
                const int mi = lane / 8;
                const int r = warp * 16 + (lane % 8) + (mi & 1) * 8;
                const int c = kk * 16 + (mi >> 1) * 8;
                ldmatrix_x4(a0, a1, a2, a3, sq + r * SR + c);
            }
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                uint32_t b0, b1, b2, b3;
                const int r = n * 8 + (lane % 8) + (lane / 16) * 8;
                const int c = kk * 16 + ((lane / 8) % 2) * 8;
                ldmatrix_x4(b0, b1, b2, b3, ks + r * SR + c);
                mma_bf16(s[n], a0, a1, a2, a3, b0, b1);
                mma_bf16(s[n + 1], a0, a1, a2, a3, b2, b3);
            }
        }

        // Mask, scale to log2 units, and the online softmax update of the two rows.
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = k0 + n * 8 + 2 * t + (e & 1);
                const int lrow = e < 2 ? l0 : l1;
                const bool visible =
                    j < k0 + rows &&
                    (is_past ? j >= start
                             : j <= lrow && (tree == nullptr ||
                                             (lrow < L && tree[static_cast<size_t>(lrow) * L + j])));
                const float v = visible ? s[n][e] * scale_log2 : -INFINITY;
                s[n][e] = v;
                tile_max[e >> 1] = fmaxf(tile_max[e >> 1], v);
            }
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = tile_max[r];
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float new_max = fmaxf(row_max[r], mx);
            // A row that has seen no visible key yet keeps max −inf: use 0 so exp2 gives 0, not NaN.
            const float base = new_max == -INFINITY ? 0.f : new_max;
            corr[r] = exp2f(row_max[r] - base);
            row_max[r] = new_max;
            tile_max[r] = base;
        }
        float tile_sum[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[n][e] - tile_max[e >> 1]);
                s[n][e] = p;
                tile_sum[e >> 1] += p;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * corr[r] + tile_sum[r];
#pragma unroll
        for (int d = 0; d < DT; ++d) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }

        // O += P · V: the score fragment of keys [16kk, 16kk + 16) is the A operand as is.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                uint32_t b0, b1, b2, b3;
                const int r = kk * 16 + (lane % 16);
                const int c = d * 8 + (lane / 16) * 8;
                ldmatrix_x4_trans(b0, b1, b2, b3, vs + r * SR + c);
                mma_bf16(o[d], a0, a1, a2, a3, b0, b1);
                mma_bf16(o[d + 1], a0, a1, a2, a3, b2, b3);
            }
        }
        __syncthreads();  // the buffer is refilled by the next iteration's issue
    }

    // Row sums over the quad, normalise, store bf16 pairs.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 1);
        row_sum[r] += __shfl_xor_sync(0xffffffff, row_sum[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int m = r == 0 ? mr0 : mr1;
        if (m >= rows_total) continue;
        const int l = m / G, gh = m % G;
        const float inv = row_sum[r] > 0.f ? 1.f / row_sum[r] : 0.f;
        __nv_bfloat16* dst =
            out + (static_cast<size_t>(b) * LS + base + l) * H * HD +
            static_cast<size_t>(hkv * G + gh) * HD;
#pragma unroll
        for (int d = 0; d < DT; ++d) {
            const uint32_t v = pack_bf16(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
            *reinterpret_cast<uint32_t*>(dst + d * 8 + 2 * t) = v;
        }
    }
}

}  // namespace

// Shared memory per block: (BM + 4·BN) rows of HD + PAD bf16 — see flash_attn_smem_bytes.
#define FLASH_ATTN_KERNEL(HD, BN)                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS) flash_attn_hd##HD(                   \
        const __nv_bfloat16* q, const __nv_bfloat16* k_new, const __nv_bfloat16* v_new,         \
        const __nv_bfloat16* k_past, const __nv_bfloat16* v_past, const int32_t* past_start,    \
        const uint8_t* tree, const int32_t* seg_off, int n_seg, const long long* slot_past,     \
        __nv_bfloat16* out, int B, int H, int Hkv, int L, int S, int P, float scale_log2) {     \
        flash_attn_body<HD, BN>(q, k_new, v_new, k_past, v_past, past_start, tree, seg_off,     \
                                n_seg, slot_past, out, B, H, Hkv, L, S, P, scale_log2);         \
    }

FLASH_ATTN_KERNEL(64, 64)
FLASH_ATTN_KERNEL(128, 64)
FLASH_ATTN_KERNEL(256, 32)
