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
//! Which kernel an f32 model's bf16 weights take on the CPU ([`kernel`]): the AMX tiles of
//! [`super::amx`] with one part where AMX runs (on Intel Xeons `vdpbf16ps` runs at
//! half the f32 FMA's rate, AMX at ~13× it), else this kernel where the CPU has AVX-512 BF16,
//! else (and on GPUs) a bf16 tensor through candle's bf16 matmul (`Linear::Bf16` in
//! `linear.rs`). `FORKSCORE_CPU_BF16=amx|dot|candle` picks one, for A/B runs. [`product_reference`] computes the same sums in plain Rust
//! (f64); the tests hold the kernel to it.

use candle_core::{Result, Tensor};

use super::aligned::Aligned;
use super::amx::{bf16_bits, bf16_value};
use super::gemm::Blocking;
use super::isa::Isa;
use super::panel::NR;

/// Whether the bf16 kernel runs in this process: the AVX-512 level of [`Isa`] is chosen
/// (not capped by `FORKSCORE_CPU_ISA=avx2`) and the CPU has AVX-512 BF16. Detected once.
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| Isa::chosen() == Some(Isa::Avx512) && has_bf16_dot())
}

/// The kernel an f32 model's bf16 weights run on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bf16Kernel {
    /// AMX bf16 tiles, one product per tile pair ([`super::amx`], one part).
    Amx,
    /// AVX-512 BF16 `vdpbf16ps` (this module).
    Dot,
    /// A bf16 tensor through candle's matmul.
    Candle,
}

impl Bf16Kernel {
    /// The kernel for `asked` (`FORKSCORE_CPU_BF16`, trimmed; empty when unset) on a CPU where
    /// AMX runs (`amx`) and the AVX-512 BF16 kernel runs (`dot`): the fastest one that runs,
    /// `amx` first; `dot` skips AMX; `candle` keeps candle's matmul. Anything else is an error
    /// naming the choices.
    pub(crate) fn choose(asked: &str, amx: bool, dot: bool) -> std::result::Result<Self, String> {
        let fallback = match dot {
            true => Bf16Kernel::Dot,
            false => Bf16Kernel::Candle,
        };
        match asked.to_ascii_lowercase().as_str() {
            "" | "amx" if amx => Ok(Bf16Kernel::Amx),
            "" | "amx" | "dot" => Ok(fallback),
            "candle" => Ok(Bf16Kernel::Candle),
            other => Err(format!("`{other}`: expected amx, dot or candle")),
        }
    }
}

/// The kernel this process runs bf16 weights with: [`Bf16Kernel::choose`] over
/// `FORKSCORE_CPU_BF16`, AMX tiles ([`super::amx::available`]) and [`available`]; candle's
/// matmul when `FORKSCORE_CPU_GEMM` asks for candle's (or the CPU has no packed kernels).
/// Read once; an invalid value is an error naming it.
pub(crate) fn kernel() -> Result<Bf16Kernel> {
    use std::sync::OnceLock;
    static K: OnceLock<std::result::Result<Bf16Kernel, String>> = OnceLock::new();
    let chosen = K.get_or_init(|| {
        let asked = crate::switches::value("FORKSCORE_CPU_BF16").unwrap_or_default();
        let packed = super::gemm::choice() == super::gemm::CpuGemm::Packed;
        Bf16Kernel::choose(
            asked.trim(),
            packed && super::isa::amx_available(),
            packed && available(),
        )
        .map_err(|e| format!("FORKSCORE_CPU_BF16={asked:?}: {e}"))
    });
    chosen.clone().map_err(candle_core::Error::Msg)
}

