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
//! keep candle's dense weight and matmul. `FORKSCORE_CPU_GEMM=candle` (or `openblas` with that
//! feature) keeps the dense weight too, to compare; `FORKSCORE_CPU_GEMM=amx` splits it for the
//! AMX kernel of [`super::cpu_amx`] where the CPU has AMX. The equivalence tests hold this kernel to
//! candle's matmul.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Result, Tensor};

use super::cpu_aligned::Aligned;
use super::cpu_isa::Isa;

pub(crate) use super::cpu_panel::NR;
/// Rows per microkernel tile, at most (AVX2: 6 rows × 2 registers of accumulators; AVX-512:
/// 14 rows × 2 registers, 28 of the 32).
const MAX_MR_AVX2: usize = 6;
const MAX_MR_AVX512: usize = 14;

/// How one product is blocked. Each ISA has a default ([`Blocking::default_for`]);
/// `FORKSCORE_CPU_GEMM_BLOCKING` (e.g. `mr=12,mc=96`, keys as the fields, the rest from the
/// default) overrides it for the process, to compare blockings on one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocking {
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
        for (part, key, v) in super::cpu_host::spec_counts(spec)? {
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

    /// The blocking this process runs `isa` with: [`Blocking::default_for`], or
    /// `FORKSCORE_CPU_GEMM_BLOCKING` over it (read once; an invalid value is an error naming it).
    pub fn chosen(isa: Isa) -> Result<Self> {
        use std::sync::OnceLock;
        static SPEC: OnceLock<Option<&str>> = OnceLock::new();
        let spec = SPEC.get_or_init(|| crate::switches::value("FORKSCORE_CPU_GEMM_BLOCKING"));
        match spec {
            None => Ok(Self::default_for(isa)),
            Some(s) => Self::parse(s, isa).map_err(|e| {
                candle_core::Error::Msg(format!("FORKSCORE_CPU_GEMM_BLOCKING={s:?}: {e}"))
            }),
        }
    }
}

/// Which CPU GEMM f32 dense layers use, read once from `FORKSCORE_CPU_GEMM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuGemm {
    /// Weights packed at load, this module's kernel (the default where the CPU has AVX2 + FMA).
    Packed,
    /// The system OpenBLAS (`--features openblas`, `FORKSCORE_CPU_GEMM=openblas`).
    OpenBlas,
    /// candle's matmul (the reference; the default elsewhere).
    Candle,
}

/// The GEMM this process runs CPU f32 linear layers with.
pub(crate) fn choice() -> CpuGemm {
    use std::sync::OnceLock;
    static C: OnceLock<CpuGemm> = OnceLock::new();
    *C.get_or_init(|| match asked() {
        "candle" => CpuGemm::Candle,
        "openblas" if cfg!(feature = "openblas") => CpuGemm::OpenBlas,
        _ if kernel_available() => CpuGemm::Packed,
        _ if cfg!(feature = "openblas") => CpuGemm::OpenBlas,
        _ => CpuGemm::Candle,
    })
}

/// Whether f32 dense layers run through the AMX bf16 × 6 kernel of [`super::cpu_amx`]: only
/// when asked (`FORKSCORE_CPU_GEMM=amx`) and the CPU and OS run AMX tiles; elsewhere, or
/// unasked, this module's kernel. Opt-in because on the AMX CPUs tried it measured slower end
/// to end than the AVX-512 kernel (see `cpu_amx`).
pub(crate) fn amx() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        asked() == "amx" && choice() == CpuGemm::Packed && super::cpu_isa::amx_available()
    })
}

/// `FORKSCORE_CPU_GEMM`, trimmed (empty when unset), read once.
fn asked() -> &'static str {
    use std::sync::OnceLock;
    static ASKED: OnceLock<String> = OnceLock::new();
    ASKED.get_or_init(|| {
        crate::switches::value("FORKSCORE_CPU_GEMM")
            .unwrap_or_default()
            .to_ascii_lowercase()
    })
}

/// Whether this CPU runs the packed kernel (x86-64 with AVX2 and FMA: some [`Isa`] level).
pub(crate) fn kernel_available() -> bool {
    Isa::chosen().is_some()
}

/// A weight `W (n, k)` packed into `⌈n/16⌉` panels of 16 columns, each `k × 16` (column `c` of
/// panel `p` is row `16p + c` of `W`; the last panel is zero-padded). Each panel row is one
/// 64-byte cache line.
#[derive(Debug, Clone)]
pub(crate) struct PackedWeight {
    n: usize,
    k: usize,
    panels: Aligned<f32>,
}

