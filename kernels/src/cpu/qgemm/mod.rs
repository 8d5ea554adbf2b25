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
//! [`portable::product`] computes the same sums in plain Rust; the tests hold the kernels to it
//! bit for bit.

use super::aligned::Aligned;
use super::isa::Isa;
use super::panel::NR;
#[cfg(target_arch = "x86_64")]
use super::tile_store::Out;
use super::Result;

/// `k` per `Q8_0` block.
pub const BLOCK: usize = 32;
/// Bytes of one (panel, block): 16 columns × 32 int8.
const PANEL_BLOCK: usize = NR * BLOCK;
/// Bytes of one serialized `Q8_0` block: an f16 scale and 32 int8.
const Q8_0_BYTES: usize = 34;
/// Rows per tile (AVX2).
#[cfg(target_arch = "x86_64")]
const MR_AVX2: usize = 4;
/// Rows per tile (AVX-VNNI).
#[cfg(target_arch = "x86_64")]
const MR_VNNI256: usize = 6;
/// Rows per tile (AVX-512).
#[cfg(target_arch = "x86_64")]
const MR_AVX512: usize = 6;
/// Rows per block of the row loop: a few row groups' activations stay in L2 while the
/// thread's panels pass over them (public for the tests' shapes across row blocks).
pub const MC: usize = 48;

/// How many 32-value blocks ahead the AVX-512 and AVX-VNNI tiles prefetch their panels' weights
/// (one `prefetcht0` per 64 bytes read; 0: none), where set for the whole process: by the
/// installed settings' `q_prefetch` (taken once) or [`set_prefetch`] (the `cpu_linear` bench compares
/// distances in one process). Unset (`usize::MAX`), each level takes [`default_prefetch`].
static PREFETCH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// The distance a level prefetches at unless set: 4 blocks (2 KiB of a panel's weights) under
/// AVX-512, none under AVX-VNNI. Measured with the `cpu_linear` bench (one process): one
/// layer's products 1.6 % faster at 512 rows and 11 % at 40 under AVX-512; under AVX-VNNI 3–5 %
/// slower at 512 rows and within ±4 % at 40 at every distance tried.
pub fn default_prefetch(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 4,
        Isa::Avx2 | Isa::AvxVnni => 0,
    }
}

/// The prefetch distance the integer tiles of `isa` use now (see [`PREFETCH`]).
pub fn prefetch(isa: Isa) -> usize {
    use std::sync::atomic::Ordering;
    static FROM_SETTINGS: std::sync::Once = std::sync::Once::new();
    FROM_SETTINGS.call_once(|| {
        if let Some(v) = super::settings::current().q_prefetch {
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
/// the load refuses, the backends' `cpu::switches`).
pub fn parse_prefetch(v: &str) -> std::result::Result<usize, String> {
    v.trim().parse().map_err(|_| {
        format!("FORKSCORE_CPU_QPREFETCH={v:?}: not a count of blocks (0 turns the prefetch off)")
    })
}

/// Set the integer tiles' prefetch distance for the process (blocks ahead; 0: none;
/// `usize::MAX`: each level's default again).
pub fn set_prefetch(blocks: usize) {
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
#[cfg(target_arch = "x86_64")]
fn mr(isa: Isa) -> usize {
    match isa {
        Isa::Avx2 => MR_AVX2,
        Isa::AvxVnni => MR_VNNI256,
        Isa::Avx512 => MR_AVX512,
    }
}

/// A `Q8_0` weight `W (n, k)` packed for the kernel of one [`Isa`] (`k` a multiple of 32;
/// the last panel zero-padded, with zero scales).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedQ8 {
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
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The AVX-512 layout's int8 values `[panel][block][8][16][4]` (a panel's block is one
    /// AMX int8 B tile as it is) and scales `[panel][block][16]`; `None` for the AVX2 layout.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
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
    /// What [`swiglu_product`] reads; `None` when the two do not fit.
    pub fn gate_up(gate: &PackedQ8, up: &PackedQ8) -> Option<Self> {
        let (f, k, isa) = (gate.n, gate.k, gate.isa);
        if f == 0 || !f.is_multiple_of(NR) || (up.n, up.k, up.isa) != (f, k, isa) {
            return None;
        }
        let blocks = k / BLOCK;
        use super::tile_store::alternate;
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

/// That `x` holds `m` rows of `k`.
fn rows_fit(what: &str, x: &[f32], m: usize, k: usize) -> Result<()> {
    if x.len() != m * k {
        super::bail!("{what}: {} values are not {m} rows of {k}", x.len());
    }
    Ok(())
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major through the integer kernel of `w`'s [`Isa`]. An error
/// (never a panic) on a CPU without that ISA or an `x` that is not `m` rows of `k`. (The
/// backends' layer dispatcher sends AVX-512 weights to the AMX int8 tiles instead,
/// [`super::amx::q8_product`], when `FORKSCORE_CPU_Q8=amx` asks for them.)
pub fn product(x: &[f32], m: usize, w: &PackedQ8) -> Result<Vec<f32>> {
    w.isa.require("q8_0 linear")?;
    rows_fit("q8_0 linear", x, m, w.k)?;
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::product(x, m, w))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("no ISA is supported off x86-64 ({}, {m})", x.len())
    }
}

/// `x (m, k) -> (m, F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedQ8::gate_up`], the SwiGLU taken as each output tile is written, so the `(m, 2F)`
/// product is never stored. Equal bit for bit to [`product`] on the stacked `[gate; up]` weight
/// followed by the SwiGLU of each row (the same sums, the same [`super::math::silu_mul`] on
/// every element; tested in the backends). Errors as [`product`].
pub fn swiglu_product(x: &[f32], m: usize, w: &PackedQ8) -> Result<Vec<f32>> {
    w.isa.require("q8_0 gate|up")?;
    rows_fit("q8_0 gate|up", x, m, w.k)?;
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::product_with(x, m, w, Out::SwiGlu))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("no ISA is supported off x86-64 ({}, {m})", x.len())
    }
}

pub mod portable;

/// The block rounding in registers, for the 4-bit kernel's activations.
#[cfg(target_arch = "x86_64")]
pub(super) use x86::rounded as x86_rounded;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
