//! `Q8_0` linear layers on x86 CPUs as integer products: `y = x Wᵀ` with `W` kept as its
//! `Q8_0` int8 values and per-block scales, packed once at load, and `x` rounded on each call
//! to 8-bit blocks of 32 the way `Q8_0` rounds (`d = max|x| / 127`, `q = round(x / d)`, `d`
//! kept in f32). This is the product candle's and llama.cpp's CPU `Q8_0` kernels compute
//! ("W8A8"), register-tiled:
//!
//! `y[r][c] = Σ_b (dx[r][b] · dw[c][b]) · Σ_{j<32} qx[r][32b + j] · qw[c][32b + j]`
//!
//! Each block's inner sum is exact in i32 (at most 32 · 127² in magnitude), converted to f32
//! once and accumulated with one fused multiply-add, block after block.
//!
//! Three kernels, by [`Isa`]:
//! - AVX2: int8 values sign-extended to 16 bits, multiplied and summed in pairs (`vpmaddwd`:
//!   8 lanes × 2 products); tiles of 4 rows × 16 columns.
//! - AVX-512 VNNI: 4-way `u8 × i8` dot products (`vpdpbusd`: 16 lanes × 4 products). The
//!   activations are stored offset by 128 as u8; each block's sum starts from
//!   `-128 Σ_j qw[c][32b + j]` (precomputed per block and column when packing), which cancels
//!   the offset exactly. Tiles of 6 rows × 32 columns (two panels).
//! - AVX-VNNI (AVX2 CPUs with the 256-bit `vpdpbusd`: Intel's client cores since Alder Lake,
//!   AMD's Zen 5): the VNNI arithmetic and layout on 8 lanes, a panel's 16 columns in two
//!   registers; tiles of 4 rows × 16 columns. One instruction per 32 products, where AVX2
//!   takes two multiply-adds and two additions.
//!
//! Weight layout, per panel of [`NR`] columns and block of 32 `k`: `32 / G` groups of `G`
//! consecutive `k` (`G` = 2 for AVX2, 4 for both VNNI kernels), each group 16 columns × `G`
//! bytes with a column's `G` values together, so a group is one register of 16-bit pairs
//! (AVX2: two registers of 8 columns) or of byte quads (VNNI; two registers under AVX-VNNI). Activations, per group of `MR` rows and
//! block: the same `k` groups, each row's `G` values in one u32, the unit the kernel broadcasts.
//!
//! [`product_reference`] computes the same sums in plain Rust; the tests hold both kernels to
//! it bit for bit.

use candle_core::{Result, Tensor};

use super::cpu_aligned::Aligned;
use super::cpu_isa::Isa;
use super::cpu_panel::NR;
use super::cpu_tile_store::Out;

/// `k` per `Q8_0` block.
const BLOCK: usize = 32;
/// Bytes of one (panel, block): 16 columns × 32 int8.
const PANEL_BLOCK: usize = NR * BLOCK;
/// Bytes of one serialized `Q8_0` block: an f16 scale and 32 int8.
const Q8_0_BYTES: usize = 34;
/// Rows per tile (AVX2).
const MR_AVX2: usize = 4;
/// Rows per tile (AVX-VNNI).
const MR_VNNI256: usize = 6;
/// Rows per tile (AVX-512).
const MR_AVX512: usize = 6;
/// Rows per block of the row loop: a few row groups' activations stay in L2 while the
/// thread's panels pass over them.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MC: usize = 48;

/// How many 32-value blocks ahead the AVX-512 and AVX-VNNI tiles prefetch their panels' weights
/// (one `prefetcht0` per 64 bytes read; 0: none), where set for the whole process: by
/// `FORKSCORE_CPU_QPREFETCH` (read once) or [`set_prefetch`] (the `cpu_linear` bench compares
/// distances in one process). Unset (`usize::MAX`), each level takes [`default_prefetch`].
static PREFETCH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// The distance a level prefetches at unless set: 4 blocks (2 KiB of a panel's weights) under
/// AVX-512, none under AVX-VNNI. Measured with the `cpu_linear` bench (one process): one
/// layer's products 1.6 % faster at 512 rows and 11 % at 40 under AVX-512; under AVX-VNNI 3–5 %
/// slower at 512 rows and within ±4 % at 40 at every distance tried.
pub(crate) fn default_prefetch(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 4,
        Isa::Avx2 | Isa::AvxVnni => 0,
    }
}

/// The prefetch distance the integer tiles of `isa` use now (see [`PREFETCH`]).
pub(crate) fn prefetch(isa: Isa) -> usize {
    use std::sync::atomic::Ordering;
    static FROM_ENV: std::sync::Once = std::sync::Once::new();
    FROM_ENV.call_once(|| {
        if let Some(Ok(v)) = crate::switches::value("FORKSCORE_CPU_QPREFETCH").map(parse_prefetch) {
            // only where nothing set it first
            let _ = PREFETCH.compare_exchange(usize::MAX, v, Ordering::Relaxed, Ordering::Relaxed);
        }
    });
    match PREFETCH.load(Ordering::Relaxed) {
        usize::MAX => default_prefetch(isa),
        v => v,
    }
}

/// A `FORKSCORE_CPU_QPREFETCH` value: a count of blocks (0: none), else what is wrong (a value
/// the load refuses, `cpu_switches`).
pub(crate) fn parse_prefetch(v: &str) -> std::result::Result<usize, String> {
    v.trim().parse().map_err(|_| {
        format!("FORKSCORE_CPU_QPREFETCH={v:?}: not a count of blocks (0 turns the prefetch off)")
    })
}

