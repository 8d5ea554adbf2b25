//! The AVX-512 BF16 microkernel (`vdpbf16ps`) on the f32 kernel's blocked loops.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::amx::bf16_bits_fast;
use super::super::gemm::x86::{load_acc512, product_with, store_acc512, Tile};
use super::{pairs, Blocking, PackedBf16, NR};

/// `x (m, k)` rounded to bf16 in groups of `mr` rows, pair-major: `a[g][u][r]` holds
/// `x[g·mr + r][2u]` (low half) and `[2u + 1]` (high half; 0 past `k`); missing rows of
/// the last group are 0.
fn pack_rows(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<u32> {
    let units = k.div_ceil(2);
    let mut a = vec![0u32; m.div_ceil(mr) * mr * units];
    a.par_chunks_mut((mr * units).max(1))
        .enumerate()
        .for_each(|(g, dst)| {
            for r in 0..mr.min(m - g * mr) {
                let src = &x[(g * mr + r) * k..][..k];
                for (u, pair) in pairs(src, bf16_bits_fast).enumerate() {
                    dst[u * mr + r] = pair;
                }
            }
        });
    a
}

/// `C (R, 16·P) (+)= A (R, kc pairs) · [B₀ … B_P]`: per pair of `k`, `P` weight registers
/// and one broadcast pair per row, `R · P` `vdpbf16ps`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn micro<const R: usize, const P: usize>(
    kc: usize,
    a: *const u32,
    astride: usize,
    b: *const u32,
    bstride: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
) {
    let mut acc = load_acc512::<R, P>(c, ldc, first);
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_si512(); P];
        for (j, bv) in bv.iter_mut().enumerate() {
            *bv = _mm512_loadu_si512(b.add(j * bstride) as *const _);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(r) as i32));
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_dpbf16_ps(*acc, av, std::mem::transmute::<__m512i, __m512bh>(*bv));
            }
        }
        a = a.add(astride);
        b = b.add(NR);
    }
    store_acc512(&acc, c, ldc);
}

/// One [`Tile`] (≤ 14 rows, 1 or 2 panels), `mr` pairs per packed `k` step.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile(t: Tile<u32>, mr: usize) {
    macro_rules! go {
        ($($r:literal)*) => {
            match t.rows {
                $($r => match t.panels {
                    2 => micro::<$r, 2>(t.kc, t.a, mr, t.b, t.bstride, t.c, t.ldc, t.first),
                    _ => micro::<$r, 1>(t.kc, t.a, mr, t.b, t.bstride, t.c, t.ldc, t.first),
                },)*
                _ => unreachable!("a tile of {} rows (the blocking was validated)", t.rows),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major on the rayon threads (the CPU has AVX-512 BF16 and
/// `bl` fits its tile: the caller checked).
pub(super) fn product(x: &[f32], m: usize, w: &PackedBf16, bl: &Blocking) -> Vec<f32> {
    let units = w.k.div_ceil(2);
    let a = pack_rows(x, m, w.k, bl.mr);
    let mr = bl.mr;
    // SAFETY: the CPU has AVX-512 BF16 (the caller checked); `a` holds ⌈m/mr⌉·mr·units
    // and the panels ⌈n/16⌉·units·16 pairs, the layout `product_with` reads.
    unsafe {
        product_with(
            &a,
            m,
            w.n,
            units,
            &w.panels,
            true,
            bl,
            super::super::tile_store::Out::Product,
            |t| tile(t, mr),
        )
    }
}
