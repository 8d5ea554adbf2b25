//! The Q8_0 W8A8 tiles under AVX-512 F + BW + VNNI (512-bit `vpdpbusd`, 16 lanes).

use super::*;

/// AVX-512 VNNI: rows `0..R` × `P` panels (`wstride` bytes / `dstride` scales apart) over
/// `blocks` blocks; `off` the panels' offsets, laid out as their scales; with `PF`, each
/// unit prefetches its weights `pf` blocks ahead.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile_avx512<const R: usize, const P: usize, const PF: bool>(
    blocks: usize,
    a: *const u32,
    sa: *const f32,
    w: *const i8,
    wstride: usize,
    dw: *const f32,
    off: *const i32,
    dstride: usize,
    out: &mut Tile,
    pf: usize,
) {
    const UNITS: usize = BLOCK / 4;
    let mut f = [[_mm512_setzero_ps(); P]; R];
    for b in 0..blocks {
        let mut acc = [[_mm512_setzero_si512(); P]; R];
        for j in 0..P {
            let o = _mm512_loadu_si512(off.add(j * dstride + b * NR) as *const __m512i);
            for acc in acc.iter_mut() {
                acc[j] = o;
            }
        }
        let ab = a.add(b * UNITS * MR_AVX512);
        for u in 0..UNITS {
            let mut wv = [_mm512_setzero_si512(); P];
            for (j, wv) in wv.iter_mut().enumerate() {
                let at = w.add(j * wstride + b * PANEL_BLOCK + u * 64);
                *wv = _mm512_loadu_si512(at as *const __m512i);
                if PF {
                    // a hint past the panel's end never faults, hence `wrapping_add`
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(pf * PANEL_BLOCK));
                }
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(*ab.add(u * MR_AVX512 + r) as i32);
                for (acc, wv) in acc.iter_mut().zip(&wv) {
                    *acc = _mm512_dpbusd_epi32(*acc, av, *wv);
                }
            }
        }
        for j in 0..P {
            let dv = _mm512_loadu_ps(dw.add(j * dstride + b * NR));
            for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                let s = _mm512_set1_ps(*sa.add(b * MR_AVX512 + r));
                f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j]), _mm512_mul_ps(s, dv), f[j]);
            }
        }
    }
    for (f, out) in f.iter().zip(out.iter_mut()) {
        for (j, f) in f.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(j * NR), *f);
        }
    }
}
