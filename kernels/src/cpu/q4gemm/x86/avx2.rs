//! The 4- and 5-bit W4A8 tiles under AVX2 + FMA (u8 × i8 products as 16-bit multiply-adds, 8
//! lanes).

use super::*;

/// AVX2: rows `0..R` × one panel over `blocks` blocks. `u` / `sx` / `ss`: the row group's
/// units, scales and sums; `w` / `sc`: the panel's values and `A` / `B` factors; with `H`,
/// `hb` the panel's fifth bits.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_avx2<const R: usize, const H: bool>(
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
    let ones = _mm256_set1_epi16(1);
    let mut f = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        // 4 bits: 16-bit sums over the block; 5 bits: 32-bit sums (see the module doc)
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ub = u.add(b * UNITS * MR_AVX2);
        let wblk = w.add(b * PANEL_BLOCK);
        for g in 0..4 {
            for h in 0..2 {
                let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                let mut lo = _mm256_and_si256(v, nib);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                if H {
                    (lo, hi) = fifth_bits(hb.add(b * PANEL_BITS + h * 32), g, lo, hi);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                    let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, al),
                        _mm256_maddubs_epi16(hi, ah),
                    );
                    acc[h] = match H {
                        true => _mm256_add_epi32(acc[h], _mm256_madd_epi16(p, ones)),
                        false => _mm256_add_epi16(acc[h], p),
                    };
                }
            }
        }
        let (av, bv) = factors_avx2(sc, b);
        for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
            let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
            for h in 0..2 {
                let dot = match H {
                    true => _mm256_cvtepi32_ps(acc[h]),
                    false => _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[h], ones)),
                };
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

/// Block `b`'s `A` and `B` of a panel's 16 columns (two halves of 8 each): `da·ma`, `db·mb`.
///
/// # Safety
/// The CPU has AVX2; `b` is a block of the panel's weight.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn factors_avx2(sc: &Scales, b: usize) -> ([__m256; 2], [__m256; 2]) {
    let (ma, mb, da, db) = sc.block(b);
    (
        [half_factor(ma, da), half_factor(ma.add(8), da.add(8))],
        [half_factor(mb, db), half_factor(mb.add(8), db.add(8))],
    )
}

/// Eight columns' `d·m` (`m` 8-bit, `d` f32): exact in f32 for an f16 `d` and `m < 64`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn half_factor(m: *const u8, d: *const f32) -> __m256 {
    let m = _mm256_cvtepu8_epi32(_mm_loadl_epi64(m as *const __m128i));
    _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(m))
}

/// Group `g`'s fifth bits of eight columns (the 32 bytes at `at`) put into bit 4 of the low and
/// high halves' bytes `lo`, `hi` (see the module doc).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn fifth_bits(
    at: *const u8,
    g: usize,
    lo: __m256i,
    hi: __m256i,
) -> (__m256i, __m256i) {
    let bit4 = _mm256_set1_epi8(0x10);
    let v = _mm256_loadu_si256(at as *const __m256i);
    let l = _mm256_sll_epi32(v, _mm_cvtsi32_si128(4 - g as i32));
    let h = _mm256_srl_epi32(v, _mm_cvtsi32_si128(g as i32));
    (
        _mm256_or_si256(lo, _mm256_and_si256(l, bit4)),
        _mm256_or_si256(hi, _mm256_and_si256(h, bit4)),
    )
}
