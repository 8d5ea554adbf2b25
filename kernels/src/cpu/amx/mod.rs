//! f32 linear layers through Intel AMX bf16 tiles, at f32 accuracy: `y = x Wᵀ` with every f32
//! operand split exactly into three bf16 parts and the six products that matter at f32
//! precision summed by `tdpbf16ps` in f32 ("bf16 × 6").
//!
//! The same tiles with one part ([`Parts::One`]) run `--quantize bf16`: the weight rounded to
//! bf16 once at load, the activations rounded per call, one `tdpbf16ps` per tile pair (the
//! arithmetic of [`super::bf16gemm`], whose AVX-512 BF16 kernel runs where AMX does not).
//! That form is the default for bf16 weights wherever AMX runs: one product instead of six,
//! and 2 bytes of weight per value instead of 6.
//!
//! `Q8_0` weights (`--quantize q8_0`) can run on the int8 tiles where the CPU has AMX-INT8
//! ([`q8_available`], [`q8_product`]; opt-in, the backends' `FORKSCORE_CPU_Q8=amx`): each 32-value block of 16
//! activation rows is one A tile, each panel block of the AVX-512 layout of
//! [`super::qgemm`] one B tile as packed, `tdpbssd` gives the block's exact i32 sums for a
//! 32 × 32 output block, and AVX-512 then adds them scaled, block after block, exactly as the
//! VNNI kernel and `product_reference` do: equal to them bit for bit (tested on an AMX CPU).
//! Opt-in because it measured slower end to end than the VNNI kernel (15–20 % more time per
//! decision at 8 and 28 fields): every 32-value block's four C
//! tiles go through memory and an AVX-512 pass of 64 scaled additions, which costs more than
//! the tile products save.
//!
//! Why: on a Xeon with AMX (Sapphire Rapids and later) one core runs bf16 tile products at
//! ~13× its AVX-512 f32 FMA rate (`scripts/cpu-real/peak.c`: 2,218 against 167 GFLOP/s per
//! core), so six bf16 products could cost less than half of one f32
//! product.
//!
//! **Opt-in, and not faster yet** (`FORKSCORE_CPU_GEMM=amx`). Measured on 2-core slices of
//! AMX Xeons: with the tiles' operands in L1 (the `hot=1` probe of the `cpu_linear` bench) the
//! tile loop reaches ~80 % of the AMX peak, but the split weight is 6 bytes per value against
//! f32's 4 and the operands come from L2 and memory: one layer's products at 512 rows ran
//! 0.8–1.0× the time of the AVX-512 f32 kernel depending on the machine and blocking, and a
//! whole decision ran 1.1–1.4× slower (e.g. 3,055 against 2,735 ms at 8 fields). The f32
//! layers therefore stay on [`super::gemm`] by default; the blockings tried are
//! [`AmxBlocking`]'s keys (`FORKSCORE_CPU_AMX`).
//!
//! The split: `v = hi + mid + lo`, each bf16 (`hi` = `v` rounded to 8 significant bits, `mid`
//! the remainder rounded likewise, `lo` the rest). Each remainder is exact in f32 and has at
//! most 16, then 8 significant bits, so the three parts sum back to `v` exactly (for `|v|`
//! from 2⁻¹¹⁰ ≈ 7.7e-34 up; below that the remainders are bf16 subnormals, which AMX reads as
//! 0: an absolute error under 1e-37 per operand). A product `x·w` is then
//! `Σ xᵢ·wⱼ` over the nine pairs; the six kept (`hh, hm, mh, hl, lh, mm`) leave out terms of at
//! most 2⁻²⁴·|x·w| together, the size of f32's own rounding of one product. Each bf16 × bf16
//! product is exact in f32, and the tiles accumulate in f32.
//!
//! Layout: the weight, per panel of [`NR`] columns, as `k/2` rows of 16 columns × 2
//! consecutive `k` (the B-tile layout of `tdpbf16ps`: a 32-`k` step of a panel is one 1 KiB
//! tile), one plane per part. The activations are split per call into three row-major planes
//! (`m` padded to 32 rows, `k` to 32 with zeros), read as A tiles in place. Each output block
//! of 32 rows × 32 columns is four f32 C tiles that stay in tile registers for the whole `k`:
//! per 32-`k` step, 6 A-tile and 12 B-tile loads, 24 tile products.
//!
//! Where it runs: x86-64 Linux, a CPU with AMX-TILE and AMX-BF16, and the kernel granting the
//! process the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), detected once ([`available`]).
//! It runs only when `FORKSCORE_CPU_GEMM=amx` asks for it.
//! The tests hold this kernel to an f64 reference of the kept part products (here, where AMX
//! runs), to candle's matmul (the backends' shell, where AMX runs) and the split arithmetic to
//! an exact product (everywhere).

