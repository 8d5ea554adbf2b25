//! The key-major form's AVX2 + FMA register kernels: 8 lanes, groups of 6 keys, 6 × 16 tiles.

use std::arch::x86_64::*;

use super::super::super::math::x86::exp8;
use super::*;

/// The AVX2 lane mask of the first `w` of 8 lanes (`w ≤ 8`): all bits set in those lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lanes8(w: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(w as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

impl Lanes for Avx2 {
    const LANES: usize = 8;
    const KR: usize = 6;
    const QR: usize = 6;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile(
        rows: usize,
        w: usize,
        kc: usize,
        (a, a_ks): (*const f32, usize),
        (b, b_ks): (*const f32, usize),
        (c, ldc): (*mut f32, usize),
        first: bool,
    ) {
        let last = lanes8(match w % 8 {
            0 => 8,
            r => r,
        });
        macro_rules! go {
            ($($r:literal)*) => {
                match (rows, w.div_ceil(8), w % 8 != 0) {
                    $(($r, 2, false) => micro256::<$r, 2, false>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                    ($r, 2, true) => micro256::<$r, 2, true>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                    ($r, _, false) => micro256::<$r, 1, false>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                    ($r, _, true) => micro256::<$r, 1, true>(kc, a, a_ks, b, b_ks, c, ldc, first, last),)*
                    _ => unreachable!("a tile of {rows} rows"),
                }
            };
        }
        go!(1 2 3 4 5 6)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn softmax_block(st: &mut State, kb: usize, c0: usize, c1: usize) {
        let mp = st.mp;
        let s = st.s.as_mut_ptr();
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut c = c0;
        while c < c1 {
            let w = (c1 - c).min(8);
            let lanes = lanes8(w);
            let on = _mm256_castsi256_ps(lanes);
            // masked lanes read -inf for the maximum (a masked load gives 0)
            let load_or_ninf =
                |p: *const f32| _mm256_blendv_ps(ninf, _mm256_maskload_ps(p, lanes), on);
            let old = load_or_ninf(st.max.as_ptr().add(c));
            let mut mx = old;
            for kk in 0..kb {
                mx = _mm256_max_ps(mx, load_or_ninf(s.add(kk * mp + c)));
            }
            let seen = _mm256_cmp_ps::<_CMP_GT_OQ>(mx, ninf);
            let shift = _mm256_and_ps(seen, mx);
            let alpha = exp8(_mm256_sub_ps(old, shift));
            let mut acc = _mm256_setzero_ps();
            for kk in 0..kb {
                let p = s.add(kk * mp + c);
                let e = exp8(_mm256_sub_ps(_mm256_maskload_ps(p, lanes), shift));
                _mm256_maskstore_ps(p, lanes, e);
                acc = _mm256_add_ps(acc, e);
            }
            let sum = _mm256_maskload_ps(st.sum.as_ptr().add(c), lanes);
            _mm256_maskstore_ps(
                st.sum.as_mut_ptr().add(c),
                lanes,
                _mm256_fmadd_ps(alpha, sum, acc),
            );
            _mm256_maskstore_ps(st.max.as_mut_ptr().add(c), lanes, mx);
            // rescale the output rows whose maximum moved (alpha < 1)
            let moved = _mm256_movemask_ps(_mm256_and_ps(
                _mm256_cmp_ps::<_CMP_NEQ_UQ>(alpha, _mm256_set1_ps(1.0)),
                on,
            ));
            if moved != 0 {
                let mut a = [0f32; 8];
                _mm256_storeu_ps(a.as_mut_ptr(), alpha);
                st.rescale_moved(c, &a[..w], moved as u32);
            }
            c += w;
        }
    }
}

/// [`Avx2::tile`] with `R` rows and `P` registers of columns; with `RAGGED` the last register
/// is loaded and stored through the lane mask `last` (plain loads otherwise).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn micro256<const R: usize, const P: usize, const RAGGED: bool>(
    kc: usize,
    a: *const f32,
    a_ks: usize,
    b: *const f32,
    b_ks: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
    last: __m256i,
) {
    let load = |p: *const f32, j: usize| match RAGGED && j + 1 == P {
        true => _mm256_maskload_ps(p, last),
        false => _mm256_loadu_ps(p),
    };
    let mut acc = [[_mm256_setzero_ps(); P]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = load(c.add(r * ldc + 8 * j), j);
            }
        }
    }
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let mut bv = [_mm256_setzero_ps(); P];
        for (j, bv) in bv.iter_mut().enumerate() {
            *bv = load(b.add(8 * j), j);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.add(r));
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm256_fmadd_ps(av, *bv, *acc);
            }
        }
        a = a.add(a_ks);
        b = b.add(b_ks);
    }
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            let p = c.add(r * ldc + 8 * j);
            match RAGGED && j + 1 == P {
                true => _mm256_maskstore_ps(p, last, *acc),
                false => _mm256_storeu_ps(p, *acc),
            }
        }
    }
}
