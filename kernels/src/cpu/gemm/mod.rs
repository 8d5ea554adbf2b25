//! f32 linear layers on x86 CPUs with AVX2 + FMA: `y = x Wᵀ` against a weight packed once at
//! load time into panels of [`NR`] output columns (`(⌈out/16⌉, in, 16)`, k-major inside a
//! panel), so no call packs the weight again, and a register-tiled microkernel (`mr` × 16).
//!
//! Why: a linear layer through candle's matmul (the `gemm` crate) packs both operands on every
//! call, and so does OpenBLAS through `cblas_sgemm`. Scoring passes multiply a few dozen rows
//! by each weight, where packing the weight costs about as much as the product (measured on an
//! AVX2 core, one thread, Qwen2.5-0.5B shapes: 32 × 896 → 4,864 ran at 43–52 GFLOP/s
//! here against OpenBLAS's 30–38; a 480-row prefill product at 64–80 against 62–77).
//!
//! Per call ([`Blocking`] holds the sizes): the activations `x (m, k)` are packed once into
//! groups of `mr` rows (k-major inside a group, the microkernel broadcasts one element per
//! row); the panels are split into one contiguous run per rayon thread; each thread walks its
//! panels in blocks of `nc`, rows in blocks of `mc` and `k` in blocks of `kc` (for `k` up to
//! `short_k` the `k` loop is innermost, so each output tile is finished while it is in cache;
//! for longer `k` it is outermost, so a panel block stays in cache across all rows). A ragged
//! last panel is computed into a scratch strip and copied.
//!
//! Where the CPU has AVX-512 ([`Isa::Avx512`]) the same panels go through an `mr` × 32
//! microkernel of 16-lane registers (14 rows by default, [`Blocking::default_for`]), two panels
//! at a time (one for an odd last panel).
//!
//! The weight is packed only where the CPU has AVX2 and FMA (detected once); elsewhere layers
//! keep candle's dense weight and matmul (the backends' shell, `candle::cpu::gemm`, decides:
//! `FORKSCORE_CPU_GEMM=candle`, or `openblas` with that feature, keeps the dense weight too, to
//! compare; `FORKSCORE_CPU_GEMM=amx` splits it for the AMX kernel of [`super::amx`] where the CPU
//! has AMX). The backends' equivalence tests hold this kernel to candle's matmul.

use super::aligned::Aligned;
use super::isa::Isa;
use super::Result;

pub use super::panel::NR;
/// Rows per microkernel tile, at most (AVX2: 6 rows × 2 registers of accumulators; AVX-512:
/// 14 rows × 2 registers, 28 of the 32).
const MAX_MR_AVX2: usize = 6;
const MAX_MR_AVX512: usize = 14;

/// How one product is blocked. Each ISA has a default ([`Blocking::default_for`]); a spec
/// ([`Blocking::parse`]; the backends read `FORKSCORE_CPU_GEMM_BLOCKING`, e.g. `mr=12,mc=96`,
/// keys as the fields, the rest from the default) overrides it for the process, to compare
/// blockings on one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// Rows per microkernel tile (the activations are packed in groups of this many rows).
    pub mr: usize,
    /// `k` per block: a panel block (`kc × 16` floats per panel) and a row group stay in L1.
    pub kc: usize,
    /// Rows per block (rounded up to a multiple of `mr`): the block's packed rows stay in L2.
    pub mc: usize,
    /// Panels (16 columns each) per block.
    pub nc: usize,
    /// Longest `k` that runs with the `k` loop innermost (each output tile finished while in
    /// cache); a longer `k` runs it outermost (a panel block stays in cache across all rows).
    pub short_k: usize,
    /// How many `k` steps ahead each step of an f32 tile prefetches its panels' weights into
    /// L1 (`prefetcht0`; 0: none). The bf16 kernel, which shares these blockings, ignores it.
    pub pf: usize,
}

