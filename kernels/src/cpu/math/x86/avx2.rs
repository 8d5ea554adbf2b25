//! Vector math (exp, max, SiLU) under AVX2 + FMA (8 f32 lanes).

use super::*;

/// Eight lanes of [`super::super::exp`] (also the AVX2 attention tile's,
/// [`super::super::super::attention::key_major`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    let flush = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LO));
    let x = _mm256_min_ps(x, _mm256_set1_ps(HI));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(LOG2E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(P[0]);
    for c in &P[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0));
    // 2^n as two factors so that n = 128 (x = HI) stays finite
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_min_epi32(ni, _mm256_set1_epi32(127));
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    let y = _mm256_mul_ps(_mm256_mul_ps(e, s1), s2);
    _mm256_andnot_ps(flush, y)
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_shifted_sum(xs: &mut [f32], shift: f32) -> f32 {
    let s = _mm256_set1_ps(shift);
    let mut acc = _mm256_setzero_ps();
    let mut chunks = xs.chunks_exact_mut(8);
    for c in &mut chunks {
        let y = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), s));
        _mm256_storeu_ps(c.as_mut_ptr(), y);
        acc = _mm256_add_ps(acc, y);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    let mut sum: f32 = lanes.iter().sum();
    for x in chunks.into_remainder() {
        *x = super::super::exp(*x - shift);
        sum += *x;
    }
    sum
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn max(xs: &[f32]) -> f32 {
    // `_mm256_max_ps(x, acc)` returns `acc` where `x` is NaN: NaNs are skipped, as
    // `f32::max` skips them
    let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    let mut blocks = xs.chunks_exact(32);
    for b in &mut blocks {
        for (j, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_max_ps(_mm256_loadu_ps(b.as_ptr().add(8 * j)), *acc);
        }
    }
    let m = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    lanes
        .iter()
        .chain(blocks.remainder())
        .fold(f32::NEG_INFINITY, |a, &x| a.max(x))
}

/// [`super::super::silu_mul_rows16`] under AVX2: [`silu_mul`]'s lanes, two halves per run.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul_rows16_256(
    rows: usize,
    (gate, gs): (*const f32, usize),
    (up, us): (*const f32, usize),
    (out, os): (*mut f32, usize),
) {
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    for r in 0..rows {
        for h in [0, 8] {
            let g = _mm256_loadu_ps(gate.add(r * gs + h));
            let u = _mm256_loadu_ps(up.add(r * us + h));
            let d = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g)));
            _mm256_storeu_ps(out.add(r * os + h), _mm256_mul_ps(_mm256_div_ps(g, d), u));
        }
    }
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let full = n - n % 8;
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let mut i = 0;
    while i < full {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        let d = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g)));
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm256_mul_ps(_mm256_div_ps(g, d), u),
        );
        i += 8;
    }
    for j in full..n {
        out[j] = gate[j] / (1.0 + super::super::exp(-gate[j])) * up[j];
    }
}
