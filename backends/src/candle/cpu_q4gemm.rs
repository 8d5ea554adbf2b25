//! 4-bit linear layers (`Q4_0`, `Q4_K`) on x86 CPUs as integer products: `y = x Wᵀ` with `W`
//! kept as its 4-bit values (two per byte) and, per block of 32 `k`, one scale and one offset,
//! packed once at load; `x` rounded on each call to 8-bit blocks of 32 exactly as the `Q8_0`
//! kernel rounds ([`super::cpu_qgemm`]: `d = max|x| / 127`, `q = round(x / d)`).
//!
//! Both formats dequantize, per block `b` of 32 `k` and column `c`, as `w = A·q − B` with
//! `q ∈ [0, 15]`:
//! - `Q4_0`: `A = d`, `B = 8·d` (`w = (q − 8)·d`);
//! - `Q4_K`: per sub-block of 32 of a 256-block, `A = d·scale`, `B = dmin·min` (6-bit `scale` and
//!   `min`, as ggml dequantizes).
//!
//! So with the activations `x ≈ dx·qx` per block, and `S = Σ_j q·qx`, `s = Σ_j qx` exact in
//! integers,
//!
//! `y[r][c] = Σ_b dx[r][b] · (A[c][b]·S[r][c][b] − B[c][b]·s[r][b])`
//!
//! one f32 `fmsub` and one `fma` per block after the integer sum. This is the product of the
//! dequantized weight and the rounded activations up to f32 rounding (tested), the "W4A8"
//! product llama.cpp's CPU kernels compute; for `Q4_K` the activations are rounded per 32
//! values rather than ggml's 256, which is finer.
//!
//! Why: candle's x86 `Q4_0` kernel takes one dot product per (row, column) and its `Q4_K`
//! kernel kept up with the f32 GEMM at best, so a `q4k` model ran slower than f32 (0.72–0.73× in
//! the CPU bench). Here the 4-bit values are unpacked in registers (`and` / shift) and
//! multiplied as unsigned bytes by the signed activations:
//! - AVX-512 VNNI: `vpdpbusd` (16 lanes × 4 products), tiles of 6 rows × 32 columns.
//! - AVX2: `vpmaddubsw` (pairs of products in 16 bits) summed over the block in 16 bits (at most
//!   16 · 15 · 127 = 30,480: exact), then `vpmaddwd` by ones once per block; tiles of 4 rows ×
//!   16 columns.
//! - AVX-VNNI (AVX2 CPUs with the 256-bit `vpdpbusd`): the VNNI sums on 8 lanes, tiles of 4 rows
//!   × 16 columns (one `vpdpbusd` where AVX2 takes a `vpmaddubsw` and an addition).
//!
//! Weight layout (one for both kernels): per panel of [`NR`] columns and block, four groups
//! `u` of 64 bytes, each 16 columns × 4 bytes, byte `j` of column `c` holding `q[4u + j]` in its
//! low half and `q[16 + 4u + j]` in its high half; then `A` and `B` per (panel, block, column).
//! Activations, per group of `MR` rows and block: eight broadcast units of four `i8` (values
//! `4g..4g+4`), the scale `dx` and the sum `s` per row.
//!
//! [`product_reference`] computes the same sums in plain Rust; the tests hold both kernels to
//! it bit for bit, and it to the dequantized product.

use candle_core::quantized::GgmlDType;
use candle_core::{Result, Tensor};

use super::cpu_aligned::Aligned;
use super::cpu_isa::Isa;
use super::cpu_panel::NR;
use super::cpu_qgemm::quantize_block_scalar;

/// `k` per block (of the activations, of `Q4_0`, of a `Q4_K` sub-block).
const BLOCK: usize = 32;
/// Bytes of one (panel, block): 16 columns × 32 values × 4 bits.
const PANEL_BLOCK: usize = NR * BLOCK / 2;
/// Bytes of one serialized `Q4_0` block: an f16 scale and 16 bytes of 4-bit values.
const Q4_0_BYTES: usize = 18;
/// Values per `Q4_K` block and bytes of one: f16 `d` and `dmin`, 12 bytes of 6-bit scales and
/// mins, 128 bytes of 4-bit values.
const Q4K_VALUES: usize = 256;
const Q4K_BYTES: usize = 144;
/// Rows per tile (AVX2 and AVX-VNNI; AVX-512).
const MR_AVX2: usize = 4;
const MR_AVX512: usize = 6;
/// Rows per block of the row loop (as the `Q8_0` kernel's).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MC: usize = 48;

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn mr(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 | Isa::AvxVnni => MR_AVX2,
        Isa::Avx512 => MR_AVX512,
    }
}

/// A `Q4_0` or `Q4_K` weight `W (n, k)` packed for the kernels (`k` a multiple of the format's
/// block; the last panel zero-padded, with zero `A` and `B`).
#[derive(Debug, Clone)]
pub(crate) struct PackedQ4 {
    n: usize,
    k: usize,
    isa: Isa,
    format: GgmlDType,
    /// `[panel][block][u][column][4]`, two 4-bit values per byte (see the module doc).
    q: Aligned<u8>,
    /// `[panel][block][column]`: `A`.
    a: Aligned<f32>,
    /// `[panel][block][column]`: `B`.
    b: Aligned<f32>,
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a `Q4_K` block's 12 packed bytes.
fn q4k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    match j < 4 {
        true => (s[j] & 63, s[j + 4] & 63),
        false => (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        ),
    }
}

