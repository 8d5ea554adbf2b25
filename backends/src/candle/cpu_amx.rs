//! f32 linear layers through Intel AMX bf16 tiles, at f32 accuracy: `y = x Wᵀ` with every f32
//! operand split exactly into three bf16 parts and the six products that matter at f32
//! precision summed by `tdpbf16ps` in f32 ("bf16 × 6").
//!
//! Why: on a Xeon with AMX (Sapphire Rapids and later) one core runs bf16 tile products at
//! ~13× its AVX-512 f32 FMA rate (measured on the lent Xeon with `scripts/cpu-real/peak.c`:
//! 2,218 against 167 GFLOP/s), so six bf16 products cost less than half of one f32 product.
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
//! `FORKSCORE_CPU_GEMM=packed` keeps the AVX-512 f32 kernel of [`super::cpu_gemm`] instead.
//! The tests hold this kernel to candle's matmul (where AMX runs) and the split arithmetic to
//! an f64 reference (everywhere).

use candle_core::{DType, Device, Result, Storage, Tensor};

use super::cpu_aligned::Aligned;
use super::cpu_gemm::NR;

/// `k` per tile step: 32 bf16, one 64-byte tile row.
const KSTEP: usize = 32;
/// Rows of activations per block: their planes (3 × 128 × k bf16) stay in L2 while the
/// thread's panel pairs pass over them.
#[cfg_attr(
    not(all(target_arch = "x86_64", target_os = "linux")),
    allow(dead_code)
)]
const MC: usize = 128;

/// `v` as bf16 bits, rounded to nearest even; a finite `v` that would round to infinity is
/// truncated instead (so `v − hi` stays finite), and NaN stays NaN.
fn bf16_bits(v: f32) -> u16 {
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

fn bf16_value(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
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
/// columns of a ragged last panel).
#[derive(Debug, Clone)]
pub(crate) struct AmxWeight {
    n: usize,
    k: usize,
    kp: usize,
    planes: [Aligned<u16>; 3],
}

impl AmxWeight {
    /// Split `w (n, k)` (any float dtype, any device: read as f32 on the host).
    pub fn pack(w: &Tensor) -> Result<Self> {
        let (n, k) = w.dims2()?;
        let host = w
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .contiguous()?;
        let (st, l) = host.storage_and_layout();
        let Storage::Cpu(c) = &*st else {
            candle_core::bail!("amx weight: the host copy is not on the CPU");
        };
        let rows = &c.as_slice::<f32>()?[l.start_offset()..][..n * k];
        Ok(Self::from_rows(rows, n, k))
    }

    /// Split row-major `w (n, k)`, on the rayon threads (a panel each).
    pub fn from_rows(w: &[f32], n: usize, k: usize) -> Self {
        use rayon::prelude::*;
        let kp = k.next_multiple_of(KSTEP);
        let panel = kp * NR;
        let len = n.div_ceil(NR) * panel;
        let mut planes = [
            Aligned::zeroed(len),
            Aligned::zeroed(len),
            Aligned::zeroed(len),
        ];
        let [h, m, l] = &mut planes;
        h.par_chunks_mut(panel.max(1))
            .zip(m.par_chunks_mut(panel.max(1)))
            .zip(l.par_chunks_mut(panel.max(1)))
            .enumerate()
            .for_each(|(p, ((h, m), l))| {
                for c in 0..NR.min(n - p * NR) {
                    let row = &w[(p * NR + c) * k..][..k];
                    for (kk, &v) in row.iter().enumerate() {
                        let at = ((kk / 2) * NR + c) * 2 + kk % 2;
                        [h[at], m[at], l[at]] = split(v);
                    }
                }
            });
        AmxWeight { n, k, kp, planes }
    }

    /// `(out, in)`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The rows of `W`, `(n, k)` row-major: the values split (exactly, see [`split`]).
    pub fn rows(&self) -> Vec<f32> {
        let (n, k, kp) = (self.n, self.k, self.kp);
        let mut w = vec![0f32; n * k];
        for (r, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            let base = (r / NR) * kp * NR;
            for (kk, v) in row.iter_mut().enumerate() {
                let at = base + ((kk / 2) * NR + r % NR) * 2 + kk % 2;
                let [h, m, l] = &self.planes;
                *v = bf16_value(h[at]) + (bf16_value(m[at]) + bf16_value(l[at]));
            }
        }
        w
    }

    /// The weights stacked along `out` (`[a; b; …]`), all with one `in`; `None` for an empty
    /// list or differing `in`. Planes are concatenated as they are when every part but the
    /// last has a multiple of 16 rows; otherwise the rows are split again.
    pub fn stack(parts: &[&AmxWeight]) -> Option<Self> {
        let k = parts.first()?.k;
        if parts.iter().any(|p| p.k != k) {
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
                kp: parts[0].kp,
                planes: [plane(0), plane(1), plane(2)],
            });
        }
        let rows: Vec<f32> = parts.iter().flat_map(|p| p.rows()).collect();
        Some(Self::from_rows(&rows, n, k))
    }
}