use super::aligned::Aligned;
use super::panel::NR;
use super::Result;

/// `k` per tile step: 32 bf16, one 64-byte tile row.
const KSTEP: usize = 32;
/// `v` as bf16 bits, rounded to nearest even; a finite `v` that would round to infinity is
/// truncated instead (so `v − hi` stays finite), and NaN stays NaN.
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    match f32::from_bits((rounded as u32) << 16).is_infinite() && v.is_finite() {
        true => (b >> 16) as u16,
        false => rounded,
    }
}

pub(crate) fn bf16_value(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// [`bf16_bits`] without the guards, for the activations on every call (a branch-free form
/// the compiler vectorizes): the same bits for every finite `|v|` up to the largest bf16
/// (tested); a non-finite or larger `v` gives a non-finite part, so the product is non-finite
/// too (which the model reports), never a finite wrong value.
#[cfg(any(target_arch = "x86_64", test))]
#[inline(always)]
pub(crate) fn bf16_bits_fast(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// How the AMX kernel blocks one product: a spec over the default ([`AmxBlocking::parse`]; the
/// backends read `FORKSCORE_CPU_AMX`, `mc=…,pf=…`), to compare on one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmxBlocking {
    /// Rows per block (a multiple of 32): their packed tiles stay in L2 while the thread's
    /// panel pairs pass over them.
    pub mc: usize,
    /// Steps of 32 `k` ahead that the next tiles are prefetched into L1 (0: none).
    pub pf: usize,
    /// Steps of 32 `k` per pass over a row block (0: all, the C tiles stay in registers for
    /// the whole `k`); fewer keep a panel pair's B slice in L1 across the block's row pairs,
    /// the C tiles stored and reloaded between passes.
    pub kb: usize,
    /// Steps of 32 `k` per L2 block (0: all): the row block's A tiles for that `k` range stay
    /// in L2 while the thread's panel pairs pass; C is stored and reloaded between blocks.
    pub kc: usize,
    /// Panel pairs per weight block (0: the row-block order): with `nb`, a block of `nb`
    /// pairs × `kc` steps of the weight stays in L2 while every row pair passes, so the weight
    /// is read from memory once per call and the activations stream from L3 (`mc` and `kb`
    /// unused).
    pub nb: usize,
    /// Timing probe only (the bench's `hot=1`; refused in `FORKSCORE_CPU_AMX`): every step
    /// reads the first step's tiles, so the loads hit L1 and the result is wrong. It measures
    /// the tile loop's ceiling apart from memory.
    pub hot: bool,
}

impl AmxBlocking {
    pub const DEFAULT: AmxBlocking = AmxBlocking {
        mc: 128,
        pf: 0,
        kb: 0,
        kc: 0,
        nb: 0,
        hot: false,
    };

    /// `spec` (`key=value`, comma-separated, keys `mc`, `pf`, `kb`, `kc`, `nb`, `hot`) over
    /// [`AmxBlocking::DEFAULT`];
    /// errors name the wrong key or value (`mc` must be a positive multiple of 32).
    pub fn parse(spec: &str) -> std::result::Result<Self, String> {
        let mut b = Self::DEFAULT;
        for (part, key, v) in super::host::spec_counts(spec)? {
            match key {
                "mc" if v > 0 && v.is_multiple_of(32) => b.mc = v,
                "mc" => return Err(format!("`{part}`: mc must be a positive multiple of 32")),
                "pf" => b.pf = v,
                "kb" => b.kb = v,
                "kc" => b.kc = v,
                "nb" => b.nb = v,
                "hot" => b.hot = v != 0,
                other => return Err(format!("unknown key `{other}` (mc, pf, kb, kc, nb)")),
            }
        }
        Ok(b)
    }
}

/// How many bf16 parts each operand is split into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parts {
    /// `hi` alone (the value rounded to bf16): one product per tile pair (`--quantize bf16`).
    One,
    /// `hi`, `mid`, `lo` (exact): the six products of f32 accuracy.
    Three,
}

