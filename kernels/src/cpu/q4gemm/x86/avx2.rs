//! The 4-bit W4A8 tiles under AVX2 + FMA (u8 × i8 products as 16-bit multiply-adds, 8 lanes).

use super::*;

/// AVX2: rows `0..R` × one panel over `blocks` blocks. `u` / `sx` / `ss`: the row group's
/// units, scales and sums; `w` / `wa` / `wb`: the panel's values, `A` and `B`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_avx2<const R: usize>(
    blocks: usize,
    u: *const u32,
    sx: *const f32,
    ss: *const f32,
    w: *const u8,
    wa: *const f32,
    wb: *const f32,
    out: &mut Tile,
) {
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut f = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ub = u.add(b * UNITS * MR_AVX2);
        let wblk = w.add(b * PANEL_BLOCK);
        for g in 0..4 {
            for h in 0..2 {
                let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                let lo = _mm256_and_si256(v, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                    let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, al),
                        _mm256_maddubs_epi16(hi, ah),
                    );
                    acc[h] = _mm256_add_epi16(acc[h], p);
                }
            }
        }
        let av = [0, 8].map(|o| _mm256_loadu_ps(wa.add(b * NR + o)));
        let bv = [0, 8].map(|o| _mm256_loadu_ps(wb.add(b * NR + o)));
        for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
            let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
            for h in 0..2 {
                let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[h], ones));
                let t = _mm256_fmsub_ps(dot, av[h], _mm256_mul_ps(bv[h], s));
                f[h] = _mm256_fmadd_ps(t, dx, f[h]);
            }
        }
    }
    for (f, out) in f.iter().zip(out.iter_mut()) {
        _mm256_storeu_ps(out.as_mut_ptr(), f[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), f[1]);
    }
}
