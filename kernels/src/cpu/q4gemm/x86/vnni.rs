//! The 4-, 5- and 6-bit W4A8 tiles under AVX-VNNI (256-bit `vpdpbusd`: 4-way u8 × i8 dot
//! products, 8 lanes).

use super::avx2::{factors_avx2, fifth_bits, half_sum, six_bits, split_factors_avx2};
use super::*;

/// AVX-VNNI: [`super::avx2::tile_avx2`]'s sums with `vpdpbusd` on 8 lanes (exact in i32 as
/// they are).
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile_vnni256<const R: usize, const H: bool>(
    blocks: usize,
    rg: Group,
    planes: Planes,
    sc: &Scales,
    out: &mut Tile,
) {
    let nib = _mm256_set1_epi8(0x0F);
    // the f32 sums live in `out`: with them in registers too the tile spills its integer
    // sums (a third of the kernel's time went to stack traffic)
    for row in out.iter_mut().take(R) {
        row[..NR].fill(0.0);
    }
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ub = rg.units.add(b * UNITS * MR_AVX2);
        let wblk = planes.w.add(b * PANEL_BLOCK);
        for g in 0..4 {
            for h in 0..2 {
                let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                let mut lo = _mm256_and_si256(v, nib);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                if H {
                    let at = planes.h.add(b * PANEL_BITS + h * 32);
                    (lo, hi) = fifth_bits(at, g, lo, hi);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                    let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                    acc[h] = _mm256_dpbusd_avx_epi32(acc[h], lo, al);
                    acc[h] = _mm256_dpbusd_avx_epi32(acc[h], hi, ah);
                }
            }
        }
        let (av, bv) = factors_avx2(sc, b);
        for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let dx = _mm256_set1_ps(*rg.scale.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*rg.sum.add(b * MR_AVX2 + r));
            for h in 0..2 {
                let at = row.as_mut_ptr().add(h * 8);
                let dot = _mm256_cvtepi32_ps(acc[h]);
                let t = _mm256_fmsub_ps(dot, av[h], _mm256_mul_ps(bv[h], s));
                _mm256_storeu_ps(at, _mm256_fmadd_ps(t, dx, _mm256_loadu_ps(at)));
            }
        }
    }
}

/// AVX-VNNI, `Q6_K`: [`super::avx2::tile6_avx2`]'s sums with `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
pub(super) unsafe fn tile6_vnni256<const R: usize>(
    blocks: usize,
    rg: Group,
    planes: Planes,
    sc: &Scales,
    out: &mut Tile,
) {
    for row in out.iter_mut().take(R) {
        row[..NR].fill(0.0);
    }
    for b in 0..blocks {
        let ub = rg.units.add(b * UNITS * MR_AVX2);
        let wblk = planes.w.add(b * PANEL_BLOCK);
        for half in 0..2 {
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            for g in 0..4 {
                for h in 0..2 {
                    let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                    let at = planes
                        .h
                        .add(b * 2 * PANEL_BITS + half * PANEL_BITS + h * 32);
                    let q = six_bits(v, at, half, g);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let a = _mm256_set1_epi32(*ub.add((g + 4 * half) * MR_AVX2 + r) as i32);
                        acc[h] = _mm256_dpbusd_avx_epi32(acc[h], q, a);
                    }
                }
            }
            let av = split_factors_avx2(sc, b, half);
            for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
                let dx = _mm256_set1_ps(*rg.scale.add(b * MR_AVX2 + r));
                let s = _mm256_set1_ps(half_sum(rg, b * MR_AVX2 + r, half));
                for h in 0..2 {
                    let at = row.as_mut_ptr().add(h * 8);
                    let x = _mm256_fnmadd_ps(_mm256_set1_ps(32.0), s, _mm256_cvtepi32_ps(acc[h]));
                    let t = _mm256_mul_ps(av[h], x);
                    _mm256_storeu_ps(at, _mm256_fmadd_ps(t, dx, _mm256_loadu_ps(at)));
                }
            }
        }
    }
}
