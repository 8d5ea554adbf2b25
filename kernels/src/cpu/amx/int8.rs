//! Per-channel int8 weights times per-row int8 activations on the AMX-INT8 tiles
//! (`--quantize int8`).
//!
//! Each weight row (output channel) is rounded to int8 with one f32 scale (`max |w| / 127`), once
//! at load; each activation row likewise per call ([`round_row`]). A `tdpbssd` then sums 64
//! int8 products per output and tile step exactly in i32 over the whole input width (no
//! per-block scaling inside the loop, unlike `Q8_0`'s 32-input blocks), and the output is that
//! sum as f32 times the row's scale times the column's scale. So the tiles run at the int8 rate
//! (twice the bf16 tile's multiply-adds per instruction) with the loop, blocking, stores and
//! SwiGLU of the in-place bf16 kernel ([`super::inplace`]).
//!
//! Exact where it claims to be: the i32 sums cannot overflow below 133,000 inputs (127² per
//! product), and the kernel equals [`product_reference`]'s plain-Rust sums bit for bit (tested
//! where AMX-INT8 runs). How close the rounding stays to f32 is the model-level question the
//! backends' tests and the CPU report answer (labels and |Δp| against f32).

use super::Aligned;
use super::NR;

/// `k` per int8 tile step: 64 int8, one 64-byte tile row.
pub(super) const KSTEP8: usize = 64;

/// `v` rounded to int8 with one scale: `q = round_ties_even(v · 127 / max |v|)` into `out`,
/// the scale `max |v| / 127` returned (an all-zero row: scale 0, zeros; a row holding a
/// non-finite value: zeros and a non-finite scale, so its outputs are not finite either).
pub fn round_row(v: &[f32], out: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: the instructions were detected; `out` holds at least `v.len()` values
        // (checked inside)
        return unsafe { x86::round_row(v, out) };
    }
    round_row_portable(v, out)
}