impl Parts {
    fn count(self) -> usize {
        match self {
            Parts::One => 1,
            Parts::Three => 3,
        }
    }
}

/// `v = hi + (mid + lo)`, the three as bf16 bits: exact for 0 and every finite `|v| ≥ 2⁻¹¹⁰`
/// (below it the remainders fall under bf16's normal range, which AMX flushes to 0 anyway).
pub(crate) fn split(v: f32) -> [u16; 3] {
    let hi = bf16_bits(v);
    if !v.is_finite() {
        return [hi, 0, 0];
    }
    let r1 = v - bf16_value(hi);
    let mid = bf16_bits(r1);
    let r2 = r1 - bf16_value(mid);
    [hi, mid, bf16_bits(r2)]
}

/// A weight `W (n, k)` split into bf16 planes for the AMX kernel: `planes[part]` is
/// `(⌈n/16⌉, kp/2, 16, 2)` with `kp` = `k` rounded up to 32 (zero-padded, as are the missing
/// columns of a ragged last panel); one plane per part of [`Parts`].
#[derive(Debug, Clone)]
pub struct AmxWeight {
    n: usize,
    k: usize,
    kp: usize,
    parts: Parts,
    planes: Vec<Aligned<u16>>,
}

impl AmxWeight {
    /// Split row-major `w (n, k)` in three, on the rayon threads (a panel each).
    pub fn from_rows(w: &[f32], n: usize, k: usize) -> Self {
        Self::split_rows(w, n, k, Parts::Three)
    }

