//! f32 linear layers through Intel AMX bf16 tiles, at f32 accuracy: `y = x Wᵀ` with every f32
//! operand split exactly into three bf16 parts and the six products that matter at f32
//! precision summed by `tdpbf16ps` in f32 ("bf16 × 6").
//!
//! The same tiles with one part ([`Parts::One`]) run `--quantize bf16`: the weight rounded to
//! bf16 once at load, the activations rounded per call, one `tdpbf16ps` per tile pair (the
//! arithmetic of [`super::cpu_bf16gemm`], whose AVX-512 BF16 kernel runs where AMX does not).
//! That form is the default for bf16 weights wherever AMX runs: one product instead of six,
//! and 2 bytes of weight per value instead of 6.
//!
//! `Q8_0` weights (`--quantize q8_0`) can run on the int8 tiles where the CPU has AMX-INT8
//! ([`q8_runs`], [`q8_product`]; opt-in, `FORKSCORE_CPU_Q8=amx`): each 32-value block of 16
//! activation rows is one A tile, each panel block of the AVX-512 layout of
//! [`super::cpu_qgemm`] one B tile as packed, `tdpbssd` gives the block's exact i32 sums for a
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
//! layers therefore stay on [`super::cpu_gemm`] by default; the blockings tried are
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
//! The tests hold this kernel to candle's matmul (where AMX runs) and the split arithmetic to
//! an f64 reference (everywhere).

use candle_core::{Result, Tensor};