/// Set the integer tiles' prefetch distance for the process (blocks ahead; 0: none;
/// `usize::MAX`: each level's default again).
pub(crate) fn set_prefetch(blocks: usize) {
    PREFETCH.store(blocks, std::sync::atomic::Ordering::Relaxed);
}

/// `k` values per broadcast unit.
fn group(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 => 2,
        Isa::AvxVnni | Isa::Avx512 => 4,
    }
}

/// Rows per tile.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn mr(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 => MR_AVX2,
        Isa::AvxVnni => MR_VNNI256,
        Isa::Avx512 => MR_AVX512,
    }
}

/// A `Q8_0` weight `W (n, k)` packed for the kernel of one [`Isa`] (`k` a multiple of 32;
/// the last panel zero-padded, with zero scales).
#[derive(Debug, Clone)]
pub(crate) struct PackedQ8 {
    n: usize,
    k: usize,
    isa: Isa,
    /// `[panel][block][group][column][G]` (a panel's block is 512 bytes: 8 cache lines).
    q: Aligned<i8>,
    /// `[panel][block][column]`: the weight scales (a cache line per panel and block).
    d: Aligned<f32>,
    /// `[panel][block][column]`: `-128 Σ_j q` (the VNNI kernels; empty for AVX2).
    offset: Aligned<i32>,
}

impl PackedQ8 {
    /// Pack `Q8_0` blocks of `(n, k)` (candle's serialized form: per row, `k / 32` blocks of
    /// an f16 scale and 32 int8) for `isa`. `None` when `k` is not a multiple of 32 or the
    /// byte count does not fit `(n, k)`.
    pub fn from_blocks(bytes: &[u8], n: usize, k: usize, isa: Isa) -> Option<Self> {
        use rayon::prelude::*;
        if !k.is_multiple_of(BLOCK) || bytes.len() != n * (k / BLOCK) * Q8_0_BYTES {
            return None;
        }
        let (blocks, g) = (k / BLOCK, group(isa));
        let row_bytes = blocks * Q8_0_BYTES;
        let panels = n.div_ceil(NR);
        let mut q = Aligned::<i8>::zeroed(panels * blocks * PANEL_BLOCK);
        let mut d = Aligned::<f32>::zeroed(panels * blocks * NR);
        let mut offset = Aligned::<i32>::zeroed(panels * blocks * NR);
        q.par_chunks_mut((blocks * PANEL_BLOCK).max(1))
            .zip(d.par_chunks_mut((blocks * NR).max(1)))
            .zip(offset.par_chunks_mut((blocks * NR).max(1)))
            .enumerate()
            .for_each(|(p, ((q, d), offset))| {
                for c in 0..NR.min(n - p * NR) {
                    let row = &bytes[(p * NR + c) * row_bytes..][..row_bytes];
                    for (b, block) in row.chunks_exact(Q8_0_BYTES).enumerate() {
                        let scale = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]]));
                        d[b * NR + c] = scale.to_f32();
                        let mut sum = 0i32;
                        for (j, &v) in block[2..].iter().enumerate() {
                            let v = v as i8;
                            q[b * PANEL_BLOCK + (j / g) * NR * g + c * g + j % g] = v;
                            sum += v as i32;
                        }
                        offset[b * NR + c] = -128 * sum;
                    }
                }
            });
        if isa == Isa::Avx2 {
            offset = Aligned::empty();
        }
        Some(PackedQ8 {
            n,
            k,
            isa,
            q,
            d,
            offset,
        })
    }

    /// The instruction level whose layout the weight is packed in.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The AVX-512 layout's int8 values `[panel][block][8][16][4]` (a panel's block is one
    /// AMX int8 B tile as it is) and scales `[panel][block][16]`; `None` for the AVX2 layout.
    pub(crate) fn tile_parts(&self) -> Option<(&[i8], &[f32])> {
        (self.isa == Isa::Avx512).then(|| (&*self.q, &*self.d))
    }

    /// The int8 value and scale of `W[c][kk]`.
    fn at(&self, c: usize, kk: usize) -> (i8, f32) {
        let (p, c, b, j) = (c / NR, c % NR, kk / BLOCK, kk % BLOCK);
        let g = group(self.isa);
        let pb = p * (self.k / BLOCK) + b;
        let q = self.q[pb * PANEL_BLOCK + (j / g) * NR * g + c * g + j % g];
        (q, self.d[pb * NR + c])
    }

    /// `W` dequantized (`d · q`), `(n, k)` row-major.
    pub fn rows(&self) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for c in 0..self.n {
            w.extend((0..self.k).map(|kk| {
                let (q, d) = self.at(c, kk);
                q as f32 * d
            }));
        }
        w
    }

    /// `gate` and `up` (each `(F, k)`, one kernel, `F` a positive multiple of 16) as one
    /// `(2F, k)` weight whose panels alternate: panel `2p` is gate's panel `p`, `2p + 1` up's.
    /// What [`swiglu`] reads; `None` when the two do not fit.
    pub fn gate_up(gate: &PackedQ8, up: &PackedQ8) -> Option<Self> {
        let (f, k, isa) = (gate.n, gate.k, gate.isa);
        if f == 0 || !f.is_multiple_of(NR) || (up.n, up.k, up.isa) != (f, k, isa) {
            return None;
        }
        let blocks = k / BLOCK;
        use super::cpu_tile_store::alternate;
        Some(PackedQ8 {
            n: 2 * f,
            k,
            isa,
            q: alternate(&gate.q, &up.q, blocks * PANEL_BLOCK),
            d: alternate(&gate.d, &up.d, blocks * NR),
            offset: match isa {
                Isa::Avx2 => Aligned::empty(),
                _ => alternate(&gate.offset, &up.offset, blocks * NR),
            },
        })
    }

    /// The weights stacked along `out` (`[a; b; …]`): `None` for an empty list, differing
    /// `in` or kernels, or a part other than the last whose row count is not a multiple of 16
    /// (its padded panel would sit inside the stack).
    pub fn stack(parts: &[&PackedQ8]) -> Option<Self> {
        let first = parts.first()?;
        let (k, isa) = (first.k, first.isa);
        let aligned = parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0);
        if !aligned || parts.iter().any(|p| p.k != k || p.isa != isa) {
            return None;
        }
        Some(PackedQ8 {
            n: parts.iter().map(|p| p.n).sum(),
            k,
            isa,
            q: Aligned::concat(&parts.iter().map(|p| &*p.q).collect::<Vec<_>>()),
            d: Aligned::concat(&parts.iter().map(|p| &*p.d).collect::<Vec<_>>()),
            offset: Aligned::concat(&parts.iter().map(|p| &*p.offset).collect::<Vec<_>>()),
        })
    }
}