/// One row's blocks of 32 as `(A, B, q[32])`, decoded from ggml's serialized form.
fn decode_row(format: GgmlDType, row: &[u8], mut put: impl FnMut(usize, f32, f32, [u8; BLOCK])) {
    let f16 = |lo: u8, hi: u8| half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32();
    match format {
        GgmlDType::Q4_0 => {
            for (b, blk) in row.chunks_exact(Q4_0_BYTES).enumerate() {
                let d = f16(blk[0], blk[1]);
                let mut q = [0u8; BLOCK];
                for (j, &v) in blk[2..].iter().enumerate() {
                    q[j] = v & 0x0F;
                    q[j + 16] = v >> 4;
                }
                put(b, d, 8.0 * d, q);
            }
        }
        _ => {
            for (sb, blk) in row.chunks_exact(Q4K_BYTES).enumerate() {
                let (d, dmin) = (f16(blk[0], blk[1]), f16(blk[2], blk[3]));
                let (scales, qs) = (&blk[4..16], &blk[16..]);
                // 64 values per 32 bytes: the low halves one sub-block, the high halves the next
                for (c, chunk) in qs.chunks_exact(32).enumerate() {
                    for half in 0..2 {
                        let j = 2 * c + half;
                        let (sc, m) = q4k_scale_min(scales, j);
                        let q = std::array::from_fn(|i| (chunk[i] >> (4 * half)) & 0x0F);
                        put(sb * 8 + j, d * sc as f32, dmin * m as f32, q);
                    }
                }
            }
        }
    }
}

impl PackedQ4 {
    /// Pack `Q4_0` or `Q4_K` blocks of `(n, k)` (candle's serialized form, per row) for `isa`.
    /// `None` for another format, a `k` that is not a multiple of its block, or a byte count
    /// that does not fit `(n, k)`.
    pub fn from_blocks(
        format: GgmlDType,
        bytes: &[u8],
        n: usize,
        k: usize,
        isa: Isa,
    ) -> Option<Self> {
        use rayon::prelude::*;
        let (values, block_bytes) = match format {
            GgmlDType::Q4_0 => (BLOCK, Q4_0_BYTES),
            GgmlDType::Q4K => (Q4K_VALUES, Q4K_BYTES),
            _ => return None,
        };
        if k == 0 || !k.is_multiple_of(values) || bytes.len() != n * (k / values) * block_bytes {
            return None;
        }
        let blocks = k / BLOCK;
        let row_bytes = (k / values) * block_bytes;
        let panels = n.div_ceil(NR);
        let mut q = Aligned::<u8>::zeroed(panels * blocks * PANEL_BLOCK);
        let mut a = Aligned::<f32>::zeroed(panels * blocks * NR);
        let mut b = Aligned::<f32>::zeroed(panels * blocks * NR);
        q.par_chunks_mut(blocks * PANEL_BLOCK)
            .zip(a.par_chunks_mut(blocks * NR))
            .zip(b.par_chunks_mut(blocks * NR))
            .enumerate()
            .for_each(|(p, ((q, a), b))| {
                for c in 0..NR.min(n - p * NR) {
                    let row = &bytes[(p * NR + c) * row_bytes..][..row_bytes];
                    decode_row(format, row, |blk, av, bv, vals| {
                        a[blk * NR + c] = av;
                        b[blk * NR + c] = bv;
                        let qb = &mut q[blk * PANEL_BLOCK..][..PANEL_BLOCK];
                        for (i, &v) in vals.iter().enumerate() {
                            let (u, j, high) = ((i % 16) / 4, i % 4, i >= 16);
                            qb[u * 64 + c * 4 + j] |= v << (4 * high as u8);
                        }
                    });
                }
            });
        Some(PackedQ4 {
            n,
            k,
            isa,
            format,
            q,
            a,
            b,
        })
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// `Q4_0` or `Q4_K`.
    pub fn format(&self) -> GgmlDType {
        self.format
    }

    /// The 4-bit value of `W[c][kk]` and its block's `(A, B)`.
    fn at(&self, c: usize, kk: usize) -> (u8, f32, f32) {
        let (p, c, blk, i) = (c / NR, c % NR, kk / BLOCK, kk % BLOCK);
        let pb = p * (self.k / BLOCK) + blk;
        let byte = self.q[pb * PANEL_BLOCK + ((i % 16) / 4) * 64 + c * 4 + i % 4];
        let q = (byte >> (4 * (i >= 16) as u8)) & 0x0F;
        (q, self.a[pb * NR + c], self.b[pb * NR + c])
    }

    /// `W` dequantized as ggml does (`Q4_0`: `(q − 8)·d`; `Q4_K`: `A·q − B`), `(n, k)`
    /// row-major.
    pub fn rows(&self) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for c in 0..self.n {
            w.extend((0..self.k).map(|kk| {
                let (q, a, b) = self.at(c, kk);
                match self.format {
                    GgmlDType::Q4_0 => (q as i32 - 8) as f32 * a,
                    _ => a * q as f32 - b,
                }
            }));
        }
        w
    }

