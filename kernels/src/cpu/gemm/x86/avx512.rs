//! The packed f32 GEMM's micro-kernels under AVX-512 F (16 f32 lanes).

use super::*;

/// `C (R, 16·P) (+)= A (R, kc) · [B₀ … B_P] (kc, 16·P)` in 16-lane registers: `P` panels
/// `bstride` floats apart, otherwise as [`micro`].
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn micro512<const R: usize, const P: usize, const PF: bool>(
    kc: usize,
    a: *const f32,
    astride: usize,
    b: *const f32,
    bstride: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
    pf: usize,
) {
    let mut acc = load_acc512::<R, P>(c, ldc, first);
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); P];
        for (j, bv) in bv.iter_mut().enumerate() {
            *bv = _mm512_loadu_ps(b.add(j * bstride));
            if PF {
                // `pf` steps ahead: past the block's end it prefetches the next block or
                // beyond the panel (a hint, never a load: no fault), hence `wrapping_add`
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(j * bstride + pf * NR) as *const i8);
            }
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add(r));
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_fmadd_ps(av, *bv, *acc);
            }
        }
        a = a.add(astride);
        b = b.add(NR);
    }
    store_acc512(&acc, c, ldc);
}

/// The `R × P` 16-lane accumulators of an AVX-512 tile: zeros when `first`, else `C`'s
/// values (`R` rows `ldc` apart, `P` panels of 16 columns).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn load_acc512<const R: usize, const P: usize>(
    c: *const f32,
    ldc: usize,
    first: bool,
) -> [[__m512; P]; R] {
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_loadu_ps(c.add(r * ldc + j * NR));
            }
        }
    }
    acc
}

/// The accumulators of [`load_acc512`] written back to `C`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn store_acc512<const R: usize, const P: usize>(
    acc: &[[__m512; P]; R],
    c: *mut f32,
    ldc: usize,
) {
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(r * ldc + j * NR), *acc);
        }
    }
}

/// `rows` (≤ [`super::super::MAX_MR_AVX512`]) rows of one tile of `panels` (1 or 2) panels,
/// AVX-512.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn micro512_rows(
    rows: usize,
    panels: usize,
    kc: usize,
    a: *const f32,
    astride: usize,
    b: *const f32,
    bstride: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
    pf: usize,
) {
    macro_rules! go {
        ($($r:literal)*) => {
            match rows {
                $($r => match (panels, pf > 0) {
                    (2, false) => micro512::<$r, 2, false>(kc, a, astride, b, bstride, c, ldc, first, 0),
                    (2, true) => micro512::<$r, 2, true>(kc, a, astride, b, bstride, c, ldc, first, pf),
                    (_, false) => micro512::<$r, 1, false>(kc, a, astride, b, bstride, c, ldc, first, 0),
                    (_, true) => micro512::<$r, 1, true>(kc, a, astride, b, bstride, c, ldc, first, pf),
                },)*
                _ => unreachable!("a tile of {rows} rows (the blocking was validated)"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
}