use super::cpu_aligned::Aligned;
use super::cpu_panel::NR;

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
#[cfg_attr(
    not(all(target_arch = "x86_64", target_os = "linux")),
    allow(dead_code)
)]
#[inline(always)]
pub(crate) fn bf16_bits_fast(v: f32) -> u16 {
    let b = v.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// How the AMX kernel blocks one product: `FORKSCORE_CPU_AMX` (`mc=…,pf=…`) over the
/// default, to compare on one machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AmxBlocking {
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
        for (part, key, v) in super::cpu_host::spec_counts(spec)? {
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

    /// The blocking of this process: the default, or `FORKSCORE_CPU_AMX` over it (read once;
    /// an invalid value is an error naming it).
    pub fn chosen() -> Result<Self> {
        use std::sync::OnceLock;
        static SPEC: OnceLock<Option<&str>> = OnceLock::new();
        match SPEC.get_or_init(|| crate::switches::value("FORKSCORE_CPU_AMX")) {
            None => Ok(Self::DEFAULT),
            Some(s) => match Self::parse(s) {
                Ok(b) if b.hot => candle_core::bail!(
                    "FORKSCORE_CPU_AMX={s:?}: hot is a timing probe with wrong results"
                ),
                Ok(b) => Ok(b),
                Err(e) => candle_core::bail!("FORKSCORE_CPU_AMX={s:?}: {e}"),
            },
        }
    }
}

/// How many bf16 parts each operand is split into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parts {
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
pub(crate) struct AmxWeight {
    n: usize,
    k: usize,
    kp: usize,
    parts: Parts,
    planes: Vec<Aligned<u16>>,
}

impl AmxWeight {
    /// Split `w (n, k)` (any float dtype, any device: read as f32 on the host) in three.
    pub fn pack(w: &Tensor) -> Result<Self> {
        super::cpu_host::with_host_rows(w, Self::from_rows)
    }

    /// `w (n, k)` (any float dtype, any device) rounded to bf16: one plane (`--quantize bf16`).
    pub fn pack_bf16(w: &Tensor) -> Result<Self> {
        super::cpu_host::with_host_rows(w, |w, n, k| Self::split_rows(w, n, k, Parts::One))
    }

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
    #[cfg_attr(not(test), allow(dead_code))]
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

/// The f32 product the kernel computes, in plain Rust, summed in f64: per output the six kept
/// part products (three parts; the tests hold the split arithmetic to an exact product with
/// it, and the kernel to candle's matmul), or `Σ bf16(x) · bf16(w)` (one part; the kernel is
/// held to it).
#[cfg(test)]
fn product_reference(x: &[f32], m: usize, w: &AmxWeight) -> Vec<f64> {
    let (n, k) = (w.n, w.k);
    let wr: Vec<[u16; 3]> = w.rows().iter().map(|&v| split(v)).collect();
    let mut y = vec![0f64; m * n];
    for r in 0..m {
        let xs: Vec<[u16; 3]> = x[r * k..][..k].iter().map(|&v| split(v)).collect();
        for c in 0..n {
            let mut s = 0f64;
            for kk in 0..k {
                let (a, b) = (xs[kk], wr[c * k + kk]);
                let v = |i: usize, j: usize| bf16_value(a[i]) as f64 * bf16_value(b[j]) as f64;
                s += match w.parts {
                    Parts::Three => v(0, 0) + v(0, 1) + v(1, 0) + v(0, 2) + v(2, 0) + v(1, 1),
                    Parts::One => v(0, 0),
                };
            }
            y[r * n + c] = s;
        }
    }
    y
}

pub(crate) use super::cpu_isa::amx_available as available;

/// A `Q8_0` linear layer `x (.., k) · Wᵀ -> (.., n)`: with `FORKSCORE_CPU_Q8=amx` on a CPU with
/// AMX-INT8 ([`q8_runs`]) a weight of the AVX-512 layout runs on the int8 tiles (the same sums
/// as the VNNI kernel, bit for bit), every other weight on [`super::cpu_qgemm::linear`].
pub(crate) fn q8_linear(x: &Tensor, w: &super::cpu_qgemm::PackedQ8) -> Result<Tensor> {
    if w.isa() == super::cpu_isa::Isa::Avx512 && q8_runs()? {
        let ready = || w.isa().require("q8_0 linear");
        return super::cpu_host::try_apply_rows(x, w.dims(), "q8_0 linear", ready, |xd, m| {
            q8_product(xd, m, w)
        });
    }
    super::cpu_qgemm::linear(x, w)
}

/// Whether `Q8_0` weights run on the AMX int8 tiles in this process: only when
/// `FORKSCORE_CPU_Q8=amx` asks for them and AMX-INT8 runs here (unset or `vnni`: the VNNI
/// kernel). Read once; another value is an error naming it.
pub(crate) fn q8_runs() -> Result<bool> {
    use std::sync::OnceLock;
    static ON: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    ON.get_or_init(|| {
        let asked = crate::switches::value("FORKSCORE_CPU_Q8").unwrap_or_default();
        match asked.trim().to_ascii_lowercase().as_str() {
            "amx" => Ok(q8_available()),
            "" | "vnni" => Ok(false),
            other => Err(format!(
                "FORKSCORE_CPU_Q8={asked:?}: `{other}`: expected amx or vnni"
            )),
        }
    })
    .clone()
    .map_err(candle_core::Error::Msg)
}

/// AMX runs and the CPU has AMX-INT8 (whatever `FORKSCORE_CPU_Q8` says: the tests' question).
fn q8_available() -> bool {
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
/// tiles: the same sums as [`super::cpu_qgemm::product_reference`], bit for bit. The caller
/// checked [`q8_runs`]; a weight of the AVX2 layout is refused.
pub(crate) fn q8_product(x: &[f32], m: usize, w: &super::cpu_qgemm::PackedQ8) -> Result<Vec<f32>> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        match w.tile_parts() {
            Some((q, d)) if q8_available() => Ok(tiles::product_q8(x, m, w.dims(), q, d)),
            _ => candle_core::bail!("q8_0 on AMX: no AMX-INT8 here, or not the AVX-512 layout"),
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        candle_core::bail!(
            "q8_0 on AMX: no AMX here ({}, {m}, {:?})",
            x.len(),
            w.dims()
        )
    }
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 through AMX. Errors (never panics) on a non-f32, non-CPU or
/// mis-sized `x`, or where the kernel does not run ([`available`]).
pub(crate) fn linear(x: &Tensor, w: &AmxWeight) -> Result<Tensor> {
    linear_with(x, w, &AmxBlocking::chosen()?)
}

/// [`linear`] with blocking `bl`.
pub(crate) fn linear_with(x: &Tensor, w: &AmxWeight, bl: &AmxBlocking) -> Result<Tensor> {
    let ready = || match available() {
        true => Ok(()),
        false => candle_core::bail!("amx linear: this CPU or OS does not run AMX bf16 tiles"),
    };
    super::cpu_host::apply_rows(x, (w.n, w.k), "amx linear", ready, |xd, m| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            tiles::product(xd, m, w, bl)
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            unreachable!("available() is false here ({}, {m}, {bl:?})", xd.len())
        }
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles {
    use std::arch::asm;

    use rayon::prelude::*;

    use super::{bf16_bits_fast, Aligned, AmxBlocking, AmxWeight, Parts, KSTEP, NR};

    /// bf16 values per tile (16 rows × 32).
    const TILE: usize = 16 * KSTEP;

    /// The tile configuration: palette 1, tiles 0–7 all 16 rows × 64 bytes (C: 16 × 16 f32;
    /// A: 16 rows × 32 bf16; B: 16 `k` pairs × 16 columns × 2 bf16).
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    fn config() -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            c[48 + t] = 16;
        }
        Config(c)
    }

    macro_rules! load {
        ($t:literal, $p:expr) => {
            asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
                p = in(reg) $p, s = in(reg) 64usize, options(nostack, readonly))
        };
    }
    macro_rules! load_c {
        ($t:literal, $p:expr, $stride:expr) => {
            asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
                p = in(reg) $p, s = in(reg) $stride, options(nostack, readonly))
        };
    }
    macro_rules! store {
        ($t:literal, $p:expr, $stride:expr) => {
            asm!(concat!("tilestored [{p} + {s}*1], tmm", $t),
                p = in(reg) $p, s = in(reg) $stride, options(nostack))
        };
    }
    /// C tiles 0–3 set to zero.
    macro_rules! zero_c {
        () => {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        };
    }
    macro_rules! dot {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
                options(nostack, nomem)
            )
        };
    }

    /// The six part products of one 32-`k` step into C tiles 0–3 (row tiles 0|1 × panels
    /// 0|1): `a` the step's 6 A tiles (`[part][row tile]`, contiguous), `b[part][panel]` its B
    /// tiles (each contiguous). Per step: 12 A-tile and 6 B-tile loads, 24 tile products.
    #[inline(always)]
    unsafe fn step(a: *const u16, b: &[[*const u16; 2]; 3]) {
        let at = |part: usize, i: usize| a.add((part * 2 + i) * TILE);
        macro_rules! quad {
            () => {
                dot!(0, 4, 6);
                dot!(1, 4, 7);
                dot!(2, 5, 6);
                dot!(3, 5, 7);
            };
        }
        // B = hi: A hi, mid, lo
        load!(6, b[0][0]);
        load!(7, b[0][1]);
        for part in 0..3 {
            load!(4, at(part, 0));
            load!(5, at(part, 1));
            quad!();
        }
        // B = mid: A hi, mid
        load!(6, b[1][0]);
        load!(7, b[1][1]);
        for part in 0..2 {
            load!(4, at(part, 0));
            load!(5, at(part, 1));
            quad!();
        }
        // B = lo: A hi
        load!(6, b[2][0]);
        load!(7, b[2][1]);
        load!(4, at(0, 0));
        load!(5, at(0, 1));
        quad!();
    }

    /// The one product of a one-part 32-`k` step into C tiles 0–3: `a` the step's 2 A tiles
    /// (`[row tile]`, contiguous), `b[panel]` its B tiles. 2 A-tile and 2 B-tile loads, 4 tile
    /// products.
    #[inline(always)]
    unsafe fn step_one(a: *const u16, b: [*const u16; 2]) {
        load!(6, b[0]);
        load!(7, b[1]);
        load!(4, a);
        load!(5, a.add(TILE));
        dot!(0, 4, 6);
        dot!(1, 4, 7);
        dot!(2, 5, 6);
        dot!(3, 5, 7);
    }

    /// The int8 product's tile configuration: C tiles 0–3 16 rows × 16 i32; A tiles 4–5 16
    /// rows × 32 int8 (one block of 16 rows); B tiles 6–7 8 rows × 64 bytes (a block's 8
    /// groups of 16 columns × 4 int8: one panel block of the AVX-512 `Q8_0` layout).
    fn config_q8() -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            let (colsb, rows) = match t {
                0..=3 => (64u16, 16u8),
                4 | 5 => (32, 16),
                _ => (64, 8),
            };
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        }
        Config(c)
    }

    /// `xs` (32 floats) rounded as `Q8_0` rounds (the VNNI kernel's rounding) into 32 int8 at
    /// `out`; returns the scale.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn round_block(xs: &[f32], out: *mut i8) -> f32 {
        use std::arch::x86_64::*;
        let (d, q) = super::super::cpu_qgemm::x86_rounded(xs);
        // i32 -> i16 -> i8 packs 128-bit lanes pairwise; 0xD8 restores the order each time
        let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
        let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
        let b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
        _mm256_storeu_si256(out as *mut __m256i, b);
        d
    }

    /// `x (m, k)` rounded to `Q8_0` blocks as A tiles `[row pair][block][row tile][16][32]`
    /// and their scales `[row][block]` (`m` padded to 32 rows of zeros, scale 0).
    fn pack_q8_rows(x: &[f32], m: usize, k: usize) -> (Aligned<i8>, Vec<f32>) {
        let (mp, blocks) = (m.next_multiple_of(32), k / 32);
        let pair = blocks * 2 * 512;
        let mut a = Aligned::<i8>::zeroed((mp / 32) * pair);
        let mut s = vec![0f32; mp * blocks];
        a.par_chunks_mut(pair.max(1))
            .zip(s.par_chunks_mut((32 * blocks).max(1)))
            .enumerate()
            .for_each(|(rp, (dst, s))| {
                for rr in 0..32.min(m.saturating_sub(rp * 32)) {
                    let row = &x[(rp * 32 + rr) * k..][..k];
                    let (i, r) = (rr / 16, rr % 16);
                    for (b, xs) in row.chunks_exact(32).enumerate() {
                        let at = b * 1024 + i * 512 + r * 32;
                        // SAFETY: every level of the CPU kernels includes AVX2; `xs` holds 32
                        // floats and `dst` 32 bytes from `at`
                        s[rr * blocks + b] = unsafe { round_block(xs, dst.as_mut_ptr().add(at)) };
                    }
                }
            });
        (a, s)
    }

    /// One block's i32 sums of a 32 × 32 output block (`c`, row stride 32) added into `out`
    /// (row stride `np`) scaled by the rows' scales (`s`, `sstride` apart) times the two
    /// panels' column scales (`d0`, `d1`): `out = fma(f32(c), s · d, out)`, as the VNNI kernel.
    #[target_feature(enable = "avx512f")]
    unsafe fn scale_q8(
        c: *const i32,
        s: *const f32,
        sstride: usize,
        d: [*const f32; 2],
        out: *mut f32,
        np: usize,
    ) {
        use std::arch::x86_64::*;
        let dv = d.map(|d| _mm512_loadu_ps(d));
        for r in 0..32 {
            let sv = _mm512_set1_ps(*s.add(r * sstride));
            let o = out.add(r * np);
            for (j, dv) in dv.iter().enumerate() {
                let ci = _mm512_loadu_si512(c.add(r * 32 + 16 * j) as *const __m512i);
                let f = _mm512_loadu_ps(o.add(16 * j));
                let f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ci), _mm512_mul_ps(sv, *dv), f);
                _mm512_storeu_ps(o.add(16 * j), f);
            }
        }
    }

    /// `x (m, k) · Wᵀ -> (m, n)` through the int8 tiles: `q` / `d` the AVX-512 `Q8_0` layout's
    /// values `[panel][block][8][16][4]` and scales `[panel][block][16]` of `W (n, k)`.
    pub(super) fn product_q8(
        x: &[f32],
        m: usize,
        (n, k): (usize, usize),
        q: &[i8],
        d: &[f32],
    ) -> Vec<f32> {
        let (a, s) = pack_q8_rows(x, m, k);
        let panels = n.div_ceil(NR);
        let (mp, np) = (m.next_multiple_of(32), panels.next_multiple_of(2) * NR);
        let mut acc = vec![0f32; mp * np];
        let acc_addr = acc.as_mut_ptr() as usize;
        super::super::cpu_host::for_panel_runs(panels, true, |p0, p1| {
            // SAFETY: AMX-INT8 runs here (the caller checked); `a` / `s` hold the mp padded rows'
            // tiles and scales, `q` / `d` every panel's blocks; `acc` holds mp · np and the runs
            // of panel pairs write disjoint columns.
            unsafe { run_q8(&a, &s, mp, np, k / 32, q, d, p0, p1, acc_addr as *mut f32) };
        });
        if np == n {
            acc.truncate(m * n);
            return acc;
        }
        let mut y = Vec::with_capacity(m * n);
        for row in acc.chunks_exact(np).take(m) {
            y.extend_from_slice(&row[..n]);
        }
        y
    }

    /// Panel pairs `p0..p1` of the int8 product into the padded `acc (mp, np)` (zeros before):
    /// per panel pair, per row pair, block after block, the four tile sums then their scaled
    /// addition (the weight's pair stays in L2 while every row pair passes).
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_q8(
        a: &[i8],
        s: &[f32],
        mp: usize,
        np: usize,
        blocks: usize,
        q: &[i8],
        d: &[f32],
        p0: usize,
        p1: usize,
        acc: *mut f32,
    ) {
        let zero_q = Aligned::<i8>::zeroed(512);
        let zero_d = vec![0f32; blocks * NR];
        let c = Aligned::<i32>::zeroed(32 * 32);
        let cp = c.as_ptr() as *mut i32;
        let cfg = config_q8();
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        for p in (p0..p1).step_by(2) {
            let pair = p + 1 < p1;
            for rp in 0..mp / 32 {
                let ar = a.as_ptr().add(rp * blocks * 1024);
                for b in 0..blocks {
                    let qb = |panel: usize| q.as_ptr().add((panel * blocks + b) * 512);
                    let b1 = if pair { qb(p + 1) } else { zero_q.as_ptr() };
                    zero_c!();
                    load_c!(4, ar.add(b * 1024), 32usize);
                    load_c!(5, ar.add(b * 1024 + 512), 32usize);
                    load_c!(6, qb(p), 64usize);
                    load_c!(7, b1, 64usize);
                    asm!(
                        "tdpbssd tmm0, tmm4, tmm6",
                        "tdpbssd tmm1, tmm4, tmm7",
                        "tdpbssd tmm2, tmm5, tmm6",
                        "tdpbssd tmm3, tmm5, tmm7",
                        options(nostack, nomem)
                    );
                    store!(0, cp, 128usize);
                    store!(1, cp.add(16), 128usize);
                    store!(2, cp.add(16 * 32), 128usize);
                    store!(3, cp.add(16 * 32 + 16), 128usize);
                    let d1 = match pair {
                        true => d.as_ptr().add(((p + 1) * blocks + b) * NR),
                        false => zero_d.as_ptr().add(b * NR),
                    };
                    scale_q8(
                        cp,
                        s.as_ptr().add(rp * 32 * blocks + b),
                        blocks,
                        [d.as_ptr().add((p * blocks + b) * NR), d1],
                        acc.add(rp * 32 * np + p * NR),
                        np,
                    );
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }

    /// Prefetch `bytes` from `p` into L1, a line at a time.
    #[inline(always)]
    unsafe fn prefetch(p: *const u16, bytes: usize) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for off in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>((p as *const i8).add(off));
        }
    }

    /// `x (m, k)` split into `parts` and packed as A tiles:
    /// `[row pair][step][part][row tile][16][32]` (`mp` = `m` rounded up to 32 rows; padding
    /// rows and `k` are 0).
    fn pack_rows(x: &[f32], m: usize, k: usize, kp: usize, parts: Parts) -> Aligned<u16> {
        let mp = m.next_multiple_of(32);
        let steps = kp / KSTEP;
        let count = parts.count();
        let pair = steps * count * 2 * TILE;
        let mut a = Aligned::<u16>::zeroed((mp / 32) * pair);
        a.par_chunks_mut(pair).enumerate().for_each(|(rp, dst)| {
            for rr in 0..32.min(m.saturating_sub(rp * 32)) {
                let row = &x[(rp * 32 + rr) * k..][..k];
                let (i, r) = (rr / 16, rr % 16);
                for (ks, chunk) in row.chunks(KSTEP).enumerate() {
                    let base = ks * count * 2 * TILE + i * TILE + r * KSTEP;
                    if parts == Parts::One {
                        for (kk, &v) in chunk.iter().enumerate() {
                            dst[base + kk] = bf16_bits_fast(v);
                        }
                        continue;
                    }
                    for (kk, &v) in chunk.iter().enumerate() {
                        let hi = bf16_bits_fast(v);
                        let r1 = v - f32::from_bits((hi as u32) << 16);
                        let mid = bf16_bits_fast(r1);
                        let r2 = r1 - f32::from_bits((mid as u32) << 16);
                        dst[base + kk] = hi;
                        dst[base + 2 * TILE + kk] = mid;
                        dst[base + 4 * TILE + kk] = bf16_bits_fast(r2);
                    }
                }
            }
        });
        a
    }

    /// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panel pairs each).
    pub(super) fn product(x: &[f32], m: usize, w: &AmxWeight, bl: &AmxBlocking) -> Vec<f32> {
        let (n, k, kp) = (w.n, w.k, w.kp);
        let a = pack_rows(x, m, k, kp, w.parts);
        let panels = n.div_ceil(NR);
        let zero = Aligned::<u16>::zeroed(kp * NR);
        // the output padded to whole tiles: (⌈m/32⌉·32, ⌈panels/2⌉·32); y itself when m and n
        // are whole already
        let (mp, np) = (m.next_multiple_of(32), panels.next_multiple_of(2) * NR);
        let mut acc: Vec<f32> = Vec::with_capacity(mp * np);
        let acc_addr = acc.as_mut_ptr() as usize;
        super::super::cpu_host::for_panel_runs(panels, true, |p0, p1| {
            // SAFETY: AMX runs here (the caller checked `available`); `a` holds the packed row
            // pairs of mp rows, each plane ⌈n/16⌉·kp·16 elements, `zero` kp·16, as `run` reads
            // them; `acc` has capacity mp·np and the runs of panel pairs write disjoint columns.
            unsafe { run(&a, mp, np, w, &zero, p0, p1, acc_addr as *mut f32, bl) };
        });
        // SAFETY: every tile of the padded output was written (the runs cover all panel pairs
        // and every row pair).
        unsafe { acc.set_len(mp * np) };
        if mp == m && np == n {
            return acc;
        }
        let mut y = Vec::with_capacity(m * n);
        for row in acc.chunks_exact(np).take(m) {
            y.extend_from_slice(&row[..n]);
        }
        y
    }

    /// What one thread's tile passes read and write.
    struct Pass<'a> {
        /// The packed activations (`pack_rows`).
        a: &'a [u16],
        /// Elements per packed row pair.
        pair: usize,
        w: &'a AmxWeight,
        /// A zero panel (`kp · 16`), the partner of an odd last panel.
        zero: &'a [u16],
        /// The thread's panels end here.
        p1: usize,
        /// The padded output and its row length.
        acc: *mut f32,
        np: usize,
        steps: usize,
        bl: &'a AmxBlocking,
    }

    impl Pass<'_> {
        /// The `k` step whose tiles a step reads (the first, under the `hot` probe).
        fn at(&self, ks: usize) -> usize {
            if self.bl.hot {
                0
            } else {
                ks
            }
        }

        /// B tile of `part` for `panel` at step `ks` (the zero panel past the thread's last).
        unsafe fn b(&self, part: usize, panel: usize, ks: usize) -> *const u16 {
            let kp = self.w.kp;
            match panel < self.p1 {
                true => self.w.planes[part]
                    .as_ptr()
                    .add(panel * kp * NR + self.at(ks) * TILE),
                false => self.zero.as_ptr().add(self.at(ks) * TILE),
            }
        }

        /// Steps `k0..k1` of the 32 × 32 output block (row pair `rp`, panels `p`, `p + 1`):
        /// the C tiles start from zero at `k0 == 0`, else from the output; stored back after.
        unsafe fn block(&self, rp: usize, p: usize, k0: usize, k1: usize) {
            let sc = self.np * 4; // C-tile row stride, bytes
                                  // C tile (i, j): rows 32·rp + 16i, columns 16·(p + j)
            let c = |i: usize, j: usize| self.acc.add((rp * 32 + 16 * i) * self.np + (p + j) * NR);
            if k0 == 0 {
                zero_c!();
            } else {
                load_c!(0, c(0, 0), sc);
                load_c!(1, c(0, 1), sc);
                load_c!(2, c(1, 0), sc);
                load_c!(3, c(1, 1), sc);
            }
            let ar = self.a.as_ptr().add(rp * self.pair);
            let (q, pf) = (p + 1, self.bl.pf);
            let count = self.w.parts.count();
            // A tiles of one step: `count` parts × 2 row tiles
            let a_step = count * 2 * TILE;
            for ks in k0..k1 {
                if pf > 0 && ks + pf < self.steps {
                    prefetch(ar.add(self.at(ks + pf) * a_step), a_step * 2);
                    for part in 0..count {
                        prefetch(self.b(part, p, ks + pf), TILE * 2);
                        prefetch(self.b(part, q, ks + pf), TILE * 2);
                    }
                }
                let a = ar.add(self.at(ks) * a_step);
                match self.w.parts {
                    Parts::One => step_one(a, [self.b(0, p, ks), self.b(0, q, ks)]),
                    Parts::Three => {
                        let bt = [
                            [self.b(0, p, ks), self.b(0, q, ks)],
                            [self.b(1, p, ks), self.b(1, q, ks)],
                            [self.b(2, p, ks), self.b(2, q, ks)],
                        ];
                        step(a, &bt);
                    }
                }
            }
            store!(0, c(0, 0), sc);
            store!(1, c(0, 1), sc);
            store!(2, c(1, 0), sc);
            store!(3, c(1, 1), sc);
        }
    }

    /// Panel pairs `p0..p1` of the product into the padded output `acc (mp, np)`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        a: &[u16],
        mp: usize,
        np: usize,
        w: &AmxWeight,
        zero: &[u16],
        p0: usize,
        p1: usize,
        acc: *mut f32,
        bl: &AmxBlocking,
    ) {
        let steps = w.kp / KSTEP;
        let pairs = mp / 32;
        let pass = Pass {
            a,
            pair: steps * w.parts.count() * 2 * TILE,
            w,
            zero,
            p1,
            acc,
            np,
            steps,
            bl,
        };
        let cfg = config();
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        // k steps per L2 block: the row block's A tiles of that k range stay in L2 across the
        // thread's panel pairs (C stored and reloaded between blocks)
        let kc = match bl.kc {
            0 => steps,
            kc => kc.min(steps),
        };
        // k steps per pass over a row block: all of the L2 block's (C stays in tiles), or
        // `kb` (so the pair's B slice stays in L1 across the row pairs)
        let kb = match bl.kb {
            0 => kc,
            kb => kb.min(kc),
        };
        if bl.nb > 0 {
            // weight-block order: `nb` panel pairs × an L2 block's steps stay in L2 while every
            // row pair passes (the weight read from memory once per call)
            for pb in (p0..p1).step_by(2 * bl.nb) {
                for kc0 in (0..steps).step_by(kc) {
                    for rp in 0..pairs {
                        for p in (pb..(pb + 2 * bl.nb).min(p1)).step_by(2) {
                            pass.block(rp, p, kc0, (kc0 + kc).min(steps));
                        }
                    }
                }
            }
            asm!("tilerelease", options(nostack, nomem));
            return;
        }
        for kc0 in (0..steps).step_by(kc) {
            let kc1 = (kc0 + kc).min(steps);
            for rb in (0..pairs).step_by(bl.mc / 32) {
                for p in (p0..p1).step_by(2) {
                    for k0 in (kc0..kc1).step_by(kb) {
                        for rp in rb..(rb + bl.mc / 32).min(pairs) {
                            pass.block(rp, p, k0, (k0 + kb).min(kc1));
                        }
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candle::cpu_host::checks::{max_rel, sum_tolerance};
    use candle_core::{DType, Device};
    use proptest::prelude::*;

    proptest! {
        /// The three parts sum back to the value exactly, for every finite f32 from 2⁻¹¹⁰ up
        /// and zero.
        #[test]
        fn the_split_sums_back_exactly(bits in any::<u32>()) {
            let v = f32::from_bits(bits);
            prop_assume!(v.is_finite() && (v == 0.0 || v.abs() >= 2f32.powi(-110)));
            let [h, m, l] = split(v);
            prop_assert_eq!(bf16_value(h) + (bf16_value(m) + bf16_value(l)), v);
            // each part is a bf16 that is no larger than the remainder it rounds
            prop_assert!(bf16_value(m).abs() <= bf16_value(h).abs());
        }
    }

    proptest! {
        /// The activations' branch-free rounding gives the guarded rounding's bits for every
        /// finite value up to the largest bf16.
        #[test]
        fn fast_rounding_equals_guarded_rounding(bits in any::<u32>()) {
            let v = f32::from_bits(bits);
            prop_assume!(v.is_finite() && v.abs() <= bf16_value(0x7F7F));
            prop_assert_eq!(bf16_bits_fast(v), bf16_bits(v));
        }
    }

    #[test]
    fn amx_blocking_specs_are_parsed_or_refused_by_name() {
        assert_eq!(AmxBlocking::parse(""), Ok(AmxBlocking::DEFAULT));
        assert_eq!(
            AmxBlocking::parse("mc=64, pf=2,kb=4"),
            Ok(AmxBlocking {
                mc: 64,
                pf: 2,
                kb: 4,
                kc: 0,
                nb: 0,
                hot: false
            })
        );
        for (spec, says) in [
            ("mc=48", "multiple of 32"),
            ("mc=0", "multiple of 32"),
            ("pf=x", "`x` is not a count"),
            ("nc=2", "unknown key `nc`"),
            ("mc", "not key=value"),
        ] {
            let e = AmxBlocking::parse(spec).expect_err(spec);
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    #[test]
    fn non_finite_values_keep_their_kind() {
        assert!(bf16_value(split(f32::NAN)[0]).is_nan());
        assert_eq!(bf16_value(split(f32::INFINITY)[0]), f32::INFINITY);
        let big = split(f32::MAX);
        let back = bf16_value(big[0]) + (bf16_value(big[1]) + bf16_value(big[2]));
        assert_eq!(back, f32::MAX);
    }

    fn exact(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                y[r * n + c] = (0..k)
                    .map(|kk| x[r * k + kk] as f64 * w[c * k + kk] as f64)
                    .sum();
            }
        }
        y
    }

    /// The six kept part products are an f32-accurate product: against the exact sum, their
    /// error is within a few f32 roundings of the row's magnitude, on random and on
    /// wide-ranging values; the planes give back the weight's rows bit for bit.
    #[test]
    fn six_part_products_are_f32_accurate() -> Result<()> {
        let dev = Device::Cpu;
        for (m, n, k, scale) in [
            (5usize, 19usize, 70usize, 1.0f32),
            (3, 33, 257, 1e3),
            (2, 16, 32, 1e-3),
        ] {
            let x = Tensor::randn(0f32, scale, (m, k), &dev)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let wv = Tensor::randn(0f32, 1.0, (n, k), &dev)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let w = AmxWeight::from_rows(&wv, n, k);
            assert_eq!(w.rows(), wv);
            let got = product_reference(&x, m, &w);
            let want = exact(&x, m, &wv, n, k);
            for r in 0..m {
                for c in 0..n {
                    let mag: f64 = (0..k)
                        .map(|kk| (x[r * k + kk] * wv[c * k + kk]).abs() as f64)
                        .sum();
                    let d = (got[r * n + c] - want[r * n + c]).abs();
                    assert!(
                        d <= f32::EPSILON as f64 / 4.0 * mag,
                        "({m},{n},{k}) [{r},{c}]: {d:e} vs {mag:e}"
                    );
                }
            }
        }
        Ok(())
    }

    /// Stacking split weights equals splitting the stacked rows, aligned (planes concatenated)
    /// or not (rows split again); differing `in` is refused.
    #[test]
    fn stacking_split_weights_equals_splitting_the_stack() {
        for rows in [[32usize, 16, 7], [5, 16, 9]] {
            let parts: Vec<Vec<f32>> = rows
                .iter()
                .enumerate()
                .map(|(i, &r)| {
                    (0..r * 40)
                        .map(|j| ((i * 7919 + j) as f32 * 0.37).sin())
                        .collect()
                })
                .collect();
            let ws: Vec<AmxWeight> = parts
                .iter()
                .zip(rows)
                .map(|(p, r)| AmxWeight::from_rows(p, r, 40))
                .collect();
            let stacked = AmxWeight::stack(&ws.iter().collect::<Vec<_>>()).expect("one in");
            let all: Vec<f32> = parts.concat();
            assert_eq!(stacked.dims(), (rows.iter().sum(), 40));
            assert_eq!(stacked.rows(), all);
            let direct = AmxWeight::from_rows(&all, rows.iter().sum(), 40);
            for i in 0..3 {
                assert_eq!(&*stacked.planes[i], &*direct.planes[i]);
            }
        }
        let a = AmxWeight::from_rows(&[0.0; 8], 1, 8);
        let b = AmxWeight::from_rows(&[0.0; 9], 1, 9);
        assert!(AmxWeight::stack(&[&a, &b]).is_none());
        assert!(AmxWeight::stack(&[]).is_none());
    }

    /// One part is the value rounded to nearest even bf16, the rounding of the AVX-512 BF16
    /// kernel's packing; it stacks (aligned or not) like three, and one- and three-part weights
    /// do not stack together.
    #[test]
    fn one_part_is_the_bf16_rounding() {
        let (n, k) = (21, 70);
        let w: Vec<f32> = (0..n * k).map(|j| (j as f32 * 0.61).sin() * 3.0).collect();
        let one = AmxWeight::split_rows(&w, n, k, Parts::One);
        assert_eq!(one.parts(), Parts::One);
        let bf16 = super::super::cpu_bf16gemm::PackedBf16::from_rows(&w, n, k);
        assert_eq!(one.rows(), bf16.rows());
        for split_at in [16, 5] {
            let (a, b) = (
                AmxWeight::split_rows(&w[..split_at * k], split_at, k, Parts::One),
                AmxWeight::split_rows(&w[split_at * k..], n - split_at, k, Parts::One),
            );
            let stacked = AmxWeight::stack(&[&a, &b]).expect("one part, one in");
            assert_eq!(stacked.parts(), Parts::One);
            assert_eq!(&*stacked.planes[0], &*one.planes[0], "split at {split_at}");
        }
        let three = AmxWeight::from_rows(&w, n, k);
        assert!(AmxWeight::stack(&[&one, &three]).is_none());
    }

    /// Where AMX runs: one-part (bf16) products equal their plain-Rust sums within f32
    /// rounding on every tail and blocking (as the three-part test below); elsewhere nothing
    /// to run.
    #[test]
    fn amx_bf16_linear_equals_the_reference() -> Result<()> {
        if !available() {
            eprintln!("no AMX bf16 tiles here: the AMX kernel does not run");
            return Ok(());
        }
        for spec in ["", "mc=32", "kb=3,mc=64,pf=1", "kc=3", "nb=3,kc=4"] {
            let bl = AmxBlocking::parse(spec).expect("valid");
            for (m, n, k) in [
                (37usize, 130usize, 96usize),
                (1, 7, 896),
                (150, 33, 300),
                (13, 40, 4864),
                (AmxBlocking::DEFAULT.mc + 45, 80, 257),
            ] {
                let x: Vec<f32> = (0..m * k)
                    .map(|j| ((j * 7 + 3) as f32 * 0.37).sin())
                    .collect();
                let wv: Vec<f32> = (0..n * k)
                    .map(|j| ((j * 5 + 1) as f32 * 0.53).cos())
                    .collect();
                let w = AmxWeight::split_rows(&wv, n, k, Parts::One);
                let got =
                    linear_with(&Tensor::from_vec(x.clone(), (m, k), &Device::Cpu)?, &w, &bl)?
                        .flatten_all()?
                        .to_vec1::<f32>()?;
                let want = product_reference(&x, m, &w);
                let d = crate::candle::cpu_host::checks::max_rel_to(&got, &want);
                let tol = sum_tolerance(k) as f64;
                assert!(d <= tol, "{spec} ({m}, {n}, {k}): {d:e}");
            }
        }
        Ok(())
    }

    /// Where AMX-INT8 runs: `Q8_0` products on the int8 tiles equal the plain-Rust sums (and so
    /// the VNNI kernel) bit for bit, on every tail: rows not a multiple of 16 or 32, ragged
    /// and odd panel counts, one block, long `k`, a single row; `cpu_qgemm::linear` takes them.
    /// Elsewhere the call is refused with a clear error.
    #[test]
    fn amx_q8_equals_the_reference_bit_for_bit() -> Result<()> {
        use super::super::cpu_isa::Isa;
        use super::super::cpu_qgemm::{self, PackedQ8};
        use candle_core::quantized::{GgmlDType, QTensor};
        let dev = Device::Cpu;
        let q8 = |n: usize, k: usize| -> Result<Option<PackedQ8>> {
            let w = Tensor::randn(0f32, 0.3, (n, k), &dev)?;
            let bytes = QTensor::quantize(&w, GgmlDType::Q8_0)?.data()?.into_owned();
            Ok(PackedQ8::from_blocks(&bytes, n, k, Isa::Avx512))
        };
        if !q8_available() {
            eprintln!("no AMX-INT8 here: the int8 tiles do not run");
            let w = q8(16, 32)?.expect("fits");
            let e = q8_product(&[0.0; 32], 1, &w).expect_err("no AMX-INT8");
            assert!(e.to_string().contains("AMX"), "{e}");
            return Ok(());
        }
        for (m, n, k) in [
            (37usize, 130usize, 96usize),
            (1, 7, 64),
            (150, 33, 320),
            (13, 40, 4864),
            (64, 32, 32),
            (33, 16, 896),
            (17, 48, 128),
        ] {
            let w = q8(n, k)?.expect("k a multiple of 32");
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let got = q8_product(&x, m, &w)?;
            let want = cpu_qgemm::product_reference(&x, m, &w);
            assert!(
                got == want,
                "({m}, {n}, {k}): the int8 tiles differ from the sums"
            );
            if q8_runs()? {
                let xt = Tensor::from_vec(x.clone(), (m, k), &dev)?;
                let y = q8_linear(&xt, &w)?.flatten_all()?.to_vec1::<f32>()?;
                assert!(
                    y == want,
                    "({m}, {n}, {k}): linear did not take the tiles' sums"
                );
            }
        }
        Ok(())
    }

    /// Where AMX runs: the kernel equals candle's matmul to f32 rounding on every tail (rows not
    /// a multiple of 16 or 32 or of the row block, ragged and odd panel counts, `k` not a
    /// multiple of 32, a long `k`, 3-D and strided inputs, one row). Elsewhere it says so and
    /// checks that the call is refused with a clear error.
    #[test]
    fn amx_linear_equals_candle_matmul() -> Result<()> {
        let dev = Device::Cpu;
        if !available() {
            eprintln!("no AMX bf16 tiles here: the AMX kernel does not run");
            let w = AmxWeight::from_rows(&[0.0; 8], 1, 8);
            let e = linear(&Tensor::zeros((2, 8), DType::F32, &dev)?, &w).expect_err("no AMX");
            assert!(e.to_string().contains("does not run AMX"), "{e}");
            return Ok(());
        }
        for spec in [
            "",
            "mc=32",
            "mc=64,pf=1",
            "mc=256,pf=2",
            "kb=1",
            "kb=3,mc=64",
            "kb=2,kc=5",
            "kc=3",
            "nb=1",
            "nb=3,kc=4",
        ] {
            let bl = AmxBlocking::parse(spec).expect("valid");
            for (xdims, n) in [
                (vec![37usize, 96], 130usize),
                (vec![2, 19, 64], 48),
                (vec![1, 1, 896], 7),
                (vec![150, 300], 33),
                (vec![7, 40], 50),
                (vec![AmxBlocking::DEFAULT.mc + 45, 257], 16 * 5),
                (vec![13, 4864], 40),
                (vec![64, 32], 16),
            ] {
                let k = *xdims.last().unwrap();
                let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
                let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
                let p = AmxWeight::pack(&w)?;
                let got = linear_with(&x, &p, &bl)?;
                let want = x.broadcast_matmul(&w.t()?)?;
                assert_eq!(got.dims(), want.dims());
                let d = max_rel(&got, &want);
                let tol = sum_tolerance(k);
                assert!(d <= tol, "{spec} {xdims:?} x ({n}, {k}): {d:e}");
            }
        }
        let x = Tensor::randn(0f32, 1.0, (24, 10), &dev)?.t()?; // (10, 24), not contiguous
        let w = Tensor::randn(0f32, 1.0, (20, 24), &dev)?;
        let got = linear(&x, &AmxWeight::pack(&w)?)?;
        let want = x.matmul(&w.t()?)?;
        let d = (&got - &want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        assert!(d <= 2e-5, "strided input: {d:e}");
        let e = linear(
            &Tensor::zeros((3, 7), DType::F32, &dev)?,
            &AmxWeight::from_rows(&[0.0; 8], 1, 8),
        )
        .expect_err("k 7 vs 8");
        assert!(e.to_string().contains("does not fit"), "{e}");
        Ok(())
    }
}
