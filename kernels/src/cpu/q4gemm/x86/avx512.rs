//! The 4-, 5- and 6-bit W4A8 tiles under AVX-512 F + BW + VNNI (512-bit `vpdpbusd`, 16 lanes).

use super::avx2::half_sum;
use super::*;

/// AVX-512 VNNI: rows `0..R` × `P` panels (values and, with `H`, fifth bits in `planes`;
/// `A` / `B` factors `sc`) over `blocks` blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile_avx512<const R: usize, const P: usize, const H: bool>(
    blocks: usize,
    rg: Group,
    planes: Planes,
    sc: &[Scales; P],
    out: &mut Tile,
) {
    let nib = _mm512_set1_epi8(0x0F);
    let bit4 = _mm512_set1_epi8(0x10);
    let mut f = [[_mm512_setzero_ps(); P]; R];
    for b in 0..blocks {
        let mut acc = [[_mm512_setzero_si512(); P]; R];
        let ub = rg.units.add(b * UNITS * MR_AVX512);
        let mut fifth = [_mm512_setzero_si512(); P];
        if H {
            for (j, fifth) in fifth.iter_mut().enumerate() {
                let at = planes.h.add(j * planes.hstride + b * PANEL_BITS);
                *fifth = _mm512_loadu_si512(at as *const __m512i);
            }
        }
        for g in 0..4 {
            let mut lo = [_mm512_setzero_si512(); P];
            let mut hi = [_mm512_setzero_si512(); P];
            for j in 0..P {
                let at = planes.w.add(j * planes.wstride + b * PANEL_BLOCK + g * 64);
                let v = _mm512_loadu_si512(at as *const __m512i);
                lo[j] = _mm512_and_si512(v, nib);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                if H {
                    // group g's fifth bits to bit 4 of each byte (see the module doc)
                    let l = _mm512_sll_epi32(fifth[j], _mm_cvtsi32_si128(4 - g as i32));
                    let h = _mm512_srl_epi32(fifth[j], _mm_cvtsi32_si128(g as i32));
                    lo[j] = _mm512_or_si512(lo[j], _mm512_and_si512(l, bit4));
                    hi[j] = _mm512_or_si512(hi[j], _mm512_and_si512(h, bit4));
                }
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let al = _mm512_set1_epi32(*ub.add(g * MR_AVX512 + r) as i32);
                let ah = _mm512_set1_epi32(*ub.add((g + 4) * MR_AVX512 + r) as i32);
                for j in 0..P {
                    acc[j] = _mm512_dpbusd_epi32(acc[j], lo[j], al);
                    acc[j] = _mm512_dpbusd_epi32(acc[j], hi[j], ah);
                }
            }
        }
        for j in 0..P {
            let (ma, mb, da, db) = sc[j].block(b);
            let (av, bv) = (factor(ma, da), factor(mb, db));
            for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                let dx = _mm512_set1_ps(*rg.scale.add(b * MR_AVX512 + r));
                let s = _mm512_set1_ps(*rg.sum.add(b * MR_AVX512 + r));
                let t = _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc[j]), av, _mm512_mul_ps(bv, s));
                f[j] = _mm512_fmadd_ps(t, dx, f[j]);
            }
        }
    }
    for (f, out) in f.iter().zip(out.iter_mut()) {
        for (j, f) in f.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(j * NR), *f);
        }
    }
}

/// AVX-512 VNNI, `Q6_K`: rows `0..R` × `P` panels, each block's low half of 16 values summed
/// and scaled, then its high half (see the module doc).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile6_avx512<const R: usize, const P: usize>(
    blocks: usize,
    rg: Group,
    planes: Planes,
    sc: &[Scales; P],
    out: &mut Tile,
) {
    let nib = _mm512_set1_epi8(0x0F);
    let pair = _mm512_set1_epi8(0x30);
    let mut f = [[_mm512_setzero_ps(); P]; R];
    for b in 0..blocks {
        let ub = rg.units.add(b * UNITS * MR_AVX512);
        for half in 0..2 {
            let mut acc = [[_mm512_setzero_si512(); P]; R];
            let mut bits = [_mm512_setzero_si512(); P];
            for (j, bits) in bits.iter_mut().enumerate() {
                let at = planes
                    .h
                    .add(j * planes.hstride + (2 * b + half) * PANEL_BITS);
                *bits = _mm512_loadu_si512(at as *const __m512i);
            }
            for g in 0..4 {
                let mut q = [_mm512_setzero_si512(); P];
                for j in 0..P {
                    let at = planes.w.add(j * planes.wstride + b * PANEL_BLOCK + g * 64);
                    let v = _mm512_loadu_si512(at as *const __m512i);
                    let low = match half {
                        0 => _mm512_and_si512(v, nib),
                        _ => _mm512_and_si512(_mm512_srli_epi16(v, 4), nib),
                    };
                    // group g's bit pairs (bits 2g, 2g + 1 of each byte) to bits 4 and 5
                    let h = match g {
                        0 => _mm512_slli_epi32(bits[j], 4),
                        1 => _mm512_slli_epi32(bits[j], 2),
                        2 => bits[j],
                        _ => _mm512_srli_epi32(bits[j], 2),
                    };
                    q[j] = _mm512_or_si512(low, _mm512_and_si512(h, pair));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_epi32(*ub.add((g + 4 * half) * MR_AVX512 + r) as i32);
                    for j in 0..P {
                        acc[j] = _mm512_dpbusd_epi32(acc[j], q[j], a);
                    }
                }
            }
            for j in 0..P {
                let (ma, mb, da, _) = sc[j].block(b);
                let m = [ma, mb][half] as *const i8;
                let sm = _mm512_cvtepi8_epi32(_mm_loadu_si128(m as *const __m128i));
                let av = _mm512_mul_ps(_mm512_loadu_ps(da), _mm512_cvtepi32_ps(sm));
                for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                    let dx = _mm512_set1_ps(*rg.scale.add(b * MR_AVX512 + r));
                    let s = _mm512_set1_ps(half_sum(rg, b * MR_AVX512 + r, half));
                    let x = _mm512_fnmadd_ps(_mm512_set1_ps(32.0), s, _mm512_cvtepi32_ps(acc[j]));
                    f[j] = _mm512_fmadd_ps(_mm512_mul_ps(av, x), dx, f[j]);
                }
            }
        }
    }
    for (f, out) in f.iter().zip(out.iter_mut()) {
        for (j, f) in f.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add(j * NR), *f);
        }
    }
}

/// 16 columns' `d·m` (`m` 8-bit, `d` f32): exact in f32 for an f16 `d` and `m < 64`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn factor(m: *const u8, d: *const f32) -> __m512 {
    let m = _mm512_cvtepu8_epi32(_mm_loadu_si128(m as *const __m128i));
    _mm512_mul_ps(_mm512_loadu_ps(d), _mm512_cvtepi32_ps(m))
}
