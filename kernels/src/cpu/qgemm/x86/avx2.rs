//! The Q8_0 W8A8 tiles under AVX2 + FMA (u8 × i8 products as 16-bit multiply-adds, 8 lanes).

use super::*;

/// AVX2: rows `0..R` × one panel over `blocks` blocks. `a` / `sa`: the row group's units
/// and scales; `w` / `dw`: the panel's int8 values and scales.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_avx2<const R: usize>(
    blocks: usize,
    a: *const u32,
    sa: *const f32,
    w: *const i8,
    dw: *const f32,
    out: &mut Tile,
) {
    const UNITS: usize = BLOCK / 2;
    let mut f = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ab = a.add(b * UNITS * MR_AVX2);
        let wb = w.add(b * PANEL_BLOCK);
        for u in 0..UNITS {
            let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(u * 32) as *const __m128i));
            let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(u * 32 + 16) as *const __m128i));
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_epi32(*ab.add(u * MR_AVX2 + r) as i32);
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(av, w0));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(av, w1));
            }
        }
        let d0 = _mm256_loadu_ps(dw.add(b * NR));
        let d1 = _mm256_loadu_ps(dw.add(b * NR + 8));
        for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
            let s = _mm256_set1_ps(*sa.add(b * MR_AVX2 + r));
            f[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[0]), _mm256_mul_ps(s, d0), f[0]);
            f[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[1]), _mm256_mul_ps(s, d1), f[1]);
        }
    }
    for (f, out) in f.iter().zip(out.iter_mut()) {
        _mm256_storeu_ps(out.as_mut_ptr(), f[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), f[1]);
    }
}