/// The f32 product the kernel computes, in plain Rust: per output, the six kept part products
/// summed in f64 (the tests hold the split arithmetic to an exact product with it, and the
/// kernel to candle's matmul).
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
                s += v(0, 0) + v(0, 1) + v(1, 0) + v(0, 2) + v(2, 0) + v(1, 1);
            }
            y[r * n + c] = s;
        }
    }
    y
}

/// Whether the AMX kernel runs in this process: x86-64 Linux, CPUID AMX-TILE + AMX-BF16,
/// the OS saving the tile state (XCR0 bits 17–18), and the kernel granting it to this process.
/// Detected (and the permission asked for) once.
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    // SAFETY: cpuid is present on every x86-64 CPU; xgetbv(0) only after CPUID reports OSXSAVE
    unsafe {
        let l7 = __cpuid_count(7, 0);
        let (amx_bf16, amx_tile) = (l7.edx & (1 << 22) != 0, l7.edx & (1 << 24) != 0);
        let osxsave = __cpuid_count(1, 0).ecx & (1 << 27) != 0;
        if !(amx_bf16 && amx_tile && osxsave) {
            return false;
        }
        if _xgetbv(0) & (0b11 << 17) != (0b11 << 17) {
            return false;
        }
        // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA
        libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 through AMX. Errors (never panics) on a non-f32, non-CPU or
/// mis-sized `x`, or where the kernel does not run ([`available`]).
pub(crate) fn linear(x: &Tensor, w: &AmxWeight) -> Result<Tensor> {
    let (n, k) = (w.n, w.k);
    if !x.device().is_cpu() || x.dtype() != DType::F32 || x.dims().last() != Some(&k) {
        candle_core::bail!(
            "amx linear: input {:?} {:?} on {:?} does not fit a ({n}, {k}) f32 CPU weight",
            x.dims(),
            x.dtype(),
            x.device()
        );
    }
    let m = x.elem_count() / k.max(1);
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    if m == 0 || n == 0 || k == 0 {
        return Tensor::zeros(dims, DType::F32, &Device::Cpu);
    }
    if !available() {
        candle_core::bail!("amx linear: this CPU or OS does not run AMX bf16 tiles");
    }
    let x = x.contiguous()?;
    let (xs, xl) = x.storage_and_layout();
    let Storage::Cpu(xc) = &*xs else {
        candle_core::bail!("amx linear: input is not on the CPU");
    };
    let xd = &xc.as_slice::<f32>()?[xl.start_offset()..][..m * k];
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    let y = tiles::product(xd, m, w);
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    let y: Vec<f32> = unreachable!("available() is false here ({})", xd.len());
    drop(xs);
    Tensor::from_vec(y, dims, &Device::Cpu)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles {
    use std::arch::asm;

    use rayon::prelude::*;

    use super::{split, Aligned, AmxWeight, KSTEP, MC, NR};

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
    macro_rules! dot {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
                options(nostack, nomem)
            )
        };
    }

    /// The six part products of one 32-`k` step into C tiles 0–3 (rows `a·[0|1]` × panels
    /// `b·[0|1]`): `a[part][i]` points at A tile `i` of a part (row stride `sa` bytes),
    /// `b[part][j]` at B tile `j` (64-byte rows).
    #[inline(always)]
    unsafe fn step(a: &[[*const u16; 2]; 3], sa: usize, b: &[[*const u16; 2]; 3]) {
        let sb = 64usize;
        macro_rules! quad {
            () => {
                dot!(0, 4, 6);
                dot!(1, 4, 7);
                dot!(2, 5, 6);
                dot!(3, 5, 7);
            };
        }
        // B = hi: A hi, mid, lo
        load!(6, b[0][0], sb);
        load!(7, b[0][1], sb);
        for part in a {
            load!(4, part[0], sa);
            load!(5, part[1], sa);
            quad!();
        }
        // B = mid: A hi, mid
        load!(6, b[1][0], sb);
        load!(7, b[1][1], sb);
        for part in &a[..2] {
            load!(4, part[0], sa);
            load!(5, part[1], sa);
            quad!();
        }
        // B = lo: A hi
        load!(6, b[2][0], sb);
        load!(7, b[2][1], sb);
        load!(4, a[0][0], sa);
        load!(5, a[0][1], sa);
        quad!();
    }

    /// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panel pairs each).
    pub(super) fn product(x: &[f32], m: usize, w: &AmxWeight) -> Vec<f32> {
        let (n, k, kp) = (w.n, w.k, w.kp);
        let mp = m.next_multiple_of(2 * 16);
        // (3, mp, kp): the activations' parts, zero-padded
        let mut a = Aligned::<u16>::zeroed(3 * mp * kp);
        {
            let (h, rest) = a.split_at_mut(mp * kp);
            let (md, l) = rest.split_at_mut(mp * kp);
            h.par_chunks_mut(kp)
                .zip(md.par_chunks_mut(kp))
                .zip(l.par_chunks_mut(kp))
                .take(m)
                .enumerate()
                .for_each(|(r, ((h, md), l))| {
                    for (kk, &v) in x[r * k..][..k].iter().enumerate() {
                        [h[kk], md[kk], l[kk]] = split(v);
                    }
                });
        }
        let panels = n.div_ceil(NR);
        let threads = rayon::current_num_threads().clamp(1, panels);
        let per = panels.div_ceil(threads).next_multiple_of(2);
        let zero = Aligned::<u16>::zeroed(kp * NR);
        let mut y: Vec<f32> = Vec::with_capacity(m * n);
        let y_addr = y.as_mut_ptr() as usize;
        (0..panels)
            .step_by(per)
            .collect::<Vec<_>>()
            .into_par_iter()
            .for_each(|p0| {
                let p1 = (p0 + per).min(panels);
                // SAFETY: AMX runs here (the caller checked `available`); `a` holds 3·mp·kp and
                // each plane ⌈n/16⌉·kp·16 elements, `zero` kp·16, as `run` reads them; `y` has
                // capacity m·n and the runs of panels write disjoint columns.
                unsafe { run(&a, mp, m, w, &zero, p0, p1, y_addr as *mut f32) };
            });
        // SAFETY: every column of every row was written (the panel runs cover 0..n).
        unsafe { y.set_len(m * n) };
        y
    }

    /// Panels `p0..p1` of the product into `y (m, n)`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        a: &[u16],
        mp: usize,
        m: usize,
        w: &AmxWeight,
        zero: &[u16],
        p0: usize,
        p1: usize,
        y: *mut f32,
    ) {
        let (n, kp) = (w.n, w.kp);
        let cfg = config();
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        let sa = kp * 2; // A-tile row stride, bytes
        let mut scratch = [0f32; 16 * 16];
        let plane = |part: usize| w.planes[part].as_ptr();
        for rb in (0..mp).step_by(MC) {
            for p in (p0..p1).step_by(2) {
                // a pair of panels; an odd last one pairs with zeros
                let q = p + 1;
                let bp = |part: usize, panel: usize, ks: usize| -> *const u16 {
                    match panel < p1 {
                        true => plane(part).add(panel * kp * NR + ks * KSTEP * NR),
                        false => zero.as_ptr().add(ks * KSTEP * NR),
                    }
                };
                for r in (rb..(rb + MC).min(mp)).step_by(32) {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                    for ks in 0..kp / KSTEP {
                        let ap = |part: usize, i: usize| -> *const u16 {
                            a.as_ptr()
                                .add(part * mp * kp + (r + 16 * i) * kp + ks * KSTEP)
                        };
                        let at = [
                            [ap(0, 0), ap(0, 1)],
                            [ap(1, 0), ap(1, 1)],
                            [ap(2, 0), ap(2, 1)],
                        ];
                        let bt = [
                            [bp(0, p, ks), bp(0, q, ks)],
                            [bp(1, p, ks), bp(1, q, ks)],
                            [bp(2, p, ks), bp(2, q, ks)],
                        ];
                        step(&at, sa, &bt);
                    }
                    // C tile (i, j): rows r + 16i, columns 16·(p + j)
                    for (t, (i, j)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
                        let (row0, col0) = (r + 16 * i, (p + j) * NR);
                        if row0 >= m || p + j >= p1 {
                            continue;
                        }
                        let (rows, cols) = ((m - row0).min(16), (n - col0).min(NR));
                        let direct = rows == 16 && cols == NR;
                        let (dst, stride) = match direct {
                            true => (y.add(row0 * n + col0), n * 4),
                            false => (scratch.as_mut_ptr(), 64),
                        };
                        match t {
                            0 => store!(0, dst, stride),
                            1 => store!(1, dst, stride),
                            2 => store!(2, dst, stride),
                            _ => store!(3, dst, stride),
                        }
                        if !direct {
                            for rr in 0..rows {
                                std::ptr::copy_nonoverlapping(
                                    scratch.as_ptr().add(rr * 16),
                                    y.add((row0 + rr) * n + col0),
                                    cols,
                                );
                            }
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
        for (xdims, n) in [
            (vec![37usize, 96], 130usize),
            (vec![2, 19, 64], 48),
            (vec![1, 1, 896], 7),
            (vec![150, 300], 33),
            (vec![7, 40], 50),
            (vec![MC + 45, 257], 16 * 5),
            (vec![13, 4864], 40),
            (vec![64, 32], 16),
        ] {
            let k = *xdims.last().unwrap();
            let x = Tensor::randn(0f32, 1.0, xdims.clone(), &dev)?;
            let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let p = AmxWeight::pack(&w)?;
            let got = linear(&x, &p)?;
            let want = x.broadcast_matmul(&w.t()?)?;
            assert_eq!(got.dims(), want.dims());
            let d = (&got - &want)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?;
            let s = want
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?
                .max(1.0);
            assert!(d / s <= 2e-6, "{xdims:?} x ({n}, {k}): {:e}", d / s);
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