impl Blocking {
    /// The blocking `isa`'s kernel runs with unless overridden.
    /// - AVX2: 6-row tiles (12 of the 16 registers accumulate), 256-`k` blocks (a 16 KiB panel
    ///   block and a 6 KiB row group in L1), 72-row blocks (72 KiB of packed rows in L2).
    /// - AVX-512: 14-row tiles (28 of the 32 registers accumulate: 16 loads per 28 FMAs
    ///   instead of 8 per 12), 384-`k` blocks, 84-row blocks. Chosen with the `cpu_linear`
    ///   bench's sweep of 21 blockings: the fastest on every AVX-512 CPU tried (7–9 % less time
    ///   for a layer's products at 512 rows than 6-row tiles, the old default) and, end to end,
    ///   4–12 % faster decisions (ABBA runs of the modes bench).
    ///   Each `k` step prefetches its panels' weights 16 steps ahead: one layer's products ran
    ///   6–7 % faster at 512 rows and 17 % at 40 on some CPUs (the `cpu_linear` bench,
    ///   round-robin in one process), and decisions were ~1 % faster where the products gained
    ///   least (alternating processes).
    /// - Both: 8 panels (128 columns) per block, `k` innermost up to 1,536.
    pub fn default_for(isa: Isa) -> Self {
        let (mr, kc, mc, pf) = match isa {
            Isa::Avx2 | Isa::AvxVnni => (6, 256, 72, 0),
            Isa::Avx512 => (14, 384, 84, 16),
        };
        Blocking {
            mr,
            kc,
            mc,
            nc: 8,
            short_k: 1536,
            pf,
        }
    }

    /// The most rows a tile of `isa` holds in registers.
    pub fn max_mr(isa: Isa) -> usize {
        match isa {
            Isa::Avx2 | Isa::AvxVnni => MAX_MR_AVX2,
            Isa::Avx512 => MAX_MR_AVX512,
        }
    }