/// The CPU has AVX-512 F + BF16 (whatever `FORKSCORE_CPU_ISA` says: the tests' question).
fn has_bf16_dot() -> bool {
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
pub(crate) struct PackedBf16 {
    n: usize,
    k: usize,
    panels: Aligned<u32>,
}

impl PackedBf16 {
    /// Round and pack `w (n, k)` (any float dtype, any device: read as f32 on the host).
    pub fn pack(w: &Tensor) -> Result<Self> {
        super::host::with_host_rows(w, Self::from_rows)
    }

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

/// The product the kernel computes, in plain Rust: per output, `Σ bf16(x) · w` over the
/// weight's bf16 values, summed in f64 (bf16 subnormals read as 0, as `vdpbf16ps` reads them).
#[cfg(test)]
fn product_reference(x: &[f32], m: usize, w: &PackedBf16) -> Vec<f64> {
    let (n, k) = w.dims();
    let flush = |v: f32| {
        if v.abs() < f32::MIN_POSITIVE {
            0.0
        } else {
            v as f64
        }
    };
    let wr: Vec<f64> = w.rows().into_iter().map(flush).collect();
    let mut y = vec![0f64; m * n];
    for r in 0..m {
        let xs: Vec<f64> = x[r * k..][..k]
            .iter()
            .map(|&v| flush(bf16_value(bf16_bits(v))))
            .collect();
        for c in 0..n {
            y[r * n + c] = xs.iter().zip(&wr[c * k..][..k]).map(|(a, b)| a * b).sum();
        }
    }
    y
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU through the bf16 kernel, with the f32 kernel's
/// blocking for AVX-512 ([`Blocking::chosen`], in pair units). Errors (never panics) on a
/// non-f32, non-CPU or mis-sized `x`, or a CPU where the kernel does not run.
pub(crate) fn linear(x: &Tensor, w: &PackedBf16) -> Result<Tensor> {
    linear_with(x, w, &Blocking::chosen(Isa::Avx512)?)
}

/// [`linear`] with blocking `bl` (an error if a count is 0, `mr` is over the AVX-512 tile's
/// 14 rows, or `mc` is not a multiple of `mr`).
pub(crate) fn linear_with(x: &Tensor, w: &PackedBf16, bl: &Blocking) -> Result<Tensor> {
    let ready = || {
        if !has_bf16_dot() {
            candle_core::bail!("bf16 linear: this CPU has no AVX-512 BF16");
        }
        let max = Blocking::max_mr(Isa::Avx512);
        if bl.mr > max || [bl.mr, bl.kc, bl.mc, bl.nc].contains(&0) || !bl.mc.is_multiple_of(bl.mr)
        {
            candle_core::bail!("bf16 linear: {bl:?} does not fit an AVX-512 tile");
        }
        Ok(())
    };
    super::host::apply_rows(x, (w.n, w.k), "bf16 linear", ready, |xd, m| {
        #[cfg(target_arch = "x86_64")]
        {
            x86::product(xd, m, w, bl)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!(
                "has_bf16_dot() is false off x86-64 ({}, {m}, {bl:?})",
                xd.len()
            )
        }
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use rayon::prelude::*;

    use super::super::amx::bf16_bits_fast;
    use super::super::gemm::x86::{load_acc512, product_with, store_acc512, Tile};
    use super::{pairs, Blocking, PackedBf16, NR};

    /// `x (m, k)` rounded to bf16 in groups of `mr` rows, pair-major: `a[g][u][r]` holds
    /// `x[g·mr + r][2u]` (low half) and `[2u + 1]` (high half; 0 past `k`); missing rows of
    /// the last group are 0.
    fn pack_rows(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<u32> {
        let units = k.div_ceil(2);
        let mut a = vec![0u32; m.div_ceil(mr) * mr * units];
        a.par_chunks_mut((mr * units).max(1))
            .enumerate()
            .for_each(|(g, dst)| {
                for r in 0..mr.min(m - g * mr) {
                    let src = &x[(g * mr + r) * k..][..k];
                    for (u, pair) in pairs(src, bf16_bits_fast).enumerate() {
                        dst[u * mr + r] = pair;
                    }
                }
            });
        a
    }

    /// `C (R, 16·P) (+)= A (R, kc pairs) · [B₀ … B_P]`: per pair of `k`, `P` weight registers
    /// and one broadcast pair per row, `R · P` `vdpbf16ps`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn micro<const R: usize, const P: usize>(
        kc: usize,
        a: *const u32,
        astride: usize,
        b: *const u32,
        bstride: usize,
        c: *mut f32,
        ldc: usize,
        first: bool,
    ) {
        let mut acc = load_acc512::<R, P>(c, ldc, first);
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_si512(); P];
            for (j, bv) in bv.iter_mut().enumerate() {
                *bv = _mm512_loadu_si512(b.add(j * bstride) as *const _);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(r) as i32));
                for (acc, bv) in acc.iter_mut().zip(&bv) {
                    *acc =
                        _mm512_dpbf16_ps(*acc, av, std::mem::transmute::<__m512i, __m512bh>(*bv));
                }
            }
            a = a.add(astride);
            b = b.add(NR);
        }
        store_acc512(&acc, c, ldc);
    }

    /// One [`Tile`] (≤ 14 rows, 1 or 2 panels), `mr` pairs per packed `k` step.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile(t: Tile<u32>, mr: usize) {
        macro_rules! go {
            ($($r:literal)*) => {
                match t.rows {
                    $($r => match t.panels {
                        2 => micro::<$r, 2>(t.kc, t.a, mr, t.b, t.bstride, t.c, t.ldc, t.first),
                        _ => micro::<$r, 1>(t.kc, t.a, mr, t.b, t.bstride, t.c, t.ldc, t.first),
                    },)*
                    _ => unreachable!("a tile of {} rows (the blocking was validated)", t.rows),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
    }

    /// `x (m, k) · Wᵀ -> (m, n)` row-major on the rayon threads (the CPU has AVX-512 BF16 and
    /// `bl` fits its tile: the caller checked).
    pub(super) fn product(x: &[f32], m: usize, w: &PackedBf16, bl: &Blocking) -> Vec<f32> {
        let units = w.k.div_ceil(2);
        let a = pack_rows(x, m, w.k, bl.mr);
        let mr = bl.mr;
        // SAFETY: the CPU has AVX-512 BF16 (the caller checked); `a` holds ⌈m/mr⌉·mr·units
        // and the panels ⌈n/16⌉·units·16 pairs, the layout `product_with` reads.
        unsafe {
            product_with(
                &a,
                m,
                w.n,
                units,
                &w.panels,
                true,
                bl,
                super::super::tile_store::Out::Product,
                |t| tile(t, mr),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::host::checks::{max_rel_to, sum_tolerance};
    use super::*;
    use candle_core::{DType, Device};

    /// `len` values uniform in [-1, 1).
    fn random(len: usize) -> Vec<f32> {
        Tensor::rand(-1f32, 1.0, len, &Device::Cpu)
            .and_then(|t| t.to_vec1())
            .expect("random values")
    }

    /// Packing rounds every weight to nearest even bf16 and unpacks to exactly those values;
    /// an odd `k` and a ragged last panel come back without the padding.
    #[test]
    fn packing_rounds_to_bf16_and_unpacks_exactly() {
        for (n, k) in [(1, 1), (16, 2), (17, 3), (33, 64), (5, 897)] {
            let w = random(n * k);
            let p = PackedBf16::from_rows(&w, n, k);
            assert_eq!(p.dims(), (n, k));
            let want: Vec<f32> = w.iter().map(|&v| bf16_value(bf16_bits(v))).collect();
            assert_eq!(p.rows(), want, "({n}, {k})");
        }
    }

    /// The kernel equals the plain-Rust sums within f32 rounding (the f32 kernels' tolerance:
    /// 2e-6 of the largest output, growing like √k) on every tail: 1-row and odd row counts, rows past the row block,
    /// ragged last panels after odd and even counts of whole ones, odd `k`, `k` past the `k`
    /// block and past `short_k` (the other loop order), blockings from the default to 1-row
    /// tiles; 3-D and strided inputs take the same path.
    #[test]
    fn bf16_linear_equals_the_reference() -> Result<()> {
        if !has_bf16_dot() {
            eprintln!("skipped: this CPU has no AVX-512 BF16");
            return Ok(());
        }
        let default = Blocking::default_for(Isa::Avx512);
        let blockings = [
            default,
            Blocking::parse("mr=1,mc=3,kc=5,nc=1,short_k=0", Isa::Avx512).expect("spec"),
            Blocking::parse("mr=5,mc=10,kc=7,nc=3", Isa::Avx512).expect("spec"),
        ];
        for bl in &blockings {
            for (m, n, k) in [
                (1, 16, 2),
                (3, 17, 3),
                (14, 48, 64),
                (29, 40, 129),
                (90, 33, 896),
                (15, 64, 3101),
            ] {
                let x = random(m * k);
                let w = PackedBf16::from_rows(&random(n * k), n, k);
                let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu)?;
                let y = linear_with(&xt, &w, bl)?;
                assert_eq!(y.dims(), [m, n]);
                let want = product_reference(&x, m, &w);
                let got = y.flatten_all()?.to_vec1::<f32>()?;
                let tol = sum_tolerance(k) as f64;
                let err = max_rel_to(&got, &want);
                assert!(
                    err <= tol,
                    "{bl:?} ({m}, {n}, {k}): error {err:e} > {tol:e}"
                );
            }
        }
        // a 3-D input and a strided (transposed) one
        let (n, k) = (40, 96);
        let w = PackedBf16::from_rows(&random(n * k), n, k);
        let x3 = Tensor::from_vec(random(2 * 5 * k), (2, 5, k), &Device::Cpu)?;
        let y3 = linear(&x3, &w)?;
        assert_eq!(y3.dims(), [2, 5, n]);
        let flat = linear(&x3.reshape((10, k))?, &w)?;
        assert_eq!(
            y3.flatten_all()?.to_vec1::<f32>()?,
            flat.flatten_all()?.to_vec1::<f32>()?
        );
        let xt = Tensor::from_vec(random(k * 6), (k, 6), &Device::Cpu)?.t()?;
        let yt = linear(&xt, &w)?;
        let yc = linear(&xt.contiguous()?, &w)?;
        assert_eq!(
            yt.flatten_all()?.to_vec1::<f32>()?,
            yc.flatten_all()?.to_vec1::<f32>()?
        );
        Ok(())
    }

    /// Stacking equals packing the stacked rows, aligned parts (panels concatenated) and
    /// unaligned ones (packed again) alike; differing `in` or an empty list is `None`.
    #[test]
    fn stacking_equals_packing_the_stacked_rows() {
        let k = 35;
        for ns in [[16, 32, 5], [7, 16, 9]] {
            let rows: Vec<Vec<f32>> = ns.iter().map(|&n| random(n * k)).collect();
            let parts: Vec<PackedBf16> = rows
                .iter()
                .zip(ns)
                .map(|(r, n)| PackedBf16::from_rows(r, n, k))
                .collect();
            let stacked = PackedBf16::stack(&parts.iter().collect::<Vec<_>>()).expect("stack");
            let all: Vec<f32> = rows.concat();
            let want = PackedBf16::from_rows(&all, ns.iter().sum(), k);
            assert_eq!(stacked.dims(), want.dims());
            assert_eq!(&*stacked.panels, &*want.panels, "{ns:?}");
        }
        let a = PackedBf16::from_rows(&random(16 * 4), 16, 4);
        let b = PackedBf16::from_rows(&random(16 * 6), 16, 6);
        assert!(PackedBf16::stack(&[&a, &b]).is_none());
        assert!(PackedBf16::stack(&[]).is_none());
    }

    /// AMX first where it runs, then the AVX-512 BF16 kernel, then candle's matmul; `dot`
    /// skips AMX, `candle` takes candle's; an unknown name is an error naming the choices.
    #[test]
    fn the_kernel_choice_follows_the_cpu_and_the_variable() {
        use Bf16Kernel::*;
        let choose = |asked: &str, amx, dot| Bf16Kernel::choose(asked, amx, dot);
        assert_eq!(choose("", true, true), Ok(Amx));
        assert_eq!(choose("", false, true), Ok(Dot));
        assert_eq!(choose("", false, false), Ok(Candle));
        assert_eq!(choose("AMX", false, true), Ok(Dot));
        assert_eq!(choose("dot", true, true), Ok(Dot));
        assert_eq!(choose("dot", true, false), Ok(Candle));
        assert_eq!(choose("candle", true, true), Ok(Candle));
        let e = choose("avx", true, true).expect_err("unknown");
        assert!(
            e.contains("`avx`") && e.contains("amx, dot or candle"),
            "{e}"
        );
    }

    /// A mis-sized, non-f32 or empty input is an error or an empty result, never a panic;
    /// a blocking the tile cannot hold is an error.
    #[test]
    fn misfits_are_errors() -> Result<()> {
        let w = PackedBf16::from_rows(&random(16 * 8), 16, 8);
        let wrong = Tensor::zeros((2, 9), DType::F32, &Device::Cpu)?;
        assert!(linear(&wrong, &w).is_err());
        let bf = Tensor::zeros((2, 8), DType::BF16, &Device::Cpu)?;
        assert!(linear(&bf, &w).is_err());
        let empty = Tensor::zeros((0, 8), DType::F32, &Device::Cpu)?;
        assert_eq!(linear(&empty, &w)?.dims(), [0, 16]);
        if has_bf16_dot() {
            let mut bl = Blocking::default_for(Isa::Avx512);
            bl.mr = 15;
            let x = Tensor::zeros((2, 8), DType::F32, &Device::Cpu)?;
            let err = linear_with(&x, &w, &bl)
                .expect_err("15-row tile")
                .to_string();
            assert!(err.contains("does not fit"), "{err}");
        }
        Ok(())
    }
}
