//! Vectorised f32 `exp` (and row maximum) for the CPU kernels that spend their time in it: the
//! softmax of [`super::attention`] and the SiLU of the backends' CPU SwiGLU pass
//! (`forkscore_backends::candle::layers::swiglu`) and of the integer kernels' fused tiles.
//!
//! libm's `expf` is scalar (a call per element: 5 % of a 28-field CPU decision's samples went
//! to it before this module). Here `e^x` is the classic range reduction
//! `x = n·ln2 + r, |r| ≤ ln2/2` (ln2 split in two for an exact `n·ln2`), a degree-6 polynomial
//! for `e^r` and `2^n` put straight into the exponent bits. The same formula runs sixteen lanes
//! at a time under AVX-512, eight under AVX2 + FMA (detected at run time) and one element at a
//! time elsewhere, so they differ only by FMA rounding. Accuracy: within 2 ulp of the exact value on the tested
//! range; inputs below -87.3 give exactly 0 (so a masked `-inf` score contributes nothing),
//! inputs above 88.7 give `f32::MAX`.

#[cfg(target_arch = "x86_64")]
use super::isa::Isa;

/// Largest input with a finite result (just under ln(f32::MAX)).
const HI: f32 = 88.7;
/// Smallest input with a normal result; below it the result is flushed to 0.
const LO: f32 = -87.3;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split into a part exact in f32 times any `n` used here, and the rest.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor-like coefficients of `e^r` on `|r| ≤ ln2/2` (Cephes `expf`): `1 + r + r²·(P0 r⁴ + … + P5)`.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^x`, the scalar form of the vector kernels (same reduction and polynomial).
#[inline]
pub fn exp(x: f32) -> f32 {
    if x < LO {
        return 0.0;
    }
    let x = x.min(HI);
    let n = (x * LOG2E).round();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + *c;
    }
    let e = (p * r * r) + r + 1.0;
    // 2^n for n in [-126, 128]: n = 128 only at x = HI, where e < 1 keeps the product finite
    let n = n as i32;
    let (n1, n2) = if n > 127 { (127, n - 127) } else { (n, 0) };
    e * f32::from_bits(((n1 + 127) as u32) << 23) * f32::from_bits(((n2 + 127) as u32) << 23)
}

/// `xs[i] = e^(xs[i] - shift)` in place; returns the sum of the results.
pub fn exp_shifted_sum(xs: &mut [f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if Isa::chosen().is_some() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { x86::exp_shifted_sum(xs, shift) };
    }
    let mut sum = 0.0;
    for x in xs.iter_mut() {
        *x = exp(*x - shift);
        sum += *x;
    }
    sum
}

/// The largest element of `xs` (`-inf` for an empty slice; NaNs are skipped), four 8-lane
/// registers at a time under AVX2 (a scalar fold is one dependent `max` per element: the
/// softmax's row maximum was a third of the attention kernel's time with it).
pub fn max(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if Isa::chosen().is_some() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { x86::max(xs) };
    }
    xs.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x))
}

/// `out[i] = silu(gate[i]) · up[i]` with `silu(v) = v / (1 + e^-v)`. The three slices have
/// one length (the caller's rows).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    debug_assert!(gate.len() == up.len() && up.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    match Isa::chosen() {
        // SAFETY: the CPU has AVX-512 F (checked at run time).
        Some(Isa::Avx512) => return unsafe { x86::silu_mul512(gate, up, out) },
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        Some(Isa::Avx2 | Isa::AvxVnni) => return unsafe { x86::silu_mul(gate, up, out) },
        None => {}
    }
    for ((y, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *y = g / (1.0 + exp(-g)) * u;
    }
}

/// [`silu_mul`] on `rows` runs of 16: run `r` reads `gate[r·gs..][..16]` and `up[r·us..][..16]`
/// and writes `out[r·os..][..16]`, each element exactly as [`silu_mul`] computes it on a whole
/// row (the same vector lanes: 16 under AVX-512, two 8-lane halves under AVX2; tested). For
/// the packed kernels' SwiGLU, whose tiles hold 16 gate and 16 up columns: one call per tile
/// instead of one per row.
///
/// # Safety
/// Every addressed run is in bounds; the output runs do not overlap the inputs.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn silu_mul_rows16(
    rows: usize,
    (gate, gs): (*const f32, usize),
    (up, us): (*const f32, usize),
    (out, os): (*mut f32, usize),
) {
    #[cfg(target_arch = "x86_64")]
    match Isa::chosen() {
        Some(Isa::Avx512) => {
            return x86::silu_mul_rows16_512(rows, (gate, gs), (up, us), (out, os))
        }
        Some(Isa::Avx2 | Isa::AvxVnni) => {
            return x86::silu_mul_rows16_256(rows, (gate, gs), (up, us), (out, os))
        }
        None => {}
    }
    for r in 0..rows {
        let (g, u) = (
            std::slice::from_raw_parts(gate.add(r * gs), 16),
            std::slice::from_raw_parts(up.add(r * us), 16),
        );
        silu_mul(g, u, std::slice::from_raw_parts_mut(out.add(r * os), 16));
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// Within 2 ulp of the exact exponential (f64) over the whole normal range, the vector and
    /// scalar forms alike; flushed to exactly 0 below the range and for `-inf`.
    #[test]
    fn exp_is_within_two_ulp_and_flushes_masked_scores() {
        let xs: Vec<f32> = (0..200_001)
            .map(|i| LO + (HI - LO) * i as f32 / 200_000.0)
            .chain([0.0, -0.0, 1.0, -1.0, 1e-8, -1e-8, 0.5, 88.0, -87.0])
            .collect();
        let mut v = xs.clone();
        exp_shifted_sum(&mut v, 0.0);
        for (&x, &got) in xs.iter().zip(&v) {
            let want = (x as f64).exp() as f32;
            assert!(ulps(got, want) <= 2, "vector exp({x}) = {got}, want {want}");
            let s = exp(x);
            assert!(ulps(s, want) <= 2, "scalar exp({x}) = {s}, want {want}");
        }
        let mut masked = vec![
            f32::NEG_INFINITY,
            -100.0,
            -87.4,
            -1e30,
            0.0,
            f32::NEG_INFINITY,
            -88.0,
            -90.0,
            -200.0,
        ];
        let sum = exp_shifted_sum(&mut masked, 0.0);
        assert_eq!(masked, [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(sum, 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(1000.0).is_finite() && exp(HI).is_finite());
    }

    /// The 16-lane form (where the CPU has AVX-512) is within 2 ulp of the exact exponential on
    /// the same range and flushes the same masked scores to 0.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp16_is_within_two_ulp_and_flushes_masked_scores() {
        if Isa::chosen() != Some(Isa::Avx512) {
            return;
        }
        let xs: Vec<f32> = (0..200_000)
            .map(|i| LO + (HI - LO) * i as f32 / 199_999.0)
            .chain([0.0, -0.0, 1.0, -1.0, 1e-8, -1e-8, 0.5, 88.0, -87.0])
            .chain([f32::NEG_INFINITY, -100.0, -87.4, -1e30, 1000.0, HI, -90.0])
            .collect();
        let mut got = vec![0f32; xs.len().next_multiple_of(16)];
        for (src, dst) in xs.chunks(16).zip(got.chunks_mut(16)) {
            let mut lanes = [0f32; 16];
            lanes[..src.len()].copy_from_slice(src);
            // SAFETY: the CPU has AVX-512 F (checked above); both arrays hold 16 floats.
            unsafe {
                use std::arch::x86_64::*;
                let y = x86::exp16(_mm512_loadu_ps(lanes.as_ptr()));
                _mm512_storeu_ps(dst.as_mut_ptr(), y);
            }
        }
        for (&x, &y) in xs.iter().zip(&got) {
            if x < LO {
                assert_eq!(y, 0.0, "exp16({x}) = {y}, want 0 (flushed)");
            } else if x >= HI {
                assert!(y.is_finite() && y > 1e38, "exp16({x}) = {y}");
            } else {
                let want = (x as f64).exp() as f32;
                assert!(ulps(y, want) <= 2, "exp16({x}) = {y}, want {want}");
            }
        }
    }

    /// The shifted sum is the sum of the shifted exponentials, on a ragged length.
    #[test]
    fn exp_shifted_sum_returns_the_sum() {
        let mut xs: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let orig = xs.clone();
        let sum = exp_shifted_sum(&mut xs, 1.5);
        let want: f64 = orig.iter().map(|&x| ((x - 1.5) as f64).exp()).sum();
        assert!(
            ((sum as f64) - want).abs() <= 1e-5 * want,
            "{sum} vs {want}"
        );
    }

    /// The vector maximum equals the scalar fold on every length around the 32-element blocks,
    /// wherever the largest element sits, with NaNs skipped and `-inf` for nothing.
    #[test]
    fn max_equals_the_scalar_fold() {
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        for n in [1usize, 7, 8, 31, 32, 33, 64, 95, 1000] {
            for at in [0, n / 2, n - 1] {
                let mut xs: Vec<f32> = (0..n).map(|i| -((i * 7919 % 113) as f32)).collect();
                xs[at] = 3.5;
                let want = xs.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
                assert_eq!(max(&xs), want, "n {n}, max at {at}");
                xs[n / 3] = f32::NAN;
                if n / 3 != at {
                    assert_eq!(max(&xs), 3.5, "n {n}, a NaN at {}", n / 3);
                }
            }
        }
        assert_eq!(max(&[f32::NEG_INFINITY; 40]), f32::NEG_INFINITY);
    }

    /// SiLU · up equals candle's formula (`v / (1 + e^-v)` with libm's exp) to 4e-7 relative,
    /// over large, small and ragged inputs.
    #[test]
    fn silu_mul_matches_the_libm_formula() {
        let g: Vec<f32> = (0..1003)
            .map(|i| (i as f32 - 500.0) * 0.05)
            .chain([-120.0, 120.0, 0.0])
            .collect();
        let u: Vec<f32> = (0..g.len()).map(|i| 1.0 + (i as f32 * 0.1).cos()).collect();
        // the chosen path, and on x86 every vector level the CPU has
        let mut outs = vec![vec![0f32; g.len()]];
        silu_mul(&g, &u, &mut outs[0]);
        #[cfg(target_arch = "x86_64")]
        for &level in Isa::supported() {
            let mut out = vec![0f32; g.len()];
            // SAFETY: the CPU has `level` (listed as supported).
            unsafe {
                match level {
                    Isa::Avx2 | Isa::AvxVnni => x86::silu_mul(&g, &u, &mut out),
                    Isa::Avx512 => x86::silu_mul512(&g, &u, &mut out),
                }
            }
            outs.push(out);
        }
        for out in &outs {
            for ((&g, &u), &y) in g.iter().zip(&u).zip(out) {
                let want = g / (1.0 + (-g).exp()) * u;
                assert!(
                    (y - want).abs() <= 4e-7 * want.abs() + 1e-30,
                    "silu({g})·{u} = {y}, want {want}"
                );
            }
        }
    }

    /// Runs of 16 give every element exactly what the whole-row form gives (the packed kernels'
    /// SwiGLU is held bit-equal to the pass with it), strided rows in and out, at every vector
    /// level the CPU has.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn silu_mul_in_runs_of_16_equals_whole_rows() {
        let (rows, f) = (7usize, 64usize);
        let g: Vec<f32> = (0..rows * 2 * f)
            .map(|i| ((i * 37 % 301) as f32 - 150.0) * 0.07)
            .collect();
        let u: Vec<f32> = (0..rows * 2 * f)
            .map(|i| 1.0 + (i as f32 * 0.13).sin())
            .collect();
        for &level in Isa::supported() {
            // whole rows of f (the pass), and runs of 16 read with a row stride of 2f
            let mut want = vec![0f32; rows * f];
            let mut got = vec![0f32; rows * f];
            for r in 0..rows {
                let (gr, ur) = (&g[r * 2 * f..][..f], &u[r * 2 * f..][..f]);
                // SAFETY: the CPU has `level`; the runs below are in bounds.
                unsafe {
                    match level {
                        Isa::Avx2 | Isa::AvxVnni => x86::silu_mul(gr, ur, &mut want[r * f..][..f]),
                        Isa::Avx512 => x86::silu_mul512(gr, ur, &mut want[r * f..][..f]),
                    }
                }
            }
            for c in (0..f).step_by(16) {
                let args = (
                    (g[c..].as_ptr(), 2 * f),
                    (u[c..].as_ptr(), 2 * f),
                    (got[c..].as_mut_ptr(), f),
                );
                // SAFETY: as above
                unsafe {
                    match level {
                        Isa::Avx2 | Isa::AvxVnni => {
                            x86::silu_mul_rows16_256(rows, args.0, args.1, args.2)
                        }
                        Isa::Avx512 => x86::silu_mul_rows16_512(rows, args.0, args.1, args.2),
                    }
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{level:?}");
        }
    }
}
