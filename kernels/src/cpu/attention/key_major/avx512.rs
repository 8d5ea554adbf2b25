//! The key-major form's AVX-512 register kernels: 16 lanes, groups of 14 keys, 14 × 32 tiles.

use std::arch::x86_64::*;

use super::super::super::math::x86::exp16;
use super::*;

impl Lanes for Avx512 {
    const LANES: usize = 16;
    const KR: usize = 14;
    const QR: usize = 14;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile(
        rows: usize,
        w: usize,
        kc: usize,
        (a, a_ks): (*const f32, usize),
        (b, b_ks): (*const f32, usize),
        (c, ldc): (*mut f32, usize),
        first: bool,
    ) {
        let last: __mmask16 = match w % 16 {
            0 => !0,
            r => (1u16 << r) - 1,
        };
        macro_rules! go {
            ($($r:literal)*) => {
                match rows {
                    $($r => match w.div_ceil(16) {
                        2 => micro512::<$r, 2>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                        _ => micro512::<$r, 1>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                    },)*
                    _ => unreachable!("a tile of {rows} rows"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn softmax_block(st: &mut State, kb: usize, c0: usize, c1: usize) {
        let mp = st.mp;
        let s = st.s.as_mut_ptr();
        let mut c = c0;
        while c < c1 {
            let w = (c1 - c).min(16);
            let lanes: __mmask16 = if w == 16 { !0 } else { (1u16 << w) - 1 };
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            let old = _mm512_mask_loadu_ps(ninf, lanes, st.max.as_ptr().add(c));
            let mut mx = old;
            for kk in 0..kb {
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, lanes, s.add(kk * mp + c)));
            }
            let seen = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, ninf);
            let shift = _mm512_maskz_mov_ps(seen, mx);
            let alpha = exp16(_mm512_sub_ps(old, shift));
            let mut acc = _mm512_setzero_ps();
            for kk in 0..kb {
                let p = s.add(kk * mp + c);
                let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, p), shift));
                _mm512_mask_storeu_ps(p, lanes, e);
                acc = _mm512_add_ps(acc, e);
            }
            let sum = _mm512_maskz_loadu_ps(lanes, st.sum.as_ptr().add(c));
            _mm512_mask_storeu_ps(
                st.sum.as_mut_ptr().add(c),
                lanes,
                _mm512_fmadd_ps(alpha, sum, acc),
            );
            _mm512_mask_storeu_ps(st.max.as_mut_ptr().add(c), lanes, mx);
            // rescale the output rows whose maximum moved (alpha < 1)
            let moved = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(alpha, _mm512_set1_ps(1.0)) & lanes;
            if moved != 0 {
                let mut a = [0f32; 16];
                _mm512_storeu_ps(a.as_mut_ptr(), alpha);
                st.rescale_moved(c, &a[..w], moved as u32);
            }
            c += w;
        }
    }
}

/// [`Avx512::tile`] with `R` rows and `P` registers of columns, the last one masked to `last`.
/// (Not `cpu_gemm`'s `micro512`: that one reads a packed weight panel, 16 floats per `k`, with
/// no ragged columns; here the vector operand is a strided matrix — the transposed queries, the
/// values in place — and a tile's last register may be partly outside it.)
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn micro512<const R: usize, const P: usize>(
    kc: usize,
    a: *const f32,
    a_ks: usize,
    b: *const f32,
    b_ks: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
    last: __mmask16,
) {
    let mask = |j: usize| if j + 1 == P { last } else { !0 };
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_maskz_loadu_ps(mask(j), c.add(r * ldc + 16 * j));
            }
        }
    }
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); P];
        for (j, bv) in bv.iter_mut().enumerate() {
            *bv = _mm512_maskz_loadu_ps(mask(j), b.add(16 * j));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add(r));
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_fmadd_ps(av, *bv, *acc);
            }
        }
        a = a.add(a_ks);
        b = b.add(b_ks);
    }
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(c.add(r * ldc + 16 * j), mask(j), *acc);
        }
    }
}