    /// Row-major `w (n, k)` into `parts` planes, on the rayon threads (a panel each): the first
    /// `parts` of [`split`] (one: the value rounded to nearest even bf16).
    pub fn split_rows(w: &[f32], n: usize, k: usize, parts: Parts) -> Self {
        use rayon::prelude::*;
        let kp = k.next_multiple_of(KSTEP);
        let panel = (kp * NR).max(1);
        // one plane per part, each filled a panel per task (part i of `split`)
        let planes = (0..parts.count())
            .map(|i| {
                let mut plane = Aligned::<u16>::zeroed(n.div_ceil(NR) * kp * NR);
                plane
                    .par_chunks_mut(panel)
                    .enumerate()
                    .for_each(|(p, dst)| {
                        for c in 0..NR.min(n - p * NR) {
                            let row = &w[(p * NR + c) * k..][..k];
                            for (kk, &v) in row.iter().enumerate() {
                                dst[((kk / 2) * NR + c) * 2 + kk % 2] = split(v)[i];
                            }
                        }
                    });
                plane
            })
            .collect();
        AmxWeight {
            n,
            k,
            kp,
            parts,
            planes,
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// How many parts the weight is split into.
    pub fn parts(&self) -> Parts {
        self.parts
    }

    /// The rows of `W`, `(n, k)` row-major: the parts summed (the values exactly for three,
    /// see [`split`]; the bf16 values for one).
    pub fn rows(&self) -> Vec<f32> {
        let (n, k, kp) = (self.n, self.k, self.kp);
        let mut w = vec![0f32; n * k];
        for (r, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            let base = (r / NR) * kp * NR;
            for (kk, v) in row.iter_mut().enumerate() {
                let at = base + ((kk / 2) * NR + r % NR) * 2 + kk % 2;
                *v = match &self.planes[..] {
                    [h, m, l] => bf16_value(h[at]) + (bf16_value(m[at]) + bf16_value(l[at])),
                    planes => bf16_value(planes[0][at]),
                };
            }
        }
        w
    }

    /// `gate` and `up` (one part each, `(F, k)`, `F` a multiple of 16) as one `(2F, k)` weight
    /// whose panels alternate (gate's `p`, then up's) for [`bf16_swiglu_product`]; `None`
    /// where they differ in shape or parts, are not one part, or `F` is not whole panels.
    pub fn gate_up(gate: &AmxWeight, up: &AmxWeight) -> Option<Self> {
        let one = gate.parts == Parts::One && up.parts == Parts::One;
        if !one || gate.n != up.n || gate.k != up.k || gate.n % NR != 0 {
            return None;
        }
        let plane = super::tile_store::alternate(&gate.planes[0], &up.planes[0], gate.kp * NR);
        Some(AmxWeight {
            n: 2 * gate.n,
            k: gate.k,
            kp: gate.kp,
            parts: Parts::One,
            planes: vec![plane],
        })
    }

    /// The weights stacked along `out` (`[a; b; …]`), all with one `in` and one [`Parts`];
    /// `None` for an empty list or differing `in` or parts. Planes are concatenated as they
    /// are when every part but the last has a multiple of 16 rows; otherwise the rows are split
    /// again (exactly: the parts sum back to what was split).
    pub fn stack(parts: &[&AmxWeight]) -> Option<Self> {
        let first = parts.first()?;
        let (k, split) = (first.k, first.parts);
        if parts.iter().any(|p| p.k != k || p.parts != split) {
            return None;
        }
        let n = parts.iter().map(|p| p.n).sum();
        if parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0) {
            let plane = |i: usize| {
                Aligned::concat(&parts.iter().map(|p| &*p.planes[i]).collect::<Vec<_>>())
            };
            return Some(AmxWeight {
                n,
                k,
                kp: first.kp,
                parts: split,
                planes: (0..split.count()).map(plane).collect(),
            });
        }
        let rows: Vec<f32> = parts.iter().flat_map(|p| p.rows()).collect();
        Some(Self::split_rows(&rows, n, k, split))
    }
}

pub use super::isa::amx_available as available;

/// AMX runs and the CPU has AMX-INT8 (whatever `FORKSCORE_CPU_Q8` says: the tests' question).
pub fn q8_available() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let int8 = std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 25) != 0;
        available() && int8
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// `x (m, k) · Wᵀ -> (m, n)` for a `Q8_0` weight of the AVX-512 layout through the AMX int8
/// tiles: the same sums as [`super::qgemm::portable::product`], bit for bit. A CPU without
/// AMX-INT8 ([`q8_available`]; whether to use it is the caller's choice, the backends'
/// `FORKSCORE_CPU_Q8=amx`), a weight of the AVX2 layout or an `x` that is not `m` rows of `k` is
/// refused.
pub fn q8_product(x: &[f32], m: usize, w: &super::qgemm::PackedQ8) -> Result<Vec<f32>> {
    if x.len() != m * w.dims().1 {
        super::bail!(
            "q8_0 on AMX: {} values are not {m} rows of {}",
            x.len(),
            w.dims().1
        );
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        match w.tile_parts() {
            Some((q, d)) if q8_available() => Ok(tiles::product_q8(x, m, w.dims(), q, d)),
            _ => super::bail!("q8_0 on AMX: no AMX-INT8 here, or not the AVX-512 layout"),
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        super::bail!(
            "q8_0 on AMX: no AMX here ({}, {m}, {:?})",
            x.len(),
            w.dims()
        )
    }
}

/// That the AMX kernel runs here ([`available`]).
pub fn check() -> Result<()> {
    match available() {
        true => Ok(()),
        false => super::bail!("amx linear: this CPU or OS does not run AMX bf16 tiles"),
    }
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major through the AMX tiles with blocking `bl`. An error
/// (never a panic) where the kernel does not run ([`check`]) or `x` is not `m` rows of `k`.
pub fn product(x: &[f32], m: usize, w: &AmxWeight, bl: &AmxBlocking) -> Result<Vec<f32>> {
    check()?;
    if x.len() != m * w.k {
        super::bail!("amx linear: {} values are not {m} rows of {}", x.len(), w.k);
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        Ok(tiles::product(x, m, w, bl))
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        unreachable!("available() is false here ({}, {m}, {bl:?})", x.len())
    }
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major for a one-part (bf16) weight, written in place with
/// the weight in L2-sized blocks (`inplace`): the default of `--quantize bf16` layers where AMX
/// runs, equal bit for bit to [`product`] under any blocking. An error (never a panic) where
/// AMX does not run, the weight is not one part or `x` is not `m` rows of `k`.
pub fn bf16_product(x: &[f32], m: usize, w: &AmxWeight) -> Result<Vec<f32>> {
    one_part_product(x, m, w, false)
}

/// `SiLU(x · Gᵀ) · (x · Uᵀ) -> (m, F)` for a gate | up weight of [`AmxWeight::gate_up`]: the
/// SwiGLU taken from the output tiles, equal bit for bit to [`bf16_product`] over the stacked
/// `[gate; up]` weight followed by [`super::math::silu_mul`] on each row's halves. Errors as
/// [`bf16_product`], and for a weight whose `out` is not whole panel pairs.
pub fn bf16_swiglu_product(x: &[f32], m: usize, w: &AmxWeight) -> Result<Vec<f32>> {
    if w.n % (2 * NR) != 0 {
        super::bail!(
            "amx bf16 swiglu: {} outputs are not whole gate | up panel pairs",
            w.n
        );
    }
    one_part_product(x, m, w, true)
}

fn one_part_product(x: &[f32], m: usize, w: &AmxWeight, swiglu: bool) -> Result<Vec<f32>> {
    check()?;
    if w.parts != Parts::One {
        super::bail!("amx bf16: the weight is split in three parts, not rounded to bf16");
    }
    if x.len() != m * w.k {
        super::bail!("amx bf16: {} values are not {m} rows of {}", x.len(), w.k);
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let out = match swiglu {
            true => inplace::Epilogue::SwiGlu,
            false => inplace::Epilogue::Product,
        };
        Ok(inplace::product(x, m, w, out))
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        unreachable!("available() is false here ({}, {m}, {swiglu})", x.len())
    }
}

/// `x (m, k) · Wᵀ -> (m, n)` for a per-channel int8 weight on the AMX-INT8 tiles, the
/// activations rounded per row (`int8`): equal bit for bit to
/// [`int8::product_reference`]. An error (never a panic) where AMX-INT8 does not run
/// ([`q8_available`]) or `x` is not `m` rows of `k`.
pub fn int8_product(x: &[f32], m: usize, w: &AmxI8Weight) -> Result<Vec<f32>> {
    int8_run(x, m, w, false)
}

/// `SiLU(x · Gᵀ) · (x · Uᵀ) -> (m, F)` for a gate | up weight of [`AmxI8Weight::gate_up`],
/// the SwiGLU taken from the scaled output tiles: equal bit for bit to [`int8_product`] over
/// the stacked weight followed by [`super::math::silu_mul`] on each row's halves. Errors as
/// [`int8_product`], and for a weight whose `out` is not whole panel pairs.
pub fn int8_swiglu_product(x: &[f32], m: usize, w: &AmxI8Weight) -> Result<Vec<f32>> {
    if w.n % (2 * NR) != 0 {
        super::bail!(
            "amx int8 swiglu: {} outputs are not whole gate | up panel pairs",
            w.n
        );
    }
    int8_run(x, m, w, true)
}

fn int8_run(x: &[f32], m: usize, w: &AmxI8Weight, swiglu: bool) -> Result<Vec<f32>> {
    if !q8_available() {
        super::bail!("amx int8: this CPU or OS does not run the AMX-INT8 tiles");
    }
    if x.len() != m * w.k {
        super::bail!("amx int8: {} values are not {m} rows of {}", x.len(), w.k);
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let (a, row_scales) = int8::pack_rows(x, m, w.k, w.kp);
        let operands = inplace::Operands {
            a: a.as_ptr() as *const u8,
            plane: w.plane.as_ptr() as *const u8,
            steps: w.kp / int8::KSTEP8,
            n: w.n,
        };
        let out = match swiglu {
            true => inplace::Epilogue::SwiGlu,
            false => inplace::Epilogue::Product,
        };
        let kind = inplace::Kind::Int8 {
            rows: &row_scales,
            cols: &w.scales,
        };
        Ok(inplace::run_product(&operands, m, out, kind))
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        unreachable!("q8_available() is false here ({}, {m}, {swiglu})", x.len())
    }
}

pub mod int8;
pub use int8::AmxI8Weight;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod inplace;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles;

/// The tile configuration every AMX kernel here loads (palette 1, tiles 0–7 each 16 rows × 64
/// bytes), for the attention tiles ([`super::attention`]).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn tile_config() -> impl std::ops::Deref<Target = [u8; 64]> {
    struct Cfg(tiles::Config);
    impl std::ops::Deref for Cfg {
        type Target = [u8; 64];
        fn deref(&self) -> &[u8; 64] {
            &self.0 .0
        }
    }
    Cfg(tiles::config())
}

#[cfg(test)]
mod tests;
