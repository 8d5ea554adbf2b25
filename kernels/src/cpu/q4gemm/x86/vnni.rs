//! The 4- and 5-bit W4A8 tiles under AVX-VNNI (256-bit `vpdpbusd`: 4-way u8 × i8 dot products, 8 lanes).

use super::*;

/// AVX-VNNI: [`tile_avx2`]'s sums with `vpdpbusd` on 8 lanes (exact in i32 as they are).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_vnni256<const R: usize, const H: bool>(
    blocks: usize,
    u: *const u32,
    sx: *const f32,
    ss: *const f32,
    w: *const u8,
    hb: *const u8,
    sc: &Scales,
    out: &mut Tile,
) {
    let nib = _mm256_set1_epi8(0x0F);
    // the f32 sums live in `out`: with them in registers too the tile spills its integer
    // sums (measured: a third of the kernel's time on stack traffic)
    for row in out.iter_mut().take(R) {
        row[..NR].fill(0.0);
    }
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ub = u.add(b * UNITS * MR_AVX2);
        let wblk = w.add(b * PANEL_BLOCK);
        for g in 0..4 {
            for h in 0..2 {
                let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                let mut lo = _mm256_and_si256(v, nib);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                if H {
                    (lo, hi) = super::avx2::fifth_bits(hb.add(b * PANEL_BITS + h * 32), g, lo, hi);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                    let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                    acc[h] = _mm256_dpbusd_avx_epi32(acc[h], lo, al);
                    acc[h] = _mm256_dpbusd_avx_epi32(acc[h], hi, ah);
                }
            }
        }
        let (av, bv) = super::avx2::factors_avx2(sc, b);
        for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
            for h in 0..2 {
                let at = row.as_mut_ptr().add(h * 8);
                let dot = _mm256_cvtepi32_ps(acc[h]);
                let t = _mm256_fmsub_ps(dot, av[h], _mm256_mul_ps(bv[h], s));
                _mm256_storeu_ps(at, _mm256_fmadd_ps(t, dx, _mm256_loadu_ps(at)));
            }
        }
    }
}