    /// `spec` (`key=value` pairs, comma-separated; keys `mr`, `kc`, `mc`, `nc`, `short_k`,
    /// `pf`) over `isa`'s default. Errors name the key or value that is wrong: an unknown key, a
    /// value that is not a count, a zero, or `mr` above what `isa`'s tile holds.
    pub fn parse(spec: &str, isa: Isa) -> std::result::Result<Self, String> {
        let mut b = Self::default_for(isa);
        for (part, key, v) in super::host::spec_counts(spec)? {
            let slot = match key {
                "mr" => &mut b.mr,
                "kc" => &mut b.kc,
                "mc" => &mut b.mc,
                "nc" => &mut b.nc,
                "short_k" => {
                    b.short_k = v;
                    continue;
                }
                "pf" => {
                    b.pf = v;
                    continue;
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` (mr, kc, mc, nc, short_k, pf)"
                    ))
                }
            };
            if v == 0 {
                return Err(format!("`{part}`: must be at least 1"));
            }
            *slot = v;
        }
        if b.mr > Self::max_mr(isa) {
            return Err(format!(
                "mr={} is more rows than a {} tile holds ({})",
                b.mr,
                isa.name(),
                Self::max_mr(isa)
            ));
        }
        b.mc = b.mc.next_multiple_of(b.mr);
        Ok(b)
    }
}

/// The formats [`PackedWeight::from_blocks`] unpacks: ggml's serialized blocks of 32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocks {
    /// 34 bytes a block: an f16 scale `d` and 32 int8 `q` (`d · q`).
    Q8_0,
    /// 18 bytes a block: an f16 scale `d` and 16 bytes of nibbles (`d · (nibble − 8)`).
    Q4_0,
}

/// A weight `W (n, k)` packed into `⌈n/16⌉` panels of 16 columns, each `k × 16` (column `c` of
/// panel `p` is row `16p + c` of `W`; the last panel is zero-padded). Each panel row is one
/// 64-byte cache line.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    n: usize,
    k: usize,
    panels: Aligned<f32>,
}

impl PackedWeight {
    /// The `⌈n/16⌉` zeroed panels of an `(n, k)` weight, each filled on the rayon threads by
    /// `fill(p, panel, rows)` (`rows` ≤ 16: how many of the panel's columns are real rows).
    fn filled(n: usize, k: usize, fill: impl Fn(usize, &mut [f32], usize) + Sync) -> Self {
        use rayon::prelude::*;
        let mut panels = Aligned::zeroed(n.div_ceil(NR) * k * NR);
        panels
            .par_chunks_mut((k * NR).max(1))
            .enumerate()
            .for_each(|(p, panel)| fill(p, panel, NR.min(n.saturating_sub(p * NR))));
        PackedWeight { n, k, panels }
    }

    /// Pack row-major `w (n, k)`, on the rayon threads (a panel each).
    pub fn from_rows(w: &[f32], n: usize, k: usize) -> Self {
        Self::filled(n, k, |p, panel, rows| {
            // by runs of 64 k: the 16 rows' runs land in one 4 KiB stretch of the panel
            for k0 in (0..k).step_by(64) {
                let k1 = (k0 + 64).min(k);
                for c in 0..rows {
                    let row = &w[(p * NR + c) * k..][k0..k1];
                    for (kk, &v) in (k0..k1).zip(row) {
                        panel[kk * NR + c] = v;
                    }
                }
            }
        })
    }

    /// Pack a ggml weight `(n, k)` straight from its blocks, for `Q8_0` (`d · q`, 34-byte
    /// blocks) and `Q4_0` (`d · (nibble − 8)`, 18-byte blocks): exactly candle's dequantization
    /// (tested equal), on the rayon threads, without the dense intermediate. `None` for other
    /// a byte count that does not fit `(n, k)`.
    pub fn from_blocks(ggml: Blocks, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let block_bytes = match ggml {
            Blocks::Q8_0 => 34,
            Blocks::Q4_0 => 18,
        };
        if !k.is_multiple_of(32) || bytes.len() != n * (k / 32) * block_bytes {
            return None;
        }
        let row_bytes = (k / 32) * block_bytes;
        Some(Self::filled(n, k, |p, panel, rows| {
            // block column by block column: the 16 rows' blocks b fill one 2 KiB stretch
            for b in 0..k / 32 {
                for c in 0..rows {
                    let block = &bytes[(p * NR + c) * row_bytes + b * block_bytes..][..block_bytes];
                    let d = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
                    let at = |j: usize| (b * 32 + j) * NR + c;
                    match ggml {
                        Blocks::Q8_0 => {
                            for (j, &q) in block[2..].iter().enumerate() {
                                panel[at(j)] = (q as i8) as f32 * d;
                            }
                        }
                        Blocks::Q4_0 => {
                            for (j, &q) in block[2..].iter().enumerate() {
                                panel[at(j)] = ((q & 0x0F) as i16 - 8) as f32 * d;
                                panel[at(j + 16)] = ((q >> 4) as i16 - 8) as f32 * d;
                            }
                        }
                    }
                }
            }
        }))
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The packed panels, `(⌈n/16⌉, k, 16)`.
    pub fn panels(&self) -> &[f32] {
        &self.panels
    }

    /// The rows of `W`, `(n, k)` row-major.
    pub fn rows(&self) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let mut w = vec![0f32; n * k];
        for (r, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            let panel = &self.panels[(r / NR) * k * NR..];
            for (kk, v) in row.iter_mut().enumerate() {
                *v = panel[kk * NR + r % NR];
            }
        }
        w
    }

    /// `gate` and `up` (each `(F, k)`, `F` a positive multiple of 16) as one `(2F, k)` weight
    /// whose panels alternate: panel `2p` is gate's panel `p`, `2p + 1` up's. What
    /// [`swiglu_product`] reads; `None` when the two do not fit.
    pub fn gate_up(gate: &PackedWeight, up: &PackedWeight) -> Option<Self> {
        let (f, k) = (gate.n, gate.k);
        if f == 0 || !f.is_multiple_of(NR) || (up.n, up.k) != (f, k) {
            return None;
        }
        Some(PackedWeight {
            n: 2 * f,
            k,
            panels: super::tile_store::alternate(&gate.panels, &up.panels, k * NR),
        })
    }

    /// The weights stacked along `out` (`[a; b; …]`), all with one `in`; `None` for an empty
    /// list or differing `in`. Whole panels are concatenated as they are when every part but
    /// the last has a multiple of 16 rows; otherwise the rows are repacked.
    pub fn stack(parts: &[&PackedWeight]) -> Option<Self> {
        let k = parts.first()?.k;
        if parts.iter().any(|p| p.k != k) {
            return None;
        }
        let n = parts.iter().map(|p| p.n).sum();
        let aligned = parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0);
        if aligned {
            let panels = Aligned::concat(&parts.iter().map(|p| &*p.panels).collect::<Vec<_>>());
            return Some(PackedWeight { n, k, panels });
        }
        let rows: Vec<f32> = parts.iter().flat_map(|p| p.rows()).collect();
        Some(Self::from_rows(&rows, n, k))
    }
}

/// That `x` holds `m` rows of `k`.
fn rows_fit(what: &str, x: &[f32], m: usize, k: usize) -> Result<()> {
    if x.len() != m * k {
        super::bail!("{what}: {} values are not {m} rows of {k}", x.len());
    }
    Ok(())
}

/// That the CPU has `isa` and `bl` fits its tile.
pub fn check(isa: Isa, bl: &Blocking) -> Result<()> {
    isa.require("packed linear")?;
    if bl.mr > Blocking::max_mr(isa) || [bl.mr, bl.kc, bl.mc, bl.nc].contains(&0) {
        super::bail!("packed linear: {bl:?} does not fit a {} tile", isa.name());
    }
    if !bl.mc.is_multiple_of(bl.mr) {
        super::bail!("packed linear: {bl:?}: mc is not a multiple of mr");
    }
    Ok(())
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major, with the microkernel of `isa` (which the CPU must
/// support: an error otherwise) and blocking `bl` (an error if `isa`'s tile cannot hold it or a
/// count is 0, see [`check`]).
pub fn product(x: &[f32], m: usize, w: &PackedWeight, isa: Isa, bl: &Blocking) -> Result<Vec<f32>> {
    check(isa, bl)?;
    rows_fit("packed linear", x, m, w.k)?;
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::product(x, m, w, isa, bl))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("no ISA is supported off x86-64 ({}, {m})", x.len())
    }
}

/// The blocking [`swiglu_product`] runs `bl` as: an odd panel block `nc` taken one larger, so no
/// block splits a (gate, up) pair.
pub fn swiglu_blocking(bl: &Blocking) -> Blocking {
    Blocking {
        nc: bl.nc.next_multiple_of(2),
        ..*bl
    }
}

/// That [`swiglu_product`] takes `w` with `isa` and `bl`: [`check`], and `k ≤ short_k` with
/// `out` a whole number of (gate, up) panel pairs.
pub fn check_swiglu(w: &PackedWeight, isa: Isa, bl: &Blocking) -> Result<()> {
    let bl = &swiglu_blocking(bl);
    if w.k > bl.short_k || !w.n.is_multiple_of(2 * NR) {
        super::bail!("packed gate|up: ({}, {}) does not fit {bl:?}", w.n, w.k);
    }
    check(isa, bl)
}

/// `x (m, k) -> (m, F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedWeight::gate_up`], with the microkernel of `isa` and blocking `bl` (`k ≤ bl.short_k`;
/// [`swiglu_blocking`]): each block of output rows and panels is computed into a scratch block
/// in cache and taken through the SwiGLU ([`super::math::silu_mul`]'s lanes) from there, so the
/// `(m, 2F)` product is never stored. Equal bit for bit to [`product`] on the stacked weight
/// followed by the SwiGLU of each row (tested in the backends). Errors as [`check_swiglu`].
pub fn swiglu_product(
    x: &[f32],
    m: usize,
    w: &PackedWeight,
    isa: Isa,
    bl: &Blocking,
) -> Result<Vec<f32>> {
    check_swiglu(w, isa, bl)?;
    rows_fit("packed gate|up", x, m, w.k)?;
    #[cfg(target_arch = "x86_64")]
    {
        let bl = &swiglu_blocking(bl);
        Ok(x86::product_out(
            x,
            m,
            w,
            isa,
            bl,
            super::tile_store::Out::SwiGlu,
        ))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("no ISA is supported off x86-64 ({}, {m})", x.len())
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
