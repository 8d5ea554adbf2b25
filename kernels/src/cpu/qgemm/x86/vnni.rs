//! The Q8_0 W8A8 tiles under AVX-VNNI (256-bit `vpdpbusd`: 4-way u8 × i8 dot products, 8 lanes).

use super::*;

/// AVX-VNNI: rows `0..R` × one panel over `blocks` blocks, [`tile_avx512`]'s sums on 8
/// lanes (the panel's 16 columns in two registers). `off`: the panel's offsets. With `PF`,
/// each unit prefetches its weights `pf` blocks ahead.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_vnni256<const R: usize, const PF: bool>(
    blocks: usize,
    a: *const u32,
    sa: *const f32,
    w: *const i8,
    dw: *const f32,
    off: *const i32,
    out: &mut Tile,
    pf: usize,
) {
    const UNITS: usize = BLOCK / 4;
    // the f32 sums live in `out` (12 of the 16 registers hold the block's integer sums)
    for row in out.iter_mut().take(R) {
        row[..NR].fill(0.0);
    }
    for b in 0..blocks {
        let o = [0, 8].map(|h| _mm256_loadu_si256(off.add(b * NR + h) as *const __m256i));
        let mut acc = [o; R];
        let ab = a.add(b * UNITS * MR_VNNI256);
        let wb = w.add(b * PANEL_BLOCK);
        for u in 0..UNITS {
            let w0 = _mm256_loadu_si256(wb.add(u * 64) as *const __m256i);
            let w1 = _mm256_loadu_si256(wb.add(u * 64 + 32) as *const __m256i);
            if PF {
                // a hint past the panel's end never faults, hence `wrapping_add`
                let at = wb.wrapping_add(pf * PANEL_BLOCK + u * 64);
                _mm_prefetch::<_MM_HINT_T0>(at);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_epi32(*ab.add(u * MR_VNNI256 + r) as i32);
                acc[0] = _mm256_dpbusd_avx_epi32(acc[0], av, w0);
                acc[1] = _mm256_dpbusd_avx_epi32(acc[1], av, w1);
            }
        }
        let d = [0, 8].map(|h| _mm256_loadu_ps(dw.add(b * NR + h)));
        for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let s = _mm256_set1_ps(*sa.add(b * MR_VNNI256 + r));
            for h in 0..2 {
                let at = row.as_mut_ptr().add(h * 8);
                let scale = _mm256_mul_ps(s, d[h]);
                let f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), scale, _mm256_loadu_ps(at));
                _mm256_storeu_ps(at, f);
            }
        }
    }
}
