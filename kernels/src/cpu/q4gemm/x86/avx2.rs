//! The 4-, 5- and 6-bit W4A8 tiles under AVX2 + FMA (u8 × i8 products as 16-bit multiply-adds,
//! 8 lanes).

use super::*;

/// AVX2: rows `0..R` × one panel over `blocks` blocks. `rg`: the row group's units, scales and
/// sums; `planes` / `sc`: the panel's values (with `H`, their fifth bits) and `A` / `B` factors.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_avx2<const R: usize, const H: bool>(
    blocks: usize,
    rg: Group,
    planes: Planes,
    sc: &Scales,
    out: &mut Tile,
) {
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut f = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        // 4 bits: 16-bit sums over the block; 5 bits: 32-bit sums (see the module doc)
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
            let dx = _mm256_set1_ps(*rg.scale.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*rg.sum.add(b * MR_AVX2 + r));
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

/// AVX2, `Q6_K`: rows `0..R` × one panel over `blocks` blocks, each block's low half of 16
/// values summed and scaled, then its high half (see the module doc).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile6_avx2<const R: usize>(
    blocks: usize,
    rg: Group,
    planes: Planes,
    sc: &Scales,
    out: &mut Tile,
) {
    let ones = _mm256_set1_epi16(1);
    let mut f = [[_mm256_setzero_ps(); 2]; R];
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
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones);
                        acc[h] = _mm256_add_epi32(acc[h], p);
                    }
                }
            }
            let av = split_factors_avx2(sc, b, half);
            for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                let dx = _mm256_set1_ps(*rg.scale.add(b * MR_AVX2 + r));
                let s = _mm256_set1_ps(half_sum(rg, b * MR_AVX2 + r, half));
                for h in 0..2 {
                    let x = _mm256_fnmadd_ps(_mm256_set1_ps(32.0), s, _mm256_cvtepi32_ps(acc[h]));
                    f[h] = _mm256_fmadd_ps(_mm256_mul_ps(av[h], x), dx, f[h]);
                }
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

/// `Q6_K`: block `b`'s `A` of half `half` for a panel's 16 columns (two halves of 8 each):
/// `d` times the half's signed scale.
///
/// # Safety
/// As [`factors_avx2`].
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn split_factors_avx2(sc: &Scales, b: usize, half: usize) -> [__m256; 2] {
    let (ma, mb, da, _) = sc.block(b);
    let m = [ma, mb][half] as *const i8;
    let one = |m: *const i8, d: *const f32| {
        let m = _mm256_cvtepi8_epi32(_mm_loadl_epi64(m as *const __m128i));
        _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(m))
    };
    [one(m, da), one(m.add(8), da.add(8))]
}

/// Eight columns' `d·m` (`m` 8-bit, `d` f32): exact in f32 for an f16 `d` and `m < 64`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn half_factor(m: *const u8, d: *const f32) -> __m256 {
    let m = _mm256_cvtepu8_epi32(_mm_loadl_epi64(m as *const __m128i));
    _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(m))
}

/// The sum of row `i`'s rounded activations over half `half` of the block (`low`, or the whole
/// sum less it: exact, both integers below 2^24).
///
/// # Safety
/// `i` indexes the row group's sums.
#[inline(always)]
pub(super) unsafe fn half_sum(rg: Group, i: usize, half: usize) -> f32 {
    let low = *rg.low.add(i);
    match half {
        0 => low,
        _ => *rg.sum.add(i) - low,
    }
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

/// `Q6_K`: group `g` of half `half` of eight columns as 6-bit bytes: the nibbles of `v` (low
/// or high) and the bit pairs of the 32 bytes at `at` moved to bits 4 and 5 (see the module
/// doc).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn six_bits(v: __m256i, at: *const u8, half: usize, g: usize) -> __m256i {
    let nib = _mm256_set1_epi8(0x0F);
    let pair = _mm256_set1_epi8(0x30);
    let low = match half {
        0 => _mm256_and_si256(v, nib),
        _ => _mm256_and_si256(_mm256_srli_epi16(v, 4), nib),
    };
    let h = _mm256_loadu_si256(at as *const __m256i);
    let h = match g {
        0 => _mm256_slli_epi32(h, 4),
        1 => _mm256_slli_epi32(h, 2),
        2 => h,
        _ => _mm256_srli_epi32(h, 2),
    };
    _mm256_or_si256(low, _mm256_and_si256(h, pair))
}
