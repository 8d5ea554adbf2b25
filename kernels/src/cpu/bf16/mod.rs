//! bf16-weight linear layers on x86 CPUs with AVX-512 BF16 (`--quantize bf16`): `y = x Wᵀ`
//! with `W` rounded once at load to bf16 and packed, `x` rounded to bf16 on every call, and
//! the products summed in f32 by `vdpbf16ps` (16 lanes, two bf16 products per lane and
//! instruction):
//!
//! `y[r][c] = Σ_k bf16(x[r][k]) · bf16(W[c][k])` (each product exact in f32, the sum in f32)
//!
//! Why: on CPUs where `vdpbf16ps` runs at the f32 FMA's instruction rate (AMD Zen 4 and Zen 5:
//! measured with `scripts/cpu-real/peak.c`, ~2× the f32 FMA's flops) a product does half the
//! instructions of the f32 kernel and reads half its weight bytes. (On Intel Xeons the
//! instruction runs at half the f32 FMA's rate, so there this kernel is not faster than f32.)
//!
//! Layout: the weight, per panel of [`NR`] columns, as `⌈k/2⌉` units of 16 columns × a pair of
//! consecutive `k` (the low half the even `k`; an odd `k`'s last pair zero above): one unit is
//! one 64-byte register of 32 bf16, and the unit of the activations is one row's pair, the
//! u32 the kernel broadcasts. In pair units this is exactly [`super::gemm`]'s f32 layout,
//! so the blocked loops, the thread split and the [`Blocking`] are that module's
//! ([`super::gemm::x86::product_with`]); only the packing and the microkernel differ.
//!
//! Which kernel an f32 model's bf16 weights take on the CPU (the backends' shell,
//! `candle::cpu::bf16gemm::kernel`, decides): the AMX tiles of [`super::amx`] with one part where
//! AMX runs (on Intel Xeons `vdpbf16ps` runs at half the f32 FMA's rate, AMX at ~13× it), else
//! this kernel where the CPU has AVX-512 BF16, else (and on GPUs) a bf16 tensor through candle's
//! bf16 matmul. `FORKSCORE_CPU_BF16=amx|dot|candle` picks one, for A/B runs. The tests compute
//! the same sums in plain Rust (f64) and hold the kernel to them.

use super::aligned::Aligned;
use super::amx::{bf16_bits, bf16_value};
use super::gemm::Blocking;
use super::isa::Isa;
use super::panel::NR;
use super::Result;

/// Whether the bf16 kernel runs in this process: the AVX-512 level of [`Isa`] is chosen
/// (not capped by `FORKSCORE_CPU_ISA=avx2`) and the CPU has AVX-512 BF16. Detected once.
pub fn available() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| Isa::chosen() == Some(Isa::Avx512) && has_bf16_dot())
}

/// The CPU has AVX-512 F + BF16 (whatever `FORKSCORE_CPU_ISA` says: the tests' question).
pub fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight `W (n, k)` rounded to bf16 and packed for the kernel: `(⌈n/16⌉, ⌈k/2⌉, 16)` pairs
/// (the last panel's missing columns and an odd `k`'s last high half zero).
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    n: usize,
    k: usize,
    panels: Aligned<u32>,
}

impl PackedBf16 {
    /// Round (to nearest even: [`bf16_bits`]) and pack row-major `w (n, k)`, on the rayon
    /// threads (a panel each).
    pub fn from_rows(w: &[f32], n: usize, k: usize) -> Self {
        use rayon::prelude::*;
        let units = k.div_ceil(2);
        let mut panels = Aligned::<u32>::zeroed(n.div_ceil(NR) * units * NR);
        panels
            .par_chunks_mut((units * NR).max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for c in 0..NR.min(n - p * NR) {
                    let row = &w[(p * NR + c) * k..][..k];
                    for (u, pair) in pairs(row, bf16_bits).enumerate() {
                        panel[u * NR + c] = pair;
                    }
                }
            });
        PackedBf16 { n, k, panels }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The rows of `W` as the kernel multiplies them (the bf16 values), `(n, k)` row-major.
    pub fn rows(&self) -> Vec<f32> {
        let (n, k, units) = (self.n, self.k, self.k.div_ceil(2));
        let mut w = vec![0f32; n * k];
        for (r, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            let panel = &self.panels[(r / NR) * units * NR..];
            for (kk, v) in row.iter_mut().enumerate() {
                let pair = panel[(kk / 2) * NR + r % NR];
                *v = bf16_value((pair >> (16 * (kk % 2))) as u16);
            }
        }
        w
    }

    /// The weights stacked along `out` (`[a; b; …]`), all with one `in`; `None` for an empty
    /// list or differing `in`. Panels are concatenated as they are when every part but the
    /// last has a multiple of 16 rows; otherwise the rows are packed again (exactly: they are
    /// bf16 values already).
    pub fn stack(parts: &[&PackedBf16]) -> Option<Self> {
        let k = parts.first()?.k;
        if parts.iter().any(|p| p.k != k) {
            return None;
        }
        let n = parts.iter().map(|p| p.n).sum();
        if parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0) {
            let panels = Aligned::concat(&parts.iter().map(|p| &*p.panels).collect::<Vec<_>>());
            return Some(PackedBf16 { n, k, panels });
        }
        let rows: Vec<f32> = parts.iter().flat_map(|p| p.rows()).collect();
        Some(Self::from_rows(&rows, n, k))
    }
}

/// `row`'s values rounded by `round` and paired as the kernel's units: `k` even in the low half,
/// the next `k` in the high half (0 past the end).
fn pairs(row: &[f32], round: fn(f32) -> u16) -> impl Iterator<Item = u32> + '_ {
    row.chunks(2).map(move |pair| {
        let lo = round(pair[0]) as u32;
        let hi = pair.get(1).map_or(0, |&v| round(v) as u32);
        lo | hi << 16
    })
}

/// That the CPU has AVX-512 BF16 and `bl` fits an AVX-512 tile (no count 0, `mr` within the
/// tile's 14 rows, `mc` a multiple of `mr`).
pub fn check(bl: &Blocking) -> Result<()> {
    if !has_bf16_dot() {
        super::bail!("bf16 linear: this CPU has no AVX-512 BF16");
    }
    let max = Blocking::max_mr(Isa::Avx512);
    if bl.mr > max || [bl.mr, bl.kc, bl.mc, bl.nc].contains(&0) || !bl.mc.is_multiple_of(bl.mr) {
        super::bail!("bf16 linear: {bl:?} does not fit an AVX-512 tile");
    }
    Ok(())
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major through the bf16 kernel with blocking `bl` (the f32
/// kernel's blocking for AVX-512, in pair units). An error (never a panic) where [`check`]
/// fails or `x` is not `m` rows of `k`.
pub fn product(x: &[f32], m: usize, w: &PackedBf16, bl: &Blocking) -> Result<Vec<f32>> {
    check(bl)?;
    if x.len() != m * w.k {
        super::bail!(
            "bf16 linear: {} values are not {m} rows of {}",
            x.len(),
            w.k
        );
    }
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::product(x, m, w, bl))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!(
            "has_bf16_dot() is false off x86-64 ({}, {m}, {bl:?})",
            x.len()
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