/// One block of 32 activations rounded as `Q8_0` rounds: `(d, q)` with `x ≈ d · q` (`q` to the
/// nearest integer, ties to even: what the vector form's conversion does), one element at a
/// time (the kernels' rounding, `x86::quantize_units`, is held to it).
pub(super) fn quantize_block_scalar(xs: &[f32]) -> (f32, [i8; BLOCK]) {
    let amax = xs.iter().fold(0f32, |a, x| a.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; BLOCK];
    for (q, &x) in q.iter_mut().zip(xs) {
        *q = (x * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    (d, q)
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU through the integer kernel of `w`'s [`Isa`].
/// Errors (never panics) on a non-f32, non-CPU or mis-sized `x`, or a CPU without that ISA.
/// (The layer's dispatcher, [`super::cpu_amx::q8_linear`], sends AVX-512 weights to the AMX
/// int8 tiles instead when `FORKSCORE_CPU_Q8=amx` asks for them.)
pub(crate) fn linear(x: &Tensor, w: &PackedQ8) -> Result<Tensor> {
    let ready = || w.isa.require("q8_0 linear");
    super::cpu_host::apply_rows(x, (w.n, w.k), "q8_0 linear", ready, |xd, m| {
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
/// [`PackedQ8::gate_up`], the SwiGLU taken as each output tile is written, so the `(.., 2F)`
/// product is never stored. Equal bit for bit to [`linear`] on the stacked `[gate; up]` weight
/// followed by [`super::swiglu::swiglu`] (the same sums, the same [`super::cpu_math::silu_mul`]
/// on every element; tested). Errors as [`linear`].
pub(crate) fn swiglu(x: &Tensor, w: &PackedQ8) -> Result<Tensor> {
    let ready = || w.isa.require("q8_0 gate|up");
    super::cpu_host::apply_rows(x, (w.n / 2, w.k), "q8_0 gate|up", ready, |xd, m| {
        #[cfg(target_arch = "x86_64")]
        {
            x86::product_with(xd, m, w, Out::SwiGlu)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("no ISA is supported off x86-64 ({}, {m})", xd.len())
        }
    })
}

/// The sums the kernels compute, `x (m, k) -> (m, n)` row-major, in plain Rust: the same
/// rounded activations, the same block order, one `mul_add` per block.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn product_reference(x: &[f32], m: usize, w: &PackedQ8) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let blocks: Vec<(f32, [i8; BLOCK])> = x[r * k..][..k]
            .chunks_exact(BLOCK)
            .map(quantize_block_scalar)
            .collect();
        for c in 0..n {
            let mut f = 0f32;
            for (b, (dx, qx)) in blocks.iter().enumerate() {
                let mut dot = 0i32;
                for (j, &v) in qx.iter().enumerate() {
                    dot += v as i32 * w.at(c, b * BLOCK + j).0 as i32;
                }
                let dw = w.at(c, b * BLOCK).1;
                f = (dot as f32).mul_add(dx * dw, f);
            }
            y[r * n + c] = f;
        }
    }
    y
}

/// The block rounding in registers, for the 4-bit kernel's activations.
#[cfg(target_arch = "x86_64")]
pub(super) use x86::rounded as x86_rounded;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use super::super::cpu_tile_store::{by_panel_runs, run_tiles, Out, Tile};
    use super::{
        group, mr, Isa, PackedQ8, BLOCK, MC, MR_AVX2, MR_AVX512, MR_VNNI256, NR, PANEL_BLOCK,
    };

    /// `x (m, k)` rounded per row and block and laid out for `isa`'s kernel: the broadcast units
    /// `[row group][block][group][row]` and the scales `[row group][block][row]` (rows past `m`
    /// are zero).
    ///
    /// # Safety
    /// The CPU has `isa`.
    pub(super) unsafe fn quantize_rows(
        x: &[f32],
        m: usize,
        k: usize,
        isa: Isa,
    ) -> (Vec<u32>, Vec<f32>) {
        let (mr, blocks) = (mr(isa), k / BLOCK);
        let units = BLOCK / group(isa);
        let groups = m.div_ceil(mr);
        let mut a = vec![0u32; groups * blocks * units * mr];
        let mut s = vec![0f32; groups * blocks * mr];
        a.par_chunks_mut((blocks * units * mr).max(1))
            .zip(s.par_chunks_mut((blocks * mr).max(1)))
            .enumerate()
            .for_each(|(gi, (a, s))| {
                for r in 0..mr.min(m - gi * mr) {
                    let row = &x[(gi * mr + r) * k..][..k];
                    for (b, xs) in row.chunks_exact(BLOCK).enumerate() {
                        // SAFETY: the CPU has AVX2 (every level includes it); `xs` holds 32
                        // floats and `a` the block's `units` units, `mr` apart, from this one.
                        s[b * mr + r] = unsafe {
                            quantize_units(xs, isa, a.as_mut_ptr().add(b * units * mr + r), mr)
                        };
                    }
                }
            });
        (a, s)
    }

    /// The scale of `xs` (32 floats) and its values rounded and clamped to ±127, as four
    /// (8,) i32 registers (values 8i..8i+8 in register i).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::candle) unsafe fn rounded(xs: &[f32]) -> (f32, [__m256i; 4]) {
        let p = xs.as_ptr();
        let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for v in &v {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0f32, |a, &x| a.max(x));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
        let q = v.map(|v| {
            let r = _mm256_cvtps_epi32(_mm256_mul_ps(v, idv));
            _mm256_min_epi32(_mm256_max_epi32(r, lo), hi)
        });
        (d, q)
    }

    /// [`super::quantize_block_scalar`] and the packing of its values into `isa`'s broadcast
    /// units, in registers: rounds `xs` (32 floats), writes the block's `32 / G` units to `out`,
    /// `stride` units apart, and returns the scale (the same rounding, so the same units:
    /// tested against the scalar form).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_units(xs: &[f32], isa: Isa, out: *mut u32, stride: usize) -> f32 {
        let (d, q) = rounded(xs);
        // i32 -> i16 packs 128-bit lanes pairwise: [a0..3 b0..3 a4..7 b4..7]; 0xD8 restores order
        let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        let mut units = [0u32; 16];
        let n = match isa {
            // (16,) i16 pairs: values 0..16 and 16..32, two per unit
            Isa::Avx2 => {
                _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, w01);
                _mm256_storeu_si256(units.as_mut_ptr().add(8) as *mut __m256i, w23);
                16
            }
            // values + 128 as u8 (1..=255), four per unit
            Isa::AvxVnni | Isa::Avx512 => {
                let off = _mm256_set1_epi16(128);
                let b = _mm256_packus_epi16(_mm256_add_epi16(w01, off), _mm256_add_epi16(w23, off));
                let b = _mm256_permute4x64_epi64(b, 0xD8);
                _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, b);
                8
            }
        };
        for (u, &unit) in units.iter().enumerate().take(n) {
            *out.add(u * stride) = unit;
        }
        d
    }

    /// AVX2: rows `0..R` × one panel over `blocks` blocks. `a` / `sa`: the row group's units
    /// and scales; `w` / `dw`: the panel's int8 values and scales.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const R: usize>(
        blocks: usize,
        a: *const u32,
        sa: *const f32,
        w: *const i8,
        dw: *const f32,
        out: &mut Tile,
    ) {
        const UNITS: usize = BLOCK / 2;
        let mut f = [[_mm256_setzero_ps(); 2]; R];
        for b in 0..blocks {
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            let ab = a.add(b * UNITS * MR_AVX2);
            let wb = w.add(b * PANEL_BLOCK);
            for u in 0..UNITS {
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(u * 32) as *const __m128i));
                let w1 =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(u * 32 + 16) as *const __m128i));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_epi32(*ab.add(u * MR_AVX2 + r) as i32);
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(av, w0));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(av, w1));
                }
            }
            let d0 = _mm256_loadu_ps(dw.add(b * NR));
            let d1 = _mm256_loadu_ps(dw.add(b * NR + 8));
            for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                let s = _mm256_set1_ps(*sa.add(b * MR_AVX2 + r));
                f[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[0]), _mm256_mul_ps(s, d0), f[0]);
                f[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[1]), _mm256_mul_ps(s, d1), f[1]);
            }
        }
        for (f, out) in f.iter().zip(out.iter_mut()) {
            _mm256_storeu_ps(out.as_mut_ptr(), f[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), f[1]);
        }
    }

    /// AVX-VNNI: rows `0..R` × one panel over `blocks` blocks, [`tile_avx512`]'s sums on 8
    /// lanes (the panel's 16 columns in two registers). `off`: the panel's offsets. With `PF`,
    /// each unit prefetches its weights `pf` blocks ahead.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,avxvnni")]
    unsafe fn tile_vnni256<const R: usize, const PF: bool>(
        blocks: usize,
        a: *const u32,
        sa: *const f32,
        w: *const i8,
        dw: *const f32,
        off: *const i32,
        out: &mut Tile,
        pf: usize,
    ) {
        const UNITS: usize = BLOCK / 4;
        // the f32 sums live in `out` (12 of the 16 registers hold the block's integer sums)
        for row in out.iter_mut().take(R) {
            row[..NR].fill(0.0);
        }
        for b in 0..blocks {
            let o = [0, 8].map(|h| _mm256_loadu_si256(off.add(b * NR + h) as *const __m256i));
            let mut acc = [o; R];
            let ab = a.add(b * UNITS * MR_VNNI256);
            let wb = w.add(b * PANEL_BLOCK);
            for u in 0..UNITS {
                let w0 = _mm256_loadu_si256(wb.add(u * 64) as *const __m256i);
                let w1 = _mm256_loadu_si256(wb.add(u * 64 + 32) as *const __m256i);
                if PF {
                    // a hint past the panel's end never faults, hence `wrapping_add`
                    let at = wb.wrapping_add(pf * PANEL_BLOCK + u * 64);
                    _mm_prefetch::<_MM_HINT_T0>(at);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_epi32(*ab.add(u * MR_VNNI256 + r) as i32);
                    acc[0] = _mm256_dpbusd_avx_epi32(acc[0], av, w0);
                    acc[1] = _mm256_dpbusd_avx_epi32(acc[1], av, w1);
                }
            }
            let d = [0, 8].map(|h| _mm256_loadu_ps(dw.add(b * NR + h)));
            for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
                let s = _mm256_set1_ps(*sa.add(b * MR_VNNI256 + r));
                for h in 0..2 {
                    let at = row.as_mut_ptr().add(h * 8);
                    let scale = _mm256_mul_ps(s, d[h]);
                    let f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), scale, _mm256_loadu_ps(at));
                    _mm256_storeu_ps(at, f);
                }
            }
        }
    }

    /// AVX-512 VNNI: rows `0..R` × `P` panels (`wstride` bytes / `dstride` scales apart) over
    /// `blocks` blocks; `off` the panels' offsets, laid out as their scales; with `PF`, each
    /// unit prefetches its weights `pf` blocks ahead.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile_avx512<const R: usize, const P: usize, const PF: bool>(
        blocks: usize,
        a: *const u32,
        sa: *const f32,
        w: *const i8,
        wstride: usize,
        dw: *const f32,
        off: *const i32,
        dstride: usize,
        out: &mut Tile,
        pf: usize,
    ) {
        const UNITS: usize = BLOCK / 4;
        let mut f = [[_mm512_setzero_ps(); P]; R];
        for b in 0..blocks {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            for j in 0..P {
                let o = _mm512_loadu_si512(off.add(j * dstride + b * NR) as *const __m512i);
                for acc in acc.iter_mut() {
                    acc[j] = o;
                }
            }
            let ab = a.add(b * UNITS * MR_AVX512);
            for u in 0..UNITS {
                let mut wv = [_mm512_setzero_si512(); P];
                for (j, wv) in wv.iter_mut().enumerate() {
                    let at = w.add(j * wstride + b * PANEL_BLOCK + u * 64);
                    *wv = _mm512_loadu_si512(at as *const __m512i);
                    if PF {
                        // a hint past the panel's end never faults, hence `wrapping_add`
                        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(pf * PANEL_BLOCK));
                    }
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_epi32(*ab.add(u * MR_AVX512 + r) as i32);
                    for (acc, wv) in acc.iter_mut().zip(&wv) {
                        *acc = _mm512_dpbusd_epi32(*acc, av, *wv);
                    }
                }
            }
            for j in 0..P {
                let dv = _mm512_loadu_ps(dw.add(j * dstride + b * NR));
                for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                    let s = _mm512_set1_ps(*sa.add(b * MR_AVX512 + r));
                    f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j]), _mm512_mul_ps(s, dv), f[j]);
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
    pub(super) fn product(x: &[f32], m: usize, w: &PackedQ8) -> Vec<f32> {
        product_with(x, m, w, Out::Product)
    }

    /// [`product`], or (`Out::SwiGlu`, a weight of [`PackedQ8::gate_up`]) its SwiGLU
    /// `(m, n / 2)`, taken as each pair of panels' tile is written.
    pub(super) fn product_with(x: &[f32], m: usize, w: &PackedQ8, out: Out) -> Vec<f32> {
        let (n, k, isa) = (w.n, w.k, w.isa);
        // SAFETY: the CPU has `isa` (`linear` checked)
        let (a, s) = unsafe { quantize_rows(x, m, k, isa) };
        // AVX-512 tiles pair panels
        by_panel_runs(m, n, isa == Isa::Avx512, out, |p0, p1, y| {
            // SAFETY: the CPU has `isa` (`linear` checked); `a` / `s` hold every row group `run`
            // reads and the weight every panel; runs of panels (of pairs, for the SwiGLU)
            // write disjoint columns of `y`, which holds m · out.cols(n) elements.
            unsafe { run(&a, &s, m, w, p0, p1, out, y) };
        })
    }

    /// Panels `p0..p1` of the product (or its SwiGLU: `p0`, `p1` even) into `y`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        a: &[u32],
        s: &[f32],
        m: usize,
        w: &PackedQ8,
        p0: usize,
        p1: usize,
        out: Out,
        y: *mut f32,
    ) {
        let (blocks, mr, units) = (w.k / BLOCK, mr(w.isa), BLOCK / group(w.isa));
        let wide = w.isa == Isa::Avx512;
        let pf = super::prefetch(w.isa);
        run_tiles(
            (m, w.n),
            (mr, MC),
            wide,
            (p0, p1),
            out,
            y,
            |p, width, g0, rows, t| {
                let gi = g0 / mr;
                let ag = a.as_ptr().add(gi * blocks * units * mr);
                let sg = s.as_ptr().add(gi * blocks * mr);
                tile_at(w, p, width, rows, ag, sg, t, pf);
            },
        );
    }

    /// Rows `0..rows` of one row group (`ag` / `sg`: its units and scales) × panels
    /// `p..p + width` (`width` 2 only under AVX-512) of `w` into `out`.
    ///
    /// # Safety
    /// The CPU has `w`'s ISA; the row group and panels are within `w` and the rounded rows.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_at(
        w: &PackedQ8,
        p: usize,
        width: usize,
        rows: usize,
        ag: *const u32,
        sg: *const f32,
        out: &mut Tile,
        pf: usize,
    ) {
        let blocks = w.k / BLOCK;
        let wp = w.q.as_ptr().add(p * blocks * PANEL_BLOCK);
        let dp = w.d.as_ptr().add(p * blocks * NR);
        // one arm per tile height: `$r` rows, the tile's kernel at that height
        macro_rules! by_rows {
            ($call:ident; $($r:literal)*) => {
                match rows {
                    $($r => $call!($r),)*
                    _ => unreachable!("a tile of {rows} rows (at most the level's tile)"),
                }
            };
        }
        match w.isa {
            Isa::Avx2 => {
                macro_rules! go {
                    ($r:literal) => {
                        tile_avx2::<$r>(blocks, ag, sg, wp, dp, out)
                    };
                }
                by_rows!(go; 1 2 3 4)
            }
            Isa::AvxVnni => {
                let op = w.offset.as_ptr().add(p * blocks * NR);
                macro_rules! go {
                    ($r:literal) => {
                        match pf {
                            0 => tile_vnni256::<$r, false>(blocks, ag, sg, wp, dp, op, out, 0),
                            _ => tile_vnni256::<$r, true>(blocks, ag, sg, wp, dp, op, out, pf),
                        }
                    };
                }
                by_rows!(go; 1 2 3 4 5 6)
            }
            Isa::Avx512 => {
                let op = w.offset.as_ptr().add(p * blocks * NR);
                let (ws, ds) = (blocks * PANEL_BLOCK, blocks * NR);
                macro_rules! go {
                    ($r:literal) => {
                        match (width, pf) {
                            (2, 0) => tile_avx512::<$r, 2, false>(
                                blocks, ag, sg, wp, ws, dp, op, ds, out, 0,
                            ),
                            (2, _) => tile_avx512::<$r, 2, true>(
                                blocks, ag, sg, wp, ws, dp, op, ds, out, pf,
                            ),
                            (_, 0) => tile_avx512::<$r, 1, false>(
                                blocks, ag, sg, wp, ws, dp, op, ds, out, 0,
                            ),
                            (_, _) => tile_avx512::<$r, 1, true>(
                                blocks, ag, sg, wp, ws, dp, op, ds, out, pf,
                            ),
                        }
                    };
                }
                by_rows!(go; 1 2 3 4 5 6)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{DType, Device};

    use super::*;

    fn q8(w: &Tensor) -> Result<(Vec<u8>, QTensor)> {
        let q = QTensor::quantize(w, GgmlDType::Q8_0)?;
        Ok((q.data()?.into_owned(), q))
    }

    /// Both kernels equal the plain-Rust sums bit for bit, on every tail there is: row counts
    /// off the tile and row-block sizes, ragged last panels after odd and even counts of whole
    /// ones, one block of `k` and many, 3-D and strided inputs, a single row.
    #[test]
    fn kernels_equal_the_reference_sums() -> Result<()> {
        let levels = Isa::supported();
        if levels.is_empty() {
            eprintln!("no AVX2 + FMA: the q8_0 kernels do not run here");
            return Ok(());
        }
        let dev = Device::Cpu;
        for &isa in levels {
            for (xdims, n) in [
                (vec![37usize, 96], 130usize),
                (vec![2, 19, 64], 48),
                (vec![1, 1, 896], 7),
                (vec![5, 32], 50),
                (vec![MC + 7, 160], 176),
                (vec![13, 1280], 16),
                (vec![MC + 9, 2080], 40),
                (vec![150, 64], 33),
            ] {
                let k = *xdims.last().unwrap();
                let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
                let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (n, k), &dev)?)?;
                let w = PackedQ8::from_blocks(&bytes, n, k, isa).expect("fits");
                assert_eq!(w.dims(), (n, k));
                let m = x.elem_count() / k;
                let xs = x.flatten_all()?.to_vec1::<f32>()?;
                let want = product_reference(&xs, m, &w);
                // with and without the weight prefetch (a hint: the same sums), also past the
                // panel's end (the process-wide setting only changes speed for other tests)
                for pf in [0, 1, 4, 100] {
                    set_prefetch(pf);
                    let got = linear(&x, &w)?;
                    let mut want_dims = xdims.clone();
                    *want_dims.last_mut().unwrap() = n;
                    assert_eq!(got.dims(), &want_dims[..]);
                    let got = got.flatten_all()?.to_vec1::<f32>()?;
                    assert!(
                        got == want,
                        "{isa:?} {xdims:?} x ({n}, {k}), prefetch {pf}: differs"
                    );
                }
                set_prefetch(usize::MAX);
            }
            let x = Tensor::randn(0f32, 1.0, (64, 10), &dev)?.t()?; // (10, 64), strided
            let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (20, 64), &dev)?)?;
            let w = PackedQ8::from_blocks(&bytes, 20, 64, isa).expect("fits");
            let got = linear(&x, &w)?.flatten_all()?.to_vec1::<f32>()?;
            let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
            assert!(
                got == product_reference(&xs, 10, &w),
                "{isa:?} strided input"
            );
        }
        Ok(())
    }

    /// The reference sums are the product of the dequantized weight and the activations
    /// rounded to 8-bit blocks, up to f32 rounding; and the packed weight dequantizes to
    /// exactly candle's dequantization.
    #[test]
    fn the_reference_is_the_product_of_the_rounded_operands() -> Result<()> {
        let dev = Device::Cpu;
        let (m, n, k) = (9usize, 40usize, 128usize);
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
        let (bytes, qt) = q8(&Tensor::randn(0f32, 0.2, (n, k), &dev)?)?;
        let dense = qt.dequantize(&dev)?;
        // the activations rounded to 8-bit blocks, dequantized
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
        let want = xr.matmul(&dense.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            let w = PackedQ8::from_blocks(&bytes, n, k, isa).expect("fits");
            assert_eq!(w.rows(), dense.flatten_all()?.to_vec1::<f32>()?, "{isa:?}");
            let got = product_reference(&x.flatten_all()?.to_vec1::<f32>()?, m, &w);
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(diff <= 1e-5 * scale, "{isa:?}: {diff} vs scale {scale}");
        }
        Ok(())
    }

    /// One broadcast unit of `isa`'s kernel from `G` rounded values.
    #[cfg(target_arch = "x86_64")]
    fn pack_unit(vals: &[i8], isa: Isa) -> u32 {
        match isa {
            // two i16, the first in the low half (vpmaddwd's pair order)
            Isa::Avx2 => (vals[0] as i16 as u16 as u32) | ((vals[1] as i16 as u16 as u32) << 16),
            // four u8 offset by 128, the first in the low byte
            Isa::AvxVnni | Isa::Avx512 => u32::from_le_bytes([
                (vals[0] as i32 + 128) as u8,
                (vals[1] as i32 + 128) as u8,
                (vals[2] as i32 + 128) as u8,
                (vals[3] as i32 + 128) as u8,
            ]),
        }
    }

    /// The vector rounding of a block equals the scalar one: random blocks of several scales,
    /// exact ties (x · 127 / max|x| = k + 0.5), an all-zero block, one large value.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_rounding_equals_scalar_rounding() -> Result<()> {
        let dev = Device::Cpu;
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-6f32, 1.0, 3e4] {
            let x = Tensor::randn(0f32, scale, (200, BLOCK), &dev)?.to_vec2::<f32>()?;
            blocks.extend(x);
        }
        // max 127: every x = k + 0.5 is an exact tie of x · 127 / 127
        blocks.push(
            (0..BLOCK)
                .map(|i| i as f32 + 0.5)
                .chain([127.0])
                .skip(1)
                .collect(),
        );
        blocks.push(vec![0.0; BLOCK]);
        let mut big = vec![1e-3f32; BLOCK];
        big[17] = -9e9;
        blocks.push(big);
        for &isa in Isa::supported() {
            let g = group(isa);
            for b in &blocks {
                assert_eq!(b.len(), BLOCK);
                let (d, q) = quantize_block_scalar(b);
                let want: Vec<u32> = q.chunks_exact(g).map(|v| pack_unit(v, isa)).collect();
                let mut units = vec![0u32; BLOCK / g];
                // SAFETY: the CPU has `isa`; `b` holds 32 floats, `units` the block's units.
                let dv = unsafe { x86::quantize_units(b, isa, units.as_mut_ptr(), 1) };
                assert_eq!(
                    (d.to_bits(), want),
                    (dv.to_bits(), units),
                    "{} {b:?}",
                    isa.name()
                );
            }
        }
        Ok(())
    }

    /// The rows' rounding and packing in registers (`quantize_units`) equals rounding each
    /// block with the scalar form and packing its units one by one, at every ISA level: random
    /// rows of three scales, exact ties, zeros and a huge value, row counts not a multiple of
    /// the tile's.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_rounding_equals_scalar_rounding_and_packing() -> Result<()> {
        let dev = Device::Cpu;
        let k = 4 * BLOCK;
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-6f32, 1.0, 3e4] {
            rows.extend(Tensor::randn(0f32, scale, (5, k), &dev)?.to_vec2::<f32>()?);
        }
        let ties: Vec<f32> = (0..BLOCK)
            .map(|i| i as f32 + 0.5)
            .skip(1)
            .chain([127.0])
            .collect();
        let mut special = ties.clone();
        special.extend(vec![0.0; BLOCK]);
        let mut big = vec![1e-3f32; BLOCK];
        big[17] = -9e9;
        special.extend(big);
        special.extend(ties.iter().map(|x| -x));
        rows.push(special);
        for &isa in Isa::supported() {
            for m in [1, rows.len() - 3, rows.len()] {
                let x: Vec<f32> = rows[..m].concat();
                // SAFETY: the CPU has `isa`
                let (a, s) = unsafe { x86::quantize_rows(&x, m, k, isa) };
                let (mr, g) = (mr(isa), group(isa));
                let units = BLOCK / g;
                let (mut want_a, mut want_s) = (vec![0u32; a.len()], vec![0f32; s.len()]);
                for r in 0..m {
                    let (gi, rr) = (r / mr, r % mr);
                    for (b, xs) in x[r * k..][..k].chunks_exact(BLOCK).enumerate() {
                        let (d, q) = quantize_block_scalar(xs);
                        want_s[(gi * (k / BLOCK) + b) * mr + rr] = d;
                        for (u, vals) in q.chunks_exact(g).enumerate() {
                            let at = ((gi * (k / BLOCK) + b) * units + u) * mr + rr;
                            want_a[at] = pack_unit(vals, isa);
                        }
                    }
                }
                assert_eq!(a, want_a, "{} m {m}", isa.name());
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&s), bits(&want_s), "{} m {m}", isa.name());
            }
        }
        Ok(())
    }

    /// The fused gate|up SwiGLU equals the stacked product followed by the SwiGLU pass, bit for
    /// bit, at every level the CPU has: row counts off the tile and across row blocks, one
    /// pair of panels and many, one block of `k` and many; and `gate_up` refuses an `F` that is
    /// not a multiple of 16 and differing shapes.
    #[test]
    fn fused_swiglu_equals_product_then_swiglu() -> Result<()> {
        let dev = Device::Cpu;
        for &isa in Isa::supported() {
            for (m, f, k) in [
                (1usize, 16usize, 32usize),
                (7, 48, 96),
                (MC + 11, 80, 64),
                (13, 16, 1280),
            ] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                let pack = |seed: f32| -> Result<PackedQ8> {
                    let w = (Tensor::randn(0f32, 0.2, (f, k), &dev)? + seed as f64)?;
                    let (bytes, _) = q8(&w)?;
                    Ok(PackedQ8::from_blocks(&bytes, f, k, isa).expect("fits"))
                };
                let (gate, up) = (pack(0.0)?, pack(0.01)?);
                let fused = PackedQ8::gate_up(&gate, &up).expect("fits");
                let stacked = PackedQ8::stack(&[&gate, &up]).expect("stacks");
                let want = super::super::swiglu::swiglu(&linear(&x, &stacked)?)?;
                let got = swiglu(&x, &fused)?;
                assert_eq!(got.dims(), &[m, f]);
                let (got, want) = (
                    got.flatten_all()?.to_vec1::<f32>()?,
                    want.flatten_all()?.to_vec1::<f32>()?,
                );
                assert!(got == want, "{isa:?} m {m} F {f} k {k}: differs");
            }
            let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (24, 64), &dev)?)?;
            let odd = PackedQ8::from_blocks(&bytes, 24, 64, isa).expect("fits");
            assert!(PackedQ8::gate_up(&odd, &odd).is_none(), "F = 24");
            let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (32, 64), &dev)?)?;
            let a = PackedQ8::from_blocks(&bytes, 32, 64, isa).expect("fits");
            let (bytes, _) = q8(&Tensor::randn(0f32, 0.2, (16, 64), &dev)?)?;
            let b = PackedQ8::from_blocks(&bytes, 16, 64, isa).expect("fits");
            assert!(PackedQ8::gate_up(&a, &b).is_none(), "32 vs 16 rows");
        }
        Ok(())
    }

    /// Stacking equals packing the stacked blocks; unaligned parts, differing `in` or
    /// kernels are refused, and so are blocks that do not fit the shape.
    #[test]
    fn stacking_and_refusals() -> Result<()> {
        let dev = Device::Cpu;
        let ws: Vec<Tensor> = [32usize, 16, 7]
            .iter()
            .map(|&r| Tensor::randn(0f32, 1.0, (r, 64), &dev))
            .collect::<Result<_>>()?;
        let all = Tensor::cat(&ws, 0)?;
        for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            let parts: Vec<PackedQ8> = ws
                .iter()
                .map(|w| {
                    let (b, _) = q8(w)?;
                    Ok(PackedQ8::from_blocks(&b, w.dim(0)?, 64, isa).expect("fits"))
                })
                .collect::<Result<_>>()?;
            let refs: Vec<&PackedQ8> = parts.iter().collect();
            let stacked = PackedQ8::stack(&refs).expect("aligned");
            let (b, _) = q8(&all)?;
            let whole = PackedQ8::from_blocks(&b, 55, 64, isa).expect("fits");
            assert_eq!(stacked.dims(), (55, 64));
            assert_eq!(stacked.q, whole.q);
            assert_eq!(stacked.d, whole.d);
            assert_eq!(stacked.offset, whole.offset);
            assert!(
                PackedQ8::stack(&[&parts[2], &parts[0]]).is_none(),
                "7 rows first"
            );
        }
        let (b, _) = q8(&ws[1])?;
        let a2 = PackedQ8::from_blocks(&b, 16, 64, Isa::Avx2).expect("fits");
        let a5 = PackedQ8::from_blocks(&b, 16, 64, Isa::Avx512).expect("fits");
        assert!(PackedQ8::stack(&[&a2, &a5]).is_none(), "two kernels");
        assert!(PackedQ8::stack(&[]).is_none());
        assert!(
            PackedQ8::from_blocks(&b, 16, 32, Isa::Avx2).is_none(),
            "bytes of (16, 64)"
        );
        assert!(
            PackedQ8::from_blocks(&[0u8; 34], 1, 40, Isa::Avx2).is_none(),
            "k 40"
        );
        Ok(())
    }

    /// A mis-sized or non-f32 input is an error naming the shapes, never a panic.
    #[test]
    fn a_mis_sized_input_is_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let (b, _) = q8(&Tensor::zeros((4, 64), DType::F32, &dev)?)?;
        let Some(&isa) = Isa::supported().first() else {
            return Ok(());
        };
        let w = PackedQ8::from_blocks(&b, 4, 64, isa).expect("fits");
        let e = linear(&Tensor::zeros((3, 32), DType::F32, &dev)?, &w).expect_err("k 32 vs 64");
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = linear(&Tensor::zeros((3, 64), DType::F64, &dev)?, &w).expect_err("f64");
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert_eq!(
            linear(&Tensor::zeros((0, 64), DType::F32, &dev)?, &w)?.dims(),
            &[0, 4]
        );
        // all-zero activations round to zero blocks (scale 0), not NaN
        let y = linear(&Tensor::zeros((2, 64), DType::F32, &dev)?, &w)?;
        assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, vec![0f32; 8]);
        Ok(())
    }
}