    /// `gate` and `up` (each `(F, k)`, one format and kernel, `F` a positive multiple of 16)
    /// as one `(2F, k)` weight whose panels alternate: panel `2p` is gate's panel `p`, `2p + 1`
    /// up's. What [`swiglu`] reads; `None` when the two do not fit.
    pub fn gate_up(gate: &PackedQ4, up: &PackedQ4) -> Option<Self> {
        use super::cpu_tile_store::alternate;
        let (f, k) = (gate.n, gate.k);
        let same = (up.n, up.k, up.isa, up.format) == (f, k, gate.isa, gate.format);
        if f == 0 || !f.is_multiple_of(NR) || !same {
            return None;
        }
        let blocks = k / BLOCK;
        Some(PackedQ4 {
            n: 2 * f,
            k,
            isa: gate.isa,
            format: gate.format,
            q: alternate(&gate.q, &up.q, blocks * PANEL_BLOCK),
            a: alternate(&gate.a, &up.a, blocks * NR),
            b: alternate(&gate.b, &up.b, blocks * NR),
        })
    }

    /// The weights stacked along `out` (`[a; b; …]`): `None` for an empty list, differing
    /// `in`, formats or kernels, or a part other than the last whose row count is not a
    /// multiple of 16.
    pub fn stack(parts: &[&PackedQ4]) -> Option<Self> {
        let first = parts.first()?;
        let aligned = parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0);
        let same = |p: &&PackedQ4| p.k == first.k && p.isa == first.isa && p.format == first.format;
        if !aligned || !parts.iter().all(same) {
            return None;
        }
        Some(PackedQ4 {
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            isa: first.isa,
            format: first.format,
            q: Aligned::concat(&parts.iter().map(|p| &*p.q).collect::<Vec<_>>()),
            a: Aligned::concat(&parts.iter().map(|p| &*p.a).collect::<Vec<_>>()),
            b: Aligned::concat(&parts.iter().map(|p| &*p.b).collect::<Vec<_>>()),
        })
    }
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU through the integer kernel of `w`'s [`Isa`].
/// Errors (never panics) on a non-f32, non-CPU or mis-sized `x`, or a CPU without that ISA.
pub(crate) fn linear(x: &Tensor, w: &PackedQ4) -> Result<Tensor> {
    let ready = || w.isa.require("4-bit linear");
    super::cpu_host::apply_rows(x, (w.n, w.k), "4-bit linear", ready, |xd, m| {
        #[cfg(target_arch = "x86_64")]
        {
            x86::product(xd, m, w)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("no ISA is supported off x86-64 ({}, {m})", xd.len())
        }
    })
}

/// `x (.., k) -> (.., F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedQ4::gate_up`], the SwiGLU taken as each output tile is written
/// ([`super::cpu_tile_store`]); equal bit for bit to [`linear`] on the stacked weight followed
/// by [`super::swiglu::swiglu`] (tested). Errors as [`linear`].
pub(crate) fn swiglu(x: &Tensor, w: &PackedQ4) -> Result<Tensor> {
    let ready = || w.isa.require("4-bit gate|up");
    super::cpu_host::apply_rows(x, (w.n / 2, w.k), "4-bit gate|up", ready, |xd, m| {
        #[cfg(target_arch = "x86_64")]
        {
            x86::product_with(xd, m, w, super::cpu_tile_store::Out::SwiGlu)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("no ISA is supported off x86-64 ({}, {m})", xd.len())
        }
    })
}

