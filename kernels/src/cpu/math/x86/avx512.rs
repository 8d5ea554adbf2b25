//! Vector math (exp, max, SiLU) under AVX-512 F (16 f32 lanes).

use super::*;

/// Sixteen lanes of [`super::super::exp`] (AVX-512 F), for the AVX-512 attention tile
/// ([`super::super::super::attention::key_major`]).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
    let flush = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(LO));
    let x = _mm512_min_ps(x, _mm512_set1_ps(HI));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(P[0]);
    for c in &P[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let e = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
    // 2^n as two factors so that n = 128 (x = HI) stays finite
    let ni = _mm512_cvtps_epi32(n);
    let n1 = _mm512_min_epi32(ni, _mm512_set1_epi32(127));
    let n2 = _mm512_sub_epi32(ni, n1);
    let bias = _mm512_set1_epi32(127);
    let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n1, bias)));
    let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n2, bias)));
    let y = _mm512_mul_ps(_mm512_mul_ps(e, s1), s2);
    _mm512_maskz_mov_ps(!flush, y)
}

/// [`silu_mul`] sixteen lanes at a time ([`exp16`]), the ragged tail in masked lanes.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu_mul512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let w = (n - i).min(16);
        let m: __mmask16 = if w == 16 { !0 } else { (1u16 << w) - 1 };
        let g = _mm512_maskz_loadu_ps(m, gate.as_ptr().add(i));
        let u = _mm512_maskz_loadu_ps(m, up.as_ptr().add(i));
        let d = _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        _mm512_mask_storeu_ps(
            out.as_mut_ptr().add(i),
            m,
            _mm512_mul_ps(_mm512_div_ps(g, d), u),
        );
        i += w;
    }
}

/// [`super::super::silu_mul_rows16`] under AVX-512: [`silu_mul512`]'s lanes, inlined per run.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu_mul_rows16_512(
    rows: usize,
    (gate, gs): (*const f32, usize),
    (up, us): (*const f32, usize),
    (out, os): (*mut f32, usize),
) {
    let one = _mm512_set1_ps(1.0);
    for r in 0..rows {
        let g = _mm512_loadu_ps(gate.add(r * gs));
        let u = _mm512_loadu_ps(up.add(r * us));
        let d = _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
        _mm512_storeu_ps(out.add(r * os), _mm512_mul_ps(_mm512_div_ps(g, d), u));
    }
}