/// [`round_row`] in plain Rust (the reference the vector form is tested against).
pub(super) fn round_row_portable(v: &[f32], out: &mut [i8]) -> f32 {
    let amax = v
        .iter()
        .fold(0f32, |m, x| if x.abs() > m { x.abs() } else { m });
    if v.iter().any(|x| !x.is_finite()) {
        out.iter_mut().for_each(|q| *q = 0);
        return f32::NAN;
    }
    if amax == 0.0 {
        out.iter_mut().for_each(|q| *q = 0);
        return 0.0;
    }
    let inv = 127.0 / amax;
    for (q, &x) in out.iter_mut().zip(v) {
        *q = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    amax / 127.0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::round_row_portable`] on 16 lanes: the same maximum, the same products
    /// `x · inv` rounded to nearest even by `vcvtps2dq` (the default rounding mode), the
    /// same clamp; equal values (tested).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn round_row(v: &[f32], out: &mut [i8]) -> f32 {
        assert!(
            out.len() >= v.len(),
            "round_row: {} outputs for {} values",
            out.len(),
            v.len()
        );
        let n = v.len();
        let body = n / 16 * 16;
        let (mut m, mut bad) = (_mm512_setzero_ps(), 0u16);
        let lim = _mm512_set1_ps(f32::MAX);
        for i in (0..body).step_by(16) {
            let a = _mm512_abs_ps(_mm512_loadu_ps(v.as_ptr().add(i)));
            // not (|x| <= MAX): NaN or infinity
            bad |= !_mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, lim);
            m = _mm512_max_ps(m, a);
        }
        let mut amax = _mm512_reduce_max_ps(m);
        for &x in &v[body..] {
            bad |= (!x.is_finite()) as u16;
            if x.abs() > amax {
                amax = x.abs();
            }
        }
        if bad != 0 {
            out[..n].iter_mut().for_each(|q| *q = 0);
            return f32::NAN;
        }
        if amax == 0.0 {
            out[..n].iter_mut().for_each(|q| *q = 0);
            return 0.0;
        }
        let inv = 127.0 / amax;
        let (iv, lo, hi) = (
            _mm512_set1_ps(inv),
            _mm512_set1_epi32(-127),
            _mm512_set1_epi32(127),
        );
        for i in (0..body).step_by(16) {
            let t = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v.as_ptr().add(i)), iv));
            let q = _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(t, lo), hi));
            _mm_storeu_si128(out.as_mut_ptr().add(i) as *mut __m128i, q);
        }
        for (q, &x) in out[body..n].iter_mut().zip(&v[body..]) {
            *q = (x * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        amax / 127.0
    }
}

/// A weight `W (n, k)` rounded to int8 per output row for the AMX-INT8 tiles: `plane` is
/// `(⌈n/16⌉, kp/4, 16, 4)` (the B-tile layout of `tdpbssd`: a 64-`k` step of a panel is one
/// 1 KiB tile) with `kp` = `k` rounded up to 64 (zero-padded, as are the missing columns of a
/// ragged last panel); `scales` one per output, padded with zeros to whole panels.
#[derive(Debug, Clone)]
pub struct AmxI8Weight {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) kp: usize,
    pub(super) plane: Aligned<i8>,
    pub(super) scales: Vec<f32>,
}

impl AmxI8Weight {
    /// Row-major `w (n, k)` rounded row by row ([`round_row`]) and packed, on the rayon
    /// threads (a panel each).
    pub fn quantize_rows(w: &[f32], n: usize, k: usize) -> Self {
        use rayon::prelude::*;
        let kp = k.next_multiple_of(KSTEP8);
        let panels = n.div_ceil(NR);
        let mut plane = Aligned::<i8>::zeroed(panels * kp * NR);
        let mut scales = vec![0f32; panels * NR];
        plane
            .par_chunks_mut((kp * NR).max(1))
            .zip(scales.par_chunks_mut(NR))
            .enumerate()
            .for_each(|(p, (dst, sc))| {
                let mut q = vec![0i8; k];
                for c in 0..NR.min(n - p * NR) {
                    sc[c] = round_row(&w[(p * NR + c) * k..][..k], &mut q);
                    for (kk, &v) in q.iter().enumerate() {
                        dst[(kk / 4) * NR * 4 + c * 4 + kk % 4] = v;
                    }
                }
            });
        AmxI8Weight {
            n,
            k,
            kp,
            plane,
            scales,
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The int8 value of output `r`, input `kk`.
    fn value(&self, r: usize, kk: usize) -> i8 {
        self.plane[(r / NR) * self.kp * NR + (kk / 4) * NR * 4 + (r % NR) * 4 + kk % 4]
    }

    /// The rows of `W` as the kernel sees them, `(n, k)` row-major: each int8 value times its
    /// row's scale.
    pub fn rows(&self) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let mut w = vec![0f32; n * k];
        for (r, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            for (kk, v) in row.iter_mut().enumerate() {
                *v = self.value(r, kk) as f32 * self.scales[r];
            }
        }
        w
    }

    /// The weights stacked along `out` (`[a; b; …]`), all with one `in`: their panels
    /// concatenated; `None` for an empty list, differing `in`, or a part before the last that
    /// is not whole panels (each row keeps its own scale, so nothing is rounded again).
    pub fn stack(parts: &[&AmxI8Weight]) -> Option<Self> {
        let first = parts.first()?;
        let k = first.k;
        let whole = parts[..parts.len() - 1].iter().all(|p| p.n % NR == 0);
        if !whole || parts.iter().any(|p| p.k != k) {
            return None;
        }
        let planes: Vec<&[i8]> = parts.iter().map(|p| &*p.plane).collect();
        Some(AmxI8Weight {
            n: parts.iter().map(|p| p.n).sum(),
            k,
            kp: first.kp,
            plane: Aligned::concat(&planes),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
        })
    }

    /// `gate` and `up` (`(F, k)` each, `F` a multiple of 16) as one `(2F, k)` weight whose
    /// panels alternate (gate's `p`, then up's), for the SwiGLU in the tiles; `None` where
    /// their shapes differ or `F` is not whole panels.
    pub fn gate_up(gate: &AmxI8Weight, up: &AmxI8Weight) -> Option<Self> {
        if gate.n != up.n || gate.k != up.k || gate.n % NR != 0 {
            return None;
        }
        let alternate = super::super::tile_store::alternate;
        Some(AmxI8Weight {
            n: 2 * gate.n,
            k: gate.k,
            kp: gate.kp,
            plane: alternate(&gate.plane, &up.plane, gate.kp * NR),
            scales: alternate_scales(&gate.scales, &up.scales),
        })
    }
}

/// Two weights' per-panel scales alternating, as their panels do.
fn alternate_scales(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.chunks(NR)
        .zip(b.chunks(NR))
        .flat_map(|(a, b)| a.iter().chain(b).copied())
        .collect()
}

/// `x (m, k)` rounded row by row and packed as A tiles `[row pair][step][row tile][16][64]`
/// (`m` padded to 32 rows, `k` to `kp`, with zeros), with the rows' scales (`m` of them).
pub(super) fn pack_rows(x: &[f32], m: usize, k: usize, kp: usize) -> (Aligned<i8>, Vec<f32>) {
    use rayon::prelude::*;
    let steps = kp / KSTEP8;
    let pair = steps * 2 * 16 * KSTEP8;
    let mut a = Aligned::<i8>::zeroed(m.div_ceil(32) * pair);
    let mut scales = vec![0f32; m];
    a.par_chunks_mut(pair.max(1))
        .zip(scales.par_chunks_mut(32))
        .enumerate()
        .for_each(|(rp, (dst, sc))| {
            let mut q = vec![0i8; k];
            for (rr, s) in sc.iter_mut().enumerate() {
                *s = round_row(&x[(rp * 32 + rr) * k..][..k], &mut q);
                let (i, r) = (rr / 16, rr % 16);
                for (ks, chunk) in q.chunks(KSTEP8).enumerate() {
                    let at = ks * 2 * 16 * KSTEP8 + i * 16 * KSTEP8 + r * KSTEP8;
                    dst[at..at + chunk.len()].copy_from_slice(chunk);
                }
            }
        });
    (a, scales)
}

/// What the kernel computes, in plain Rust: per output the exact i32 sum of the rounded
/// values, as f32, times the row's scale times the column's scale.
pub fn product_reference(x: &[f32], m: usize, w: &AmxI8Weight) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let mut y = vec![0f32; m * n];
    let mut q = vec![0i8; k];
    for r in 0..m {
        let sa = round_row(&x[r * k..][..k], &mut q);
        for c in 0..n {
            let sum: i32 = (0..k).map(|j| q[j] as i32 * w.value(c, j) as i32).sum();
            y[r * n + c] = sum as f32 * (sa * w.scales[c]);
        }
    }
    y
}
