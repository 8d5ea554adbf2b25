//! The packed f32 GEMM's micro-kernels under AVX2 + FMA (8 f32 lanes).

use super::*;

/// `C (R, 16) (+)= A (R, kc) · B (kc, 16)`: `a` a packed row group at its block (`astride`
/// floats per `k`: the group's row count), `b` a panel at its block, `c` row-major with row
/// stride `ldc`; `first` overwrites `C`; with `PF`, each step prefetches the panel `pf`
/// steps ahead.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn micro<const R: usize, const PF: bool>(
    kc: usize,
    a: *const f32,
    astride: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    first: bool,
    pf: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            acc[0] = _mm256_loadu_ps(c.add(r * ldc));
            acc[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
        }
    }
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let b0 = _mm256_loadu_ps(b);
        let b1 = _mm256_loadu_ps(b.add(8));
        if PF {
            // as in `micro512`: a hint, also past the panel's end
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(pf * NR) as *const i8);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.add(r));
            acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
        }
        a = a.add(astride);
        b = b.add(NR);
    }
    for (r, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(c.add(r * ldc), acc[0]);
        _mm256_storeu_ps(c.add(r * ldc + 8), acc[1]);
    }
}

/// `rows` (≤ [`super::super::MAX_MR_AVX2`]) rows of one tile.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn micro_rows(
    rows: usize,
    kc: usize,
    a: *const f32,
    astride: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    first: bool,
    pf: usize,
) {
    macro_rules! go {
        ($($r:literal)*) => {
            match rows {
                $($r => match pf {
                    0 => micro::<$r, false>(kc, a, astride, b, c, ldc, first, 0),
                    _ => micro::<$r, true>(kc, a, astride, b, c, ldc, first, pf),
                },)*
                _ => unreachable!("a tile of {rows} rows (the blocking was validated)"),
            }
        };
    }
    go!(1 2 3 4 5 6)
}