/// The sums the kernels compute, `x (m, k) -> (m, n)` row-major, in plain Rust: the same
/// rounded activations, the same block order, the same f32 operations per block.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn product_reference(x: &[f32], m: usize, w: &PackedQ4) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let blocks: Vec<(f32, [i8; BLOCK])> = x[r * k..][..k]
            .chunks_exact(BLOCK)
            .map(quantize_block_scalar)
            .collect();
        for c in 0..n {
            let mut f = 0f32;
            for (blk, (dx, qx)) in blocks.iter().enumerate() {
                let (mut dot, mut sum) = (0i32, 0i32);
                for (j, &v) in qx.iter().enumerate() {
                    dot += v as i32 * w.at(c, blk * BLOCK + j).0 as i32;
                    sum += v as i32;
                }
                let (_, a, b) = w.at(c, blk * BLOCK);
                let t = (dot as f32).mul_add(a, -(b * sum as f32));
                f = t.mul_add(*dx, f);
            }
            y[r * n + c] = f;
        }
    }
    y
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use super::super::cpu_qgemm::x86_rounded;
    use super::super::cpu_tile_store::{by_panel_runs, run_tiles, Out, Tile};
    use super::{mr, Isa, PackedQ4, BLOCK, MC, MR_AVX2, MR_AVX512, NR, PANEL_BLOCK};

    /// Broadcast units per block: 8 of four `i8`.
    const UNITS: usize = BLOCK / 4;

    /// A row group's rounded activations: the units `[group][block][unit][row]`, the scales
    /// and the sums `[group][block][row]` (rows past `m` are zero).
    pub(super) struct Rows {
        units: Vec<u32>,
        scale: Vec<f32>,
        sum: Vec<f32>,
    }

    /// `x (m, k)` rounded per row and block for `isa`'s tiles.
    ///
    /// # Safety
    /// The CPU has AVX2 + FMA.
    pub(super) unsafe fn quantize_rows(x: &[f32], m: usize, k: usize, isa: Isa) -> Rows {
        let (mr, blocks) = (mr(isa), k / BLOCK);
        let groups = m.div_ceil(mr);
        let mut units = vec![0u32; groups * blocks * UNITS * mr];
        let mut scale = vec![0f32; groups * blocks * mr];
        let mut sum = vec![0f32; groups * blocks * mr];
        units
            .par_chunks_mut(blocks * UNITS * mr)
            .zip(scale.par_chunks_mut(blocks * mr))
            .zip(sum.par_chunks_mut(blocks * mr))
            .enumerate()
            .for_each(|(gi, ((u, d), s))| {
                for r in 0..mr.min(m - gi * mr) {
                    let row = &x[(gi * mr + r) * k..][..k];
                    for (b, xs) in row.chunks_exact(BLOCK).enumerate() {
                        // SAFETY: the CPU has AVX2 + FMA; `xs` holds 32 floats and `u` the
                        // block's 8 units, `mr` apart, from this one.
                        let (dv, sv) =
                            unsafe { signed_units(xs, u.as_mut_ptr().add(b * UNITS * mr + r), mr) };
                        d[b * mr + r] = dv;
                        s[b * mr + r] = sv as f32;
                    }
                }
            });
        Rows { units, scale, sum }
    }

    /// `xs` (32 floats) rounded as the `Q8_0` kernel rounds, written as 8 units of four `i8`
    /// (`stride` units apart); returns the scale and the sum of the rounded values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn signed_units(xs: &[f32], out: *mut u32, stride: usize) -> (f32, i32) {
        let (d, q) = x86_rounded(xs);
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum);
        // i32 -> i16 -> i8, each pack interleaving 128-bit lanes; 0xD8 restores the order
        let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        let b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
        let mut units = [0u32; UNITS];
        _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, b);
        for (g, &unit) in units.iter().enumerate() {
            *out.add(g * stride) = unit;
        }
        (d, lanes.iter().sum())
    }

    /// AVX2: rows `0..R` × one panel over `blocks` blocks. `u` / `sx` / `ss`: the row group's
    /// units, scales and sums; `w` / `wa` / `wb`: the panel's values, `A` and `B`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const R: usize>(
        blocks: usize,
        u: *const u32,
        sx: *const f32,
        ss: *const f32,
        w: *const u8,
        wa: *const f32,
        wb: *const f32,
        out: &mut Tile,
    ) {
        let nib = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut f = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..blocks {
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            let ub = u.add(b * UNITS * MR_AVX2);
            let wblk = w.add(b * PANEL_BLOCK);
            for g in 0..4 {
                for h in 0..2 {
                    let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                    let lo = _mm256_and_si256(v, nib);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                        let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                        let p = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, al),
                            _mm256_maddubs_epi16(hi, ah),
                        );
                        acc[h] = _mm256_add_epi16(acc[h], p);
                    }
                }
            }
            let av = [0, 8].map(|o| _mm256_loadu_ps(wa.add(b * NR + o)));
            let bv = [0, 8].map(|o| _mm256_loadu_ps(wb.add(b * NR + o)));
            for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
                let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
                for h in 0..2 {
                    let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[h], ones));
                    let t = _mm256_fmsub_ps(dot, av[h], _mm256_mul_ps(bv[h], s));
                    f[h] = _mm256_fmadd_ps(t, dx, f[h]);
                }
            }
        }
        for (f, out) in f.iter().zip(out.iter_mut()) {
            _mm256_storeu_ps(out.as_mut_ptr(), f[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), f[1]);
        }
    }

    /// AVX-VNNI: [`tile_avx2`]'s sums with `vpdpbusd` on 8 lanes (exact in i32 as they are).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,avxvnni")]
    unsafe fn tile_vnni256<const R: usize>(
        blocks: usize,
        u: *const u32,
        sx: *const f32,
        ss: *const f32,
        w: *const u8,
        wa: *const f32,
        wb: *const f32,
        out: &mut Tile,
    ) {
        let nib = _mm256_set1_epi8(0x0F);
        // the f32 sums live in `out`: with them in registers too the tile spills its integer
        // sums (measured: a third of the kernel's time on stack traffic)
        for row in out.iter_mut().take(R) {
            row[..NR].fill(0.0);
        }
        for b in 0..blocks {
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            let ub = u.add(b * UNITS * MR_AVX2);
            let wblk = w.add(b * PANEL_BLOCK);
            for g in 0..4 {
                for h in 0..2 {
                    let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                    let lo = _mm256_and_si256(v, nib);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                        let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                        acc[h] = _mm256_dpbusd_avx_epi32(acc[h], lo, al);
                        acc[h] = _mm256_dpbusd_avx_epi32(acc[h], hi, ah);
                    }
                }
            }
            let av = [0, 8].map(|o| _mm256_loadu_ps(wa.add(b * NR + o)));
            let bv = [0, 8].map(|o| _mm256_loadu_ps(wb.add(b * NR + o)));
            for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
                let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
                let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
                for h in 0..2 {
                    let at = row.as_mut_ptr().add(h * 8);
                    let dot = _mm256_cvtepi32_ps(acc[h]);
                    let t = _mm256_fmsub_ps(dot, av[h], _mm256_mul_ps(bv[h], s));
                    _mm256_storeu_ps(at, _mm256_fmadd_ps(t, dx, _mm256_loadu_ps(at)));
                }
            }
        }
    }

    /// AVX-512 VNNI: rows `0..R` × `P` panels (`wstride` bytes / `dstride` scales apart) over
    /// `blocks` blocks.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile_avx512<const R: usize, const P: usize>(
        blocks: usize,
        u: *const u32,
        sx: *const f32,
        ss: *const f32,
        w: *const u8,
        wstride: usize,
        wa: *const f32,
        wb: *const f32,
        dstride: usize,
        out: &mut Tile,
    ) {
        let nib = _mm512_set1_epi8(0x0F);
        let mut f = [[_mm512_setzero_ps(); P]; R];
        for b in 0..blocks {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            let ub = u.add(b * UNITS * MR_AVX512);
            for g in 0..4 {
                let mut lo = [_mm512_setzero_si512(); P];
                let mut hi = [_mm512_setzero_si512(); P];
                for j in 0..P {
                    let at = w.add(j * wstride + b * PANEL_BLOCK + g * 64);
                    let v = _mm512_loadu_si512(at as *const __m512i);
                    lo[j] = _mm512_and_si512(v, nib);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm512_set1_epi32(*ub.add(g * MR_AVX512 + r) as i32);
                    let ah = _mm512_set1_epi32(*ub.add((g + 4) * MR_AVX512 + r) as i32);
                    for j in 0..P {
                        acc[j] = _mm512_dpbusd_epi32(acc[j], lo[j], al);
                        acc[j] = _mm512_dpbusd_epi32(acc[j], hi[j], ah);
                    }
                }
            }
            for j in 0..P {
                let av = _mm512_loadu_ps(wa.add(j * dstride + b * NR));
                let bv = _mm512_loadu_ps(wb.add(j * dstride + b * NR));
                for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                    let dx = _mm512_set1_ps(*sx.add(b * MR_AVX512 + r));
                    let s = _mm512_set1_ps(*ss.add(b * MR_AVX512 + r));
                    let t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[j]), av, _mm512_mul_ps(bv, s));
                    f[j] = _mm512_fmadd_ps(t, dx, f[j]);
                }
            }
        }
        for (f, out) in f.iter().zip(out.iter_mut()) {
            for (j, f) in f.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(j * NR), *f);
            }
        }
    }

    /// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panels each).
    pub(super) fn product(x: &[f32], m: usize, w: &PackedQ4) -> Vec<f32> {
        product_with(x, m, w, Out::Product)
    }

    /// [`product`], or (`Out::SwiGlu`, a weight of [`PackedQ4::gate_up`]) its SwiGLU
    /// `(m, n / 2)`, taken as each pair of panels' tile is written.
    pub(super) fn product_with(x: &[f32], m: usize, w: &PackedQ4, out: Out) -> Vec<f32> {
        let (n, k, isa) = (w.n, w.k, w.isa);
        // SAFETY: the CPU has `isa` (`linear` checked), so AVX2 + FMA
        let rows = unsafe { quantize_rows(x, m, k, isa) };
        by_panel_runs(m, n, isa == Isa::Avx512, out, |p0, p1, y| {
            // SAFETY: the CPU has `isa`; `rows` holds every row group `run` reads and the
            // weight every panel; runs of panels (of pairs, for the SwiGLU) write disjoint
            // columns of `y`, which holds m · out.cols(n) elements.
            unsafe { run(&rows, m, w, p0, p1, out, y) };
        })
    }

    /// Panels `p0..p1` of the product (or its SwiGLU: `p0`, `p1` even) into `y`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        rows: &Rows,
        m: usize,
        w: &PackedQ4,
        p0: usize,
        p1: usize,
        out: Out,
        y: *mut f32,
    ) {
        let (blocks, mr) = (w.k / BLOCK, mr(w.isa));
        let wide = w.isa == Isa::Avx512;
        run_tiles(
            (m, w.n),
            (mr, MC),
            wide,
            (p0, p1),
            out,
            y,
            |p, width, g0, count, t| {
                let gi = g0 / mr;
                let group = (
                    rows.units.as_ptr().add(gi * blocks * UNITS * mr),
                    rows.scale.as_ptr().add(gi * blocks * mr),
                    rows.sum.as_ptr().add(gi * blocks * mr),
                );
                tile_at(w, p, width, count, group, t);
            },
        );
    }

    /// Rows `0..count` of one row group (`(units, scales, sums)`) × panels `p..p + width`
    /// (`width` 2 only under AVX-512) of `w` into `out`.
    ///
    /// # Safety
    /// The CPU has `w`'s ISA; the row group and panels are within `w` and the rounded rows.
    unsafe fn tile_at(
        w: &PackedQ4,
        p: usize,
        width: usize,
        count: usize,
        (ug, sg, tg): (*const u32, *const f32, *const f32),
        out: &mut Tile,
    ) {
        let blocks = w.k / BLOCK;
        let wp = w.q.as_ptr().add(p * blocks * PANEL_BLOCK);
        let ap = w.a.as_ptr().add(p * blocks * NR);
        let bp = w.b.as_ptr().add(p * blocks * NR);
        match w.isa {
            Isa::Avx2 => {
                macro_rules! go {
                    ($r:literal) => {
                        tile_avx2::<$r>(blocks, ug, sg, tg, wp, ap, bp, out)
                    };
                }
                match count {
                    4 => go!(4),
                    3 => go!(3),
                    2 => go!(2),
                    _ => go!(1),
                }
            }
            Isa::AvxVnni => {
                macro_rules! go {
                    ($r:literal) => {
                        tile_vnni256::<$r>(blocks, ug, sg, tg, wp, ap, bp, out)
                    };
                }
                match count {
                    4 => go!(4),
                    3 => go!(3),
                    2 => go!(2),
                    _ => go!(1),
                }
            }
            Isa::Avx512 => {
                let (ws, ds) = (blocks * PANEL_BLOCK, blocks * NR);
                macro_rules! go {
                    ($r:literal) => {
                        match width {
                            2 => tile_avx512::<$r, 2>(blocks, ug, sg, tg, wp, ws, ap, bp, ds, out),
                            _ => tile_avx512::<$r, 1>(blocks, ug, sg, tg, wp, ws, ap, bp, ds, out),
                        }
                    };
                }
                match count {
                    6 => go!(6),
                    5 => go!(5),
                    4 => go!(4),
                    3 => go!(3),
                    2 => go!(2),
                    _ => go!(1),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;
    use candle_core::{DType, Device};

    use super::*;

    fn blocks(w: &Tensor, format: GgmlDType) -> Result<(Vec<u8>, QTensor)> {
        let q = QTensor::quantize(w, format)?;
        Ok((q.data()?.into_owned(), q))
    }

    /// Both kernels equal the plain-Rust sums bit for bit, for both formats, on every tail
    /// there is: row counts off the tile and row-block sizes, ragged last panels after odd and
    /// even counts of whole ones, one block of `k` and many, 3-D and strided inputs, one row.
    #[test]
    fn kernels_equal_the_reference_sums() -> Result<()> {
        let levels = Isa::supported();
        if levels.is_empty() {
            eprintln!("no AVX2 + FMA: the 4-bit kernels do not run here");
            return Ok(());
        }
        let dev = Device::Cpu;
        for &isa in levels {
            for (format, xdims, n) in [
                (GgmlDType::Q4_0, vec![37usize, 96], 130usize),
                (GgmlDType::Q4_0, vec![2, 19, 64], 48),
                (GgmlDType::Q4_0, vec![1, 1, 896], 7),
                (GgmlDType::Q4_0, vec![MC + 7, 160], 176),
                (GgmlDType::Q4_0, vec![150, 32], 33),
                (GgmlDType::Q4K, vec![37, 256], 130),
                (GgmlDType::Q4K, vec![MC + 9, 1280], 40),
                (GgmlDType::Q4K, vec![1, 512], 16),
                (GgmlDType::Q4K, vec![13, 2, 768], 50),
            ] {
                let k = *xdims.last().unwrap();
                let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
                let (bytes, _) = blocks(&Tensor::randn(0f32, 0.2, (n, k), &dev)?, format)?;
                let w = PackedQ4::from_blocks(format, &bytes, n, k, isa).expect("fits");
                assert_eq!((w.dims(), w.format()), ((n, k), format));
                let got = linear(&x, &w)?;
                let mut want_dims = xdims.clone();
                *want_dims.last_mut().unwrap() = n;
                assert_eq!(got.dims(), &want_dims[..]);
                let m = x.elem_count() / k;
                let want = product_reference(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
                let got = got.flatten_all()?.to_vec1::<f32>()?;
                assert!(
                    got == want,
                    "{isa:?} {format:?} {xdims:?} x ({n}, {k}): differs"
                );
            }
            let x = Tensor::randn(0f32, 1.0, (256, 10), &dev)?.t()?; // (10, 256), strided
            let (bytes, _) = blocks(&Tensor::randn(0f32, 0.2, (20, 256), &dev)?, GgmlDType::Q4K)?;
            let w = PackedQ4::from_blocks(GgmlDType::Q4K, &bytes, 20, 256, isa).expect("fits");
            let got = linear(&x, &w)?.flatten_all()?.to_vec1::<f32>()?;
            let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
            assert!(
                got == product_reference(&xs, 10, &w),
                "{isa:?} strided input"
            );
        }
        Ok(())
    }

    /// The packed weight dequantizes to exactly candle's dequantization of the same blocks, and
    /// the reference sums are the product of that weight and the activations rounded to 8-bit
    /// blocks, up to f32 rounding.
    #[test]
    fn the_reference_is_the_product_of_the_dequantized_weight() -> Result<()> {
        let dev = Device::Cpu;
        let (m, n, k) = (9usize, 40usize, 512usize);
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
        let xs = x.to_vec2::<f32>()?;
        let rounded: Vec<f32> = xs
            .iter()
            .flat_map(|row| {
                row.chunks_exact(BLOCK)
                    .flat_map(|b| {
                        let (d, q) = quantize_block_scalar(b);
                        q.map(|q| q as f32 * d)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let xr = Tensor::from_vec(rounded, (m, k), &dev)?;
        for format in [GgmlDType::Q4_0, GgmlDType::Q4K] {
            // a weight with an offset, so Q4_K's mins are not all zero
            let wt = (Tensor::randn(0f32, 0.2, (n, k), &dev)? + 0.05)?;
            let (bytes, qt) = blocks(&wt, format)?;
            let dense = qt.dequantize(&dev)?;
            let want = xr.matmul(&dense.t()?)?.flatten_all()?.to_vec1::<f32>()?;
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                let w = PackedQ4::from_blocks(format, &bytes, n, k, isa).expect("fits");
                assert_eq!(
                    w.rows(),
                    dense.flatten_all()?.to_vec1::<f32>()?,
                    "{format:?}"
                );
                let got = product_reference(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
                let diff = got
                    .iter()
                    .zip(&want)
                    .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
                assert!(diff <= 1e-5 * scale, "{format:?}: {diff} vs scale {scale}");
            }
        }
        Ok(())
    }

    /// The rows' rounding into signed units equals the scalar rounding, value for value, with
    /// the sums of the rounded values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn signed_units_equal_scalar_rounding() -> Result<()> {
        if Isa::supported().is_empty() {
            return Ok(());
        }
        let dev = Device::Cpu;
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-6f32, 1.0, 3e4] {
            rows.extend(Tensor::randn(0f32, scale, (40, BLOCK), &dev)?.to_vec2::<f32>()?);
        }
        rows.push((1..=BLOCK).map(|i| i as f32 + 0.5).collect());
        rows.push(vec![0.0; BLOCK]);
        let mut big = vec![-1e-3f32; BLOCK];
        big[5] = 9e9;
        rows.push(big);
        for xs in &rows {
            let (d, q) = quantize_block_scalar(xs);
            let want: Vec<u32> = q
                .chunks_exact(4)
                .map(|v| u32::from_le_bytes([v[0] as u8, v[1] as u8, v[2] as u8, v[3] as u8]))
                .collect();
            let mut units = vec![0u32; BLOCK / 4];
            // SAFETY: the CPU has AVX2 + FMA; `xs` holds 32 floats, `units` the block's units.
            let (dv, s) = unsafe { x86::signed_units(xs, units.as_mut_ptr(), 1) };
            let sum: i32 = q.iter().map(|&v| v as i32).sum();
            assert_eq!((d.to_bits(), want, sum), (dv.to_bits(), units, s), "{xs:?}");
        }
        Ok(())
    }

    /// The fused gate|up SwiGLU equals the stacked product followed by the SwiGLU pass, bit for
    /// bit, at every level the CPU has, for both formats: row counts off the tile and across
    /// row blocks, one pair of panels and many; `gate_up` refuses an `F` that is not a multiple
    /// of 16 and mixed formats.
    #[test]
    fn fused_swiglu_equals_product_then_swiglu() -> Result<()> {
        let dev = Device::Cpu;
        for &isa in Isa::supported() {
            for (format, m, f, k) in [
                (GgmlDType::Q4_0, 1usize, 16usize, 32usize),
                (GgmlDType::Q4_0, 7, 48, 96),
                (GgmlDType::Q4K, MC + 11, 80, 256),
                (GgmlDType::Q4K, 13, 16, 512),
            ] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                let pack = |shift: f64| -> Result<PackedQ4> {
                    let w = (Tensor::randn(0f32, 0.2, (f, k), &dev)? + shift)?;
                    let (bytes, _) = blocks(&w, format)?;
                    Ok(PackedQ4::from_blocks(format, &bytes, f, k, isa).expect("fits"))
                };
                let (gate, up) = (pack(0.0)?, pack(0.05)?);
                let fused = PackedQ4::gate_up(&gate, &up).expect("fits");
                let stacked = PackedQ4::stack(&[&gate, &up]).expect("stacks");
                let want = super::super::swiglu::swiglu(&linear(&x, &stacked)?)?;
                let got = swiglu(&x, &fused)?;
                assert_eq!(got.dims(), &[m, f]);
                let got = got.flatten_all()?.to_vec1::<f32>()?;
                let want = want.flatten_all()?.to_vec1::<f32>()?;
                assert!(got == want, "{isa:?} {format:?} m {m} F {f} k {k}: differs");
            }
            let w = Tensor::randn(0f32, 0.2, (24, 256), &dev)?;
            let (b0, _) = blocks(&w, GgmlDType::Q4_0)?;
            let odd = PackedQ4::from_blocks(GgmlDType::Q4_0, &b0, 24, 256, isa).expect("fits");
            assert!(PackedQ4::gate_up(&odd, &odd).is_none(), "F = 24");
            let w = Tensor::randn(0f32, 0.2, (16, 256), &dev)?;
            let (b0, _) = blocks(&w, GgmlDType::Q4_0)?;
            let (bk, _) = blocks(&w, GgmlDType::Q4K)?;
            let q0 = PackedQ4::from_blocks(GgmlDType::Q4_0, &b0, 16, 256, isa).expect("fits");
            let qk = PackedQ4::from_blocks(GgmlDType::Q4K, &bk, 16, 256, isa).expect("fits");
            assert!(PackedQ4::gate_up(&q0, &qk).is_none(), "mixed formats");
        }
        Ok(())
    }

    /// Stacking equals packing the stacked blocks; unaligned parts, mixed formats or kernels,
    /// other formats and blocks that do not fit the shape are refused.
    #[test]
    fn stacking_and_refusals() -> Result<()> {
        let dev = Device::Cpu;
        let ws: Vec<Tensor> = [32usize, 16, 7]
            .iter()
            .map(|&r| Tensor::randn(0f32, 1.0, (r, 256), &dev))
            .collect::<Result<_>>()?;
        let all = Tensor::cat(&ws, 0)?;
        for format in [GgmlDType::Q4_0, GgmlDType::Q4K] {
            let parts: Vec<PackedQ4> = ws
                .iter()
                .map(|w| {
                    let (b, _) = blocks(w, format)?;
                    Ok(PackedQ4::from_blocks(format, &b, w.dim(0)?, 256, Isa::Avx2).expect("fits"))
                })
                .collect::<Result<_>>()?;
            let refs: Vec<&PackedQ4> = parts.iter().collect();
            let stacked = PackedQ4::stack(&refs).expect("aligned");
            let (b, _) = blocks(&all, format)?;
            let whole = PackedQ4::from_blocks(format, &b, 55, 256, Isa::Avx2).expect("fits");
            assert_eq!(stacked.dims(), (55, 256));
            assert_eq!(
                (&*stacked.q, &*stacked.a, &*stacked.b),
                (&*whole.q, &*whole.a, &*whole.b)
            );
            assert!(
                PackedQ4::stack(&[&parts[2], &parts[0]]).is_none(),
                "7 rows first"
            );
        }
        let (b0, _) = blocks(&ws[1], GgmlDType::Q4_0)?;
        let (bk, _) = blocks(&ws[1], GgmlDType::Q4K)?;
        let q0 = PackedQ4::from_blocks(GgmlDType::Q4_0, &b0, 16, 256, Isa::Avx2).expect("fits");
        let qk = PackedQ4::from_blocks(GgmlDType::Q4K, &bk, 16, 256, Isa::Avx2).expect("fits");
        let q5 = PackedQ4::from_blocks(GgmlDType::Q4_0, &b0, 16, 256, Isa::Avx512).expect("fits");
        assert!(PackedQ4::stack(&[&q0, &qk]).is_none(), "two formats");
        assert!(PackedQ4::stack(&[&q0, &q5]).is_none(), "two kernels");
        assert!(PackedQ4::stack(&[]).is_none());
        assert!(
            PackedQ4::from_blocks(GgmlDType::Q4_0, &b0, 16, 128, Isa::Avx2).is_none(),
            "bytes of (16, 256)"
        );
        assert!(
            PackedQ4::from_blocks(GgmlDType::Q4K, &bk, 32, 128, Isa::Avx2).is_none(),
            "k 128"
        );
        assert!(
            PackedQ4::from_blocks(GgmlDType::Q8_0, &b0, 16, 256, Isa::Avx2).is_none(),
            "q8_0"
        );
        Ok(())
    }

    /// A mis-sized or non-f32 input is an error naming the shapes, never a panic; zero rows
    /// give an empty output and all-zero activations zeros (`Q4_0` rows with zero `d`).
    #[test]
    fn a_mis_sized_input_is_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let Some(&isa) = Isa::supported().first() else {
            return Ok(());
        };
        let (b, _) = blocks(&Tensor::randn(0f32, 1.0, (4, 64), &dev)?, GgmlDType::Q4_0)?;
        let w = PackedQ4::from_blocks(GgmlDType::Q4_0, &b, 4, 64, isa).expect("fits");
        let e = linear(&Tensor::zeros((3, 32), DType::F32, &dev)?, &w).expect_err("k 32 vs 64");
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = linear(&Tensor::zeros((3, 64), DType::F64, &dev)?, &w).expect_err("f64");
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert_eq!(
            linear(&Tensor::zeros((0, 64), DType::F32, &dev)?, &w)?.dims(),
            &[0, 4]
        );
        let y = linear(&Tensor::zeros((2, 64), DType::F32, &dev)?, &w)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![0f32; 8]);
        Ok(())
    }
}