impl PackedWeight {
    /// Pack `w (n, k)` (any float dtype, any device: read as f32 on the host).
    pub fn pack(w: &Tensor) -> Result<Self> {
        super::cpu_host::with_host_rows(w, Self::from_rows)
    }

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

    fn from_rows(w: &[f32], n: usize, k: usize) -> Self {
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
    /// types or a byte count that does not fit `(n, k)`.
    pub fn from_blocks(ggml: GgmlDType, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let block_bytes = match ggml {
            GgmlDType::Q8_0 => 34,
            GgmlDType::Q4_0 => 18,
            _ => return None,
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
                        GgmlDType::Q8_0 => {
                            for (j, &q) in block[2..].iter().enumerate() {
                                panel[at(j)] = (q as i8) as f32 * d;
                            }
                        }
                        _ => {
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
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The rows of `W`, `(n, k)` row-major.
    fn rows(&self) -> Vec<f32> {
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

    /// `W` as a dense `(n, k)` f32 tensor on the host.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn unpack(&self) -> Result<Tensor> {
        Tensor::from_vec(self.rows(), (self.n, self.k), &Device::Cpu)
    }

    /// `gate` and `up` (each `(F, k)`, `F` a positive multiple of 16) as one `(2F, k)` weight
    /// whose panels alternate: panel `2p` is gate's panel `p`, `2p + 1` up's. What [`swiglu`]
    /// reads; `None` when the two do not fit.
    pub fn gate_up(gate: &PackedWeight, up: &PackedWeight) -> Option<Self> {
        let (f, k) = (gate.n, gate.k);
        if f == 0 || !f.is_multiple_of(NR) || (up.n, up.k) != (f, k) {
            return None;
        }
        Some(PackedWeight {
            n: 2 * f,
            k,
            panels: super::cpu_tile_store::alternate(&gate.panels, &up.panels, k * NR),
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

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU. Errors (never panics) on a non-f32, non-CPU or
/// mis-sized `x`.
pub(crate) fn linear(x: &Tensor, w: &PackedWeight) -> Result<Tensor> {
    match Isa::chosen().map(Isa::f32_level) {
        Some(isa) => linear_with(x, w, isa, &Blocking::chosen(isa)?),
        None => candle_core::bail!("packed linear: this CPU has no AVX2 + FMA"),
    }
}

/// Whether [`swiglu`] takes a gate | up weight of input width `k` in this process: the
/// kernel runs here and its blocking keeps `k` innermost (`k ≤ short_k`), so each output block
/// is whole while it is in cache.
pub(crate) fn swiglu_fits(k: usize) -> bool {
    match Isa::chosen().map(Isa::f32_level) {
        Some(isa) => Blocking::chosen(isa).is_ok_and(|bl| k <= bl.short_k),
        None => false,
    }
}

/// `x (.., k) -> (.., F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedWeight::gate_up`]: each block of output rows and panels is computed into a scratch
/// block in cache and taken through the SwiGLU from there, so the `(.., 2F)` product is never
/// stored. Equal bit for bit to [`linear`] on the stacked weight followed by
/// [`super::swiglu::swiglu`] (tested). Errors as [`linear`], and where [`swiglu_fits`] does not
/// hold.
pub(crate) fn swiglu(x: &Tensor, w: &PackedWeight) -> Result<Tensor> {
    let Some(isa) = Isa::chosen().map(Isa::f32_level) else {
        candle_core::bail!("packed gate|up: this CPU has no AVX2 + FMA");
    };
    swiglu_with(x, w, isa, &Blocking::chosen(isa)?)
}

/// [`swiglu`] with the microkernel of `isa` and blocking `bl` (`k ≤ bl.short_k`; an odd
/// panel block `nc` is taken one larger, so no block splits a (gate, up) pair).
pub(crate) fn swiglu_with(x: &Tensor, w: &PackedWeight, isa: Isa, bl: &Blocking) -> Result<Tensor> {
    let bl = &Blocking {
        nc: bl.nc.next_multiple_of(2),
        ..*bl
    };
    let ready = || {
        if w.k > bl.short_k || !w.n.is_multiple_of(2 * NR) {
            candle_core::bail!("packed gate|up: ({}, {}) does not fit {bl:?}", w.n, w.k);
        }
        check(isa, bl)
    };
    super::cpu_host::apply_rows(x, (w.n / 2, w.k), "packed gate|up", ready, |xd, m| {
        #[cfg(target_arch = "x86_64")]
        {
            x86::product_out(xd, m, w, isa, bl, super::cpu_tile_store::Out::SwiGlu)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("kernel_available() is false off x86-64 ({}, {m})", xd.len())
        }
    })
}

/// That the CPU has `isa` and `bl` fits its tile.
fn check(isa: Isa, bl: &Blocking) -> Result<()> {
    isa.require("packed linear")?;
    if bl.mr > Blocking::max_mr(isa) || [bl.mr, bl.kc, bl.mc, bl.nc].contains(&0) {
        candle_core::bail!("packed linear: {bl:?} does not fit a {} tile", isa.name());
    }
    if !bl.mc.is_multiple_of(bl.mr) {
        candle_core::bail!("packed linear: {bl:?}: mc is not a multiple of mr");
    }
    Ok(())
}

/// [`linear`] with the microkernel of `isa` (which the CPU must support: an error otherwise)
/// and blocking `bl` (an error if `isa`'s tile cannot hold it or a count is 0).
pub(crate) fn linear_with(x: &Tensor, w: &PackedWeight, isa: Isa, bl: &Blocking) -> Result<Tensor> {
    let ready = || check(isa, bl);
    super::cpu_host::apply_rows(x, (w.n, w.k), "packed linear", ready, |xd, m| {
        #[cfg(target_arch = "x86_64")]
        {
            x86::product(xd, m, w, isa, bl)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("kernel_available() is false off x86-64 ({}, {m})", xd.len())
        }
    })
}

#[cfg(target_arch = "x86_64")]
pub(in crate::candle) mod x86 {
    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use super::super::cpu_tile_store::Out;
    use super::{Blocking, Isa, PackedWeight, NR};

    /// `x (m, k)` into groups of `mr` rows, k-major: `a[g][kk][r] = x[g·mr + r][kk]`
    /// (missing rows of the last group are 0).
    fn pack_rows(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<f32> {
        let groups = m.div_ceil(mr);
        let mut a = vec![0f32; groups * mr * k];
        a.par_chunks_mut(mr * k).enumerate().for_each(|(g, dst)| {
            for r in 0..mr.min(m - g * mr) {
                let src = &x[(g * mr + r) * k..][..k];
                for (kk, &v) in src.iter().enumerate() {
                    dst[kk * mr + r] = v;
                }
            }
        });
        a
    }

    /// `C (R, 16) (+)= A (R, kc) · B (kc, 16)`: `a` a packed row group at its block (`astride`
    /// floats per `k`: the group's row count), `b` a panel at its block, `c` row-major with row
    /// stride `ldc`; `first` overwrites `C`; with `PF`, each step prefetches the panel `pf`
    /// steps ahead.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro<const R: usize, const PF: bool>(
        kc: usize,
        a: *const f32,
        astride: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        first: bool,
        pf: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        if !first {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm256_loadu_ps(c.add(r * ldc));
                acc[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
            }
        }
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            if PF {
                // as in `micro512`: a hint, also past the panel's end
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(pf * NR) as *const i8);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a.add(r));
                acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
            }
            a = a.add(astride);
            b = b.add(NR);
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(c.add(r * ldc), acc[0]);
            _mm256_storeu_ps(c.add(r * ldc + 8), acc[1]);
        }
    }

    /// `rows` (≤ [`super::MAX_MR_AVX2`]) rows of one tile.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro_rows(
        rows: usize,
        kc: usize,
        a: *const f32,
        astride: usize,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        first: bool,
        pf: usize,
    ) {
        macro_rules! go {
            ($($r:literal)*) => {
                match rows {
                    $($r => match pf {
                        0 => micro::<$r, false>(kc, a, astride, b, c, ldc, first, 0),
                        _ => micro::<$r, true>(kc, a, astride, b, c, ldc, first, pf),
                    },)*
                    _ => unreachable!("a tile of {rows} rows (the blocking was validated)"),
                }
            };
        }
        go!(1 2 3 4 5 6)
    }

    /// `C (R, 16·P) (+)= A (R, kc) · [B₀ … B_P] (kc, 16·P)` in 16-lane registers: `P` panels
    /// `bstride` floats apart, otherwise as [`micro`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn micro512<const R: usize, const P: usize, const PF: bool>(
        kc: usize,
        a: *const f32,
        astride: usize,
        b: *const f32,
        bstride: usize,
        c: *mut f32,
        ldc: usize,
        first: bool,
        pf: usize,
    ) {
        let mut acc = load_acc512::<R, P>(c, ldc, first);
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); P];
            for (j, bv) in bv.iter_mut().enumerate() {
                *bv = _mm512_loadu_ps(b.add(j * bstride));
                if PF {
                    // `pf` steps ahead: past the block's end it prefetches the next block or
                    // beyond the panel (a hint, never a load: no fault), hence `wrapping_add`
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(j * bstride + pf * NR) as *const i8);
                }
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(r));
                for (acc, bv) in acc.iter_mut().zip(&bv) {
                    *acc = _mm512_fmadd_ps(av, *bv, *acc);
                }
            }
            a = a.add(astride);
            b = b.add(NR);
        }
        store_acc512(&acc, c, ldc);
    }

    /// The `R × P` 16-lane accumulators of an AVX-512 tile: zeros when `first`, else `C`'s
    /// values (`R` rows `ldc` apart, `P` panels of 16 columns).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::candle) unsafe fn load_acc512<const R: usize, const P: usize>(
        c: *const f32,
        ldc: usize,
        first: bool,
    ) -> [[__m512; P]; R] {
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        if !first {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_loadu_ps(c.add(r * ldc + j * NR));
                }
            }
        }
        acc
    }

    /// The accumulators of [`load_acc512`] written back to `C`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(in crate::candle) unsafe fn store_acc512<const R: usize, const P: usize>(
        acc: &[[__m512; P]; R],
        c: *mut f32,
        ldc: usize,
    ) {
        for (r, acc) in acc.iter().enumerate() {
            for (j, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(c.add(r * ldc + j * NR), *acc);
            }
        }
    }

    /// `rows` (≤ [`super::MAX_MR_AVX512`]) rows of one tile of `panels` (1 or 2) panels,
    /// AVX-512.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn micro512_rows(
        rows: usize,
        panels: usize,
        kc: usize,
        a: *const f32,
        astride: usize,
        b: *const f32,
        bstride: usize,
        c: *mut f32,
        ldc: usize,
        first: bool,
        pf: usize,
    ) {
        macro_rules! go {
            ($($r:literal)*) => {
                match rows {
                    $($r => match (panels, pf > 0) {
                        (2, false) => micro512::<$r, 2, false>(kc, a, astride, b, bstride, c, ldc, first, 0),
                        (2, true) => micro512::<$r, 2, true>(kc, a, astride, b, bstride, c, ldc, first, pf),
                        (_, false) => micro512::<$r, 1, false>(kc, a, astride, b, bstride, c, ldc, first, 0),
                        (_, true) => micro512::<$r, 1, true>(kc, a, astride, b, bstride, c, ldc, first, pf),
                    },)*
                    _ => unreachable!("a tile of {rows} rows (the blocking was validated)"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
    }

    /// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panels each), with
    /// the microkernels of `isa` (supported by the CPU: the caller checked) and blocking `bl`
    /// (validated for `isa`: [`Blocking::parse`]).
    pub(super) fn product(
        x: &[f32],
        m: usize,
        w: &PackedWeight,
        isa: Isa,
        bl: &Blocking,
    ) -> Vec<f32> {
        product_out(x, m, w, isa, bl, Out::Product)
    }

    /// [`product`], or (`Out::SwiGlu`: a weight of [`PackedWeight::gate_up`], `k ≤
    /// bl.short_k`, the caller checked) its SwiGLU `(m, n / 2)`.
    pub(super) fn product_out(
        x: &[f32],
        m: usize,
        w: &PackedWeight,
        isa: Isa,
        bl: &Blocking,
        out: Out,
    ) -> Vec<f32> {
        let a = pack_rows(x, m, w.k, bl.mr);
        let mr = bl.mr;
        let paired = isa == Isa::Avx512;
        // SAFETY: the CPU has `isa` (the caller checked); `a` holds ⌈m/mr⌉·mr·k and the panels
        // ⌈n/16⌉·k·16 elements, the layout `product_with` reads.
        unsafe {
            product_with(
                &a,
                m,
                w.n,
                w.k,
                &w.panels,
                paired,
                bl,
                out,
                |t: Tile<f32>| match isa {
                    Isa::Avx512 => micro512_rows(
                        t.rows, t.panels, t.kc, t.a, mr, t.b, t.bstride, t.c, t.ldc, t.first, bl.pf,
                    ),
                    Isa::Avx2 | Isa::AvxVnni => {
                        micro_rows(t.rows, t.kc, t.a, mr, t.b, t.c, t.ldc, t.first, bl.pf)
                    }
                },
            )
        }
    }

    /// One microkernel call of [`product_with`]: `C (rows, 16·panels) (+)= A (rows, kc) ·
    /// [B₀ B₁] (kc, 16·panels)`, `a` a packed row group at its `k` block (`mr` units per `k`),
    /// `b` the first panel at its block, the second `bstride` units after it, `c` row-major
    /// with row stride `ldc`; `first` overwrites `C`.
    pub(in crate::candle) struct Tile<T> {
        pub rows: usize,
        pub panels: usize,
        pub kc: usize,
        pub a: *const T,
        pub b: *const T,
        pub bstride: usize,
        pub c: *mut f32,
        pub ldc: usize,
        pub first: bool,
    }

    /// `y (m, n) = A · Wᵀ` for any kernel whose operands have this module's packed layout in
    /// units of `T` (an f32 here; a pair of bf16 in [`super::super::cpu_bf16gemm`]): `a` the
    /// activations in groups of `bl.mr` rows (`[group][k][row]`, the last group zero-padded),
    /// `panels` the weight's `(⌈n/16⌉, k, 16)`, `k` counted in units. The panels are split into
    /// one run per rayon thread (`paired`: runs of whole panel pairs, for two-panel tiles),
    /// each walked in [`Blocking`] `bl`'s blocks, `tile` computing one tile.
    ///
    /// # Safety
    /// `a` and `panels` hold the elements that layout implies, and `tile` is safe to call on
    /// this CPU with such pointers.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::candle) unsafe fn product_with<T: Sync>(
        a: &[T],
        m: usize,
        n: usize,
        k: usize,
        panels: &[T],
        paired: bool,
        bl: &Blocking,
        out: Out,
        tile: impl Fn(Tile<T>) + Sync,
    ) -> Vec<f32> {
        let count = n.div_ceil(NR);
        let cols = out.cols(n);
        let mut y: Vec<f32> = Vec::with_capacity(m * cols);
        let y_addr = y.as_mut_ptr() as usize;
        let pairs = paired || out == Out::SwiGlu;
        super::super::cpu_host::for_panel_runs(count, pairs, |p0, p1| {
            // SAFETY: as the caller promised; `y` has capacity m·n and runs of panels write
            // disjoint columns.
            unsafe {
                run(
                    a,
                    m,
                    n,
                    k,
                    panels,
                    p0,
                    p1,
                    y_addr as *mut f32,
                    paired,
                    bl,
                    out,
                    &tile,
                )
            };
        });
        // SAFETY: every column of every row was written (the panel runs cover 0..n, and the
        // first k block of each tile overwrites its output; with the SwiGLU every pair's 16
        // columns of every row block).
        unsafe { y.set_len(m * cols) };
        y
    }

    /// Panels `p0..p1` of [`product_with`]'s product into `y (m, n)`, or (`Out::SwiGlu`: `p0`,
    /// `p1` even, `k ≤ bl.short_k`, no ragged panel) each block of rows and panels into a
    /// scratch block, then its SwiGLU into `y (m, n / 2)`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run<T>(
        a: &[T],
        m: usize,
        n: usize,
        k: usize,
        panels: &[T],
        p0: usize,
        p1: usize,
        y: *mut f32,
        paired: bool,
        bl: &Blocking,
        out: Out,
        tile: &impl Fn(Tile<T>),
    ) {
        let mr = bl.mr;
        let swiglu = out == Out::SwiGlu;
        // the SwiGLU's block of (mc rows, nc panels), row stride nc · 16
        let mut scratch = match swiglu {
            true => vec![0f32; bl.mc * bl.nc * NR],
            false => Vec::new(),
        };
        let scratch_ptr = scratch.as_mut_ptr();
        // a ragged last panel goes to a scratch strip (m, 16), copied out at the end
        let ragged = !n.is_multiple_of(NR) && p1 == n.div_ceil(NR);
        let mut strip = if ragged {
            vec![0f32; m * NR]
        } else {
            Vec::new()
        };
        let strip_ptr = strip.as_mut_ptr();
        let block = |jc: usize, ic: usize, pc: usize| {
            let je = (jc + bl.nc).min(p1);
            let mc = bl.mc.min(m - ic);
            let kc = bl.kc.min(k - pc);
            let mut p = jc;
            while p < je {
                let b = panels.as_ptr().add((p * k + pc) * NR);
                let in_strip = ragged && p == p1 - 1;
                // row `row0` of the output is at `c0` (the scratch block starts at the row
                // block's first row)
                let (c0, ldc, row0) = match (in_strip, swiglu) {
                    (true, _) => (strip_ptr, NR, 0),
                    (false, true) => (scratch_ptr.add((p - jc) * NR), bl.nc * NR, ic),
                    (false, false) => (y.add(p * NR), n, 0),
                };
                // two-panel tiles pair a panel with the next unless that one is the strip's
                let pair = paired && p + 1 < je && !(ragged && p + 1 == p1 - 1);
                let count = if pair { 2 } else { 1 };
                let mut ir = 0;
                while ir < mc {
                    // `ic` and `ir` are multiples of `mr`, so `row` starts a packed group
                    let rows = mr.min(mc - ir);
                    let row = ic + ir;
                    tile(Tile {
                        rows,
                        panels: count,
                        kc,
                        a: a.as_ptr().add(row * k + pc * mr),
                        b,
                        bstride: k * NR,
                        c: c0.add((row - row0) * ldc),
                        ldc,
                        first: pc == 0,
                    });
                    ir += rows;
                }
                p += count;
            }
        };
        if k <= bl.short_k {
            for jc in (p0..p1).step_by(bl.nc) {
                for ic in (0..m).step_by(bl.mc) {
                    for pc in (0..k).step_by(bl.kc) {
                        block(jc, ic, pc);
                    }
                    if swiglu {
                        // the block is whole: its pairs (gate, up) through SiLU(gate) · up
                        let (je, mc) = ((jc + bl.nc).min(p1), bl.mc.min(m - ic));
                        let (ld, f) = (bl.nc * NR, n / 2);
                        for q in (jc..je).step_by(2) {
                            super::super::cpu_math::silu_mul_rows16(
                                mc,
                                (scratch_ptr.add((q - jc) * NR), ld),
                                (scratch_ptr.add((q + 1 - jc) * NR), ld),
                                (y.add(ic * f + q / 2 * NR), f),
                            );
                        }
                    }
                }
            }
        } else {
            for pc in (0..k).step_by(bl.kc) {
                for jc in (p0..p1).step_by(bl.nc) {
                    for ic in (0..m).step_by(bl.mc) {
                        block(jc, ic, pc);
                    }
                }
            }
        }
        if ragged {
            let (col0, width) = ((p1 - 1) * NR, n % NR);
            for r in 0..m {
                std::ptr::copy_nonoverlapping(
                    strip.as_ptr().add(r * NR),
                    y.add(r * n + col0),
                    width,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candle::cpu_host::checks::{max_rel, sum_tolerance};
    use candle_core::{DType, Device};

    /// The gate|up SwiGLU taken block by block equals the stacked product followed by the
    /// SwiGLU pass, bit for bit, at every f32 level and under blockings with ragged row blocks,
    /// odd panel blocks (taken one larger), several `k` blocks and one; a `k` above `short_k`
    /// and an `F` that is not a multiple of 16 are refused (an error, a `None`).
    #[test]
    fn swiglu_equals_product_then_swiglu() -> Result<()> {
        let dev = Device::Cpu;
        for &isa in Isa::supported().iter().filter(|&&l| l.f32_level() == l) {
            for spec in [
                "",
                "mr=4,kc=7,mc=12,nc=3",
                "mr=1,kc=64,mc=5,nc=1",
                "nc=2,kc=1000",
            ] {
                let bl = Blocking::parse(spec, isa).expect("spec");
                for (m, f, k) in [(1usize, 16usize, 32usize), (37, 48, 96), (100, 80, 200)] {
                    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                    let gate = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (f, k), &dev)?)?;
                    let up = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (f, k), &dev)?)?;
                    let fused = PackedWeight::gate_up(&gate, &up).expect("fits");
                    let stacked = PackedWeight::stack(&[&gate, &up]).expect("stacks");
                    let want = super::super::swiglu::swiglu(&linear_with(&x, &stacked, isa, &bl)?)?;
                    let got = swiglu_with(&x, &fused, isa, &bl)?;
                    assert_eq!(got.dims(), &[m, f]);
                    let got = got.flatten_all()?.to_vec1::<f32>()?;
                    let want = want.flatten_all()?.to_vec1::<f32>()?;
                    assert!(got == want, "{isa:?} {spec} m {m} F {f} k {k}: differs");
                }
            }
            let w = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (16, 64), &dev)?)?;
            let fused = PackedWeight::gate_up(&w, &w).expect("fits");
            let short = Blocking::parse("short_k=32", isa).expect("spec");
            let x = Tensor::randn(0f32, 1.0, (3, 64), &dev)?;
            let e = swiglu_with(&x, &fused, isa, &short).expect_err("k above short_k");
            assert!(e.to_string().contains("does not fit"), "{e}");
            let odd = PackedWeight::pack(&Tensor::randn(0f32, 0.2, (24, 64), &dev)?)?;
            assert!(PackedWeight::gate_up(&odd, &odd).is_none(), "F = 24");
        }
        Ok(())
    }

    /// The packed kernel equals candle's matmul to f32 rounding (a tolerance growing like √k,
    /// from 2e-6 of the largest output), under every instruction level
    /// the CPU has and blockings from the default to degenerate ones (1-row tiles, odd `k`,
    /// row and panel blocks, the `k`-outermost order for every `k`, weight prefetches), on
    /// every tail there is:
    /// rows that are not a multiple of the tile or of the row block, ragged last panels (after
    /// an odd and an even count of whole ones), `k` not a multiple of the `k` block, a `k`
    /// above the default `short_k` (the other loop order), 3-D inputs, a strided input, and a
    /// single row.
    #[test]
    fn packed_linear_equals_candle_matmul() -> Result<()> {
        let levels = Isa::supported();
        if levels.is_empty() {
            eprintln!("no AVX2 + FMA: the packed kernel does not run here");
            return Ok(());
        }
        let dev = Device::Cpu;
        let specs = [
            "",
            "mr=1,kc=7,mc=3,nc=1,short_k=0",
            "mr=5,kc=64,mc=10,nc=3",
            "mr=4,kc=300,mc=200,nc=16,short_k=100000",
            "mr=8,nc=2",
            "mr=12,mc=96",
            "mr=14,kc=100,mc=20,nc=5,short_k=0",
            "pf=0",
            "mr=5,kc=33,nc=3,pf=3",
            "mr=13,kc=33,nc=3,pf=1,short_k=0",
        ];
        // AVX-VNNI's f32 kernel is AVX2's
        for &isa in levels.iter().filter(|&&l| l.f32_level() == l) {
            let d = Blocking::default_for(isa);
            for spec in specs {
                let Ok(bl) = Blocking::parse(spec, isa) else {
                    assert!(isa == Isa::Avx2, "{spec} is valid for {isa:?}");
                    continue;
                };
                for (xdims, n) in [
                    (vec![37usize, 96], 130usize),
                    (vec![2, 19, 64], 48),
                    (vec![1, 1, 896], 7),
                    (vec![150, 300], 33),
                    (vec![7, 40], 50),
                    (vec![13, d.short_k + 40], 40),
                    (vec![d.mc + 5, 257], 16 * d.nc + 16),
                    (vec![9, 64], 16 * d.nc + 48),
                ] {
                    let k = *xdims.last().unwrap();
                    let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
                    let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
                    let p = PackedWeight::pack(&w)?;
                    assert_eq!(p.dims(), (n, k));
                    let got = linear_with(&x, &p, isa, &bl)?;
                    let want = x.broadcast_matmul(&w.t()?)?;
                    assert_eq!(got.dims(), want.dims());
                    let d = max_rel(&got, &want);
                    let tol = sum_tolerance(k);
                    assert!(d <= tol, "{isa:?} {spec} {xdims:?} x ({n}, {k}): {d:e}");
                    assert_eq!(p.unpack()?.to_vec2::<f32>()?, w.to_vec2::<f32>()?);
                }
                let x = Tensor::randn(0f32, 1.0, (24, 10), &dev)?.t()?; // (10, 24), not contiguous
                let w = Tensor::randn(0f32, 1.0, (20, 24), &dev)?;
                let got = linear_with(&x, &PackedWeight::pack(&w)?, isa, &bl)?;
                let d = max_rel(&got, &x.matmul(&w.t()?)?);
                assert!(d <= 2e-6, "{isa:?} {spec} strided input: {d:e}");
            }
        }
        Ok(())
    }

    /// A blocking spec is parsed over the default; a wrong one is an error naming what is
    /// wrong, and a blocking the tile cannot hold is refused by the product, never run.
    #[test]
    fn blocking_specs_are_parsed_or_refused_by_name() -> Result<()> {
        let isa = Isa::Avx512;
        let d = Blocking::default_for(isa);
        assert_eq!(Blocking::parse("", isa), Ok(d));
        let b = Blocking::parse(" mr=12 , kc=128,short_k=0,pf=8", isa).expect("valid");
        assert_eq!(
            (b.mr, b.kc, b.mc, b.nc, b.short_k, b.pf),
            (12, 128, 84, d.nc, 0, 8)
        );
        assert_eq!(Blocking::parse("mr=5,mc=12", isa).map(|b| b.mc), Ok(15));
        // the default row block is rounded up to a multiple of a smaller tile's rows
        assert_eq!(Blocking::parse("mr=5", isa).map(|b| b.mc), Ok(85));
        for (spec, says) in [
            ("mr", "not key=value"),
            ("kc=big", "`big` is not a count"),
            ("mc=0", "at least 1"),
            ("tile=4", "unknown key `tile`"),
            ("mr=15", "more rows than a avx512 tile holds (14)"),
        ] {
            let e = Blocking::parse(spec, isa).expect_err(spec);
            assert!(e.contains(says), "{spec}: {e}");
        }
        let e = Blocking::parse("mr=7", Isa::Avx2).expect_err("avx2 holds 6");
        assert!(e.contains("(6)"), "{e}");
        if Isa::supported().contains(&Isa::Avx2) {
            let dev = Device::Cpu;
            let p = PackedWeight::pack(&Tensor::zeros((4, 8), DType::F32, &dev)?)?;
            let x = Tensor::zeros((3, 8), DType::F32, &dev)?;
            let bad = Blocking {
                mr: 7,
                ..Blocking::default_for(Isa::Avx2)
            };
            let e = linear_with(&x, &p, Isa::Avx2, &bad).expect_err("7 rows");
            assert!(e.to_string().contains("does not fit"), "{e}");
            let bad = Blocking {
                mr: 4,
                mc: 6,
                ..bad
            };
            let e = linear_with(&x, &p, Isa::Avx2, &bad).expect_err("mc 6");
            assert!(e.to_string().contains("not a multiple"), "{e}");
        }
        Ok(())
    }

    /// Stacking packed weights equals packing the stacked rows, aligned (panels concatenated)
    /// or not (rows repacked); differing `in` is refused.
    #[test]
    fn stacking_packed_weights_equals_packing_the_stack() -> Result<()> {
        let dev = Device::Cpu;
        for rows in [[32usize, 16, 7], [5, 16, 9]] {
            let ws: Vec<Tensor> = rows
                .iter()
                .map(|&r| Tensor::randn(0f32, 1.0, (r, 24), &dev))
                .collect::<Result<_>>()?;
            let packed: Vec<PackedWeight> =
                ws.iter().map(PackedWeight::pack).collect::<Result<_>>()?;
            let refs: Vec<&PackedWeight> = packed.iter().collect();
            let stacked = PackedWeight::stack(&refs).expect("one in");
            let want = Tensor::cat(&ws, 0)?;
            assert_eq!(stacked.dims(), want.dims2()?);
            assert_eq!(stacked.unpack()?.to_vec2::<f32>()?, want.to_vec2::<f32>()?);
            assert_eq!(stacked.panels, PackedWeight::pack(&want)?.panels);
        }
        let a = PackedWeight::pack(&Tensor::zeros((4, 8), DType::F32, &dev)?)?;
        let b = PackedWeight::pack(&Tensor::zeros((4, 9), DType::F32, &dev)?)?;
        assert!(PackedWeight::stack(&[&a, &b]).is_none());
        assert!(PackedWeight::stack(&[]).is_none());
        Ok(())
    }

    /// Packing Q8_0 / Q4_0 blocks directly equals packing candle's dequantization bit for bit;
    /// other types and mis-sized bytes are refused.
    #[test]
    fn packing_blocks_equals_packing_the_dequantized_weight() -> Result<()> {
        use candle_core::quantized::QTensor;
        let dev = Device::Cpu;
        for (n, k) in [(37usize, 64usize), (16, 896), (5, 32)] {
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            for ggml in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
                let q = QTensor::quantize(&w, ggml)?;
                let direct = PackedWeight::from_blocks(ggml, &q.data()?, n, k).expect("packs");
                let via = PackedWeight::pack(&q.dequantize(&dev)?)?;
                assert_eq!(direct.panels, via.panels, "{ggml:?} ({n}, {k})");
            }
        }
        let q = QTensor::quantize(&Tensor::zeros((4, 256), DType::F32, &dev)?, GgmlDType::Q4K)?;
        assert!(PackedWeight::from_blocks(GgmlDType::Q4K, &q.data()?, 4, 256).is_none());
        assert!(PackedWeight::from_blocks(GgmlDType::Q8_0, &[0u8; 33], 1, 32).is_none());
        Ok(())
    }

    /// A mis-sized or non-f32 input is an error naming the shapes, never a panic.
    #[test]
    fn a_mis_sized_input_is_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let p = PackedWeight::pack(&Tensor::zeros((4, 8), DType::F32, &dev)?)?;
        let e = linear(&Tensor::zeros((3, 7), DType::F32, &dev)?, &p).expect_err("k 7 vs 8");
        assert!(e.to_string().contains("does not fit"), "{e}");
        let e = linear(&Tensor::zeros((3, 8), DType::F64, &dev)?, &p).expect_err("f64");
        assert!(e.to_string().contains("does not fit"), "{e}");
        assert_eq!(
            linear(&Tensor::zeros((0, 8), DType::F32, &dev)?, &p)?.dims(),
            &[0, 4]
        );
        Ok(())
    }
}
