use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::qgemm::x86_rounded;
use super::super::tile_store::{by_panel_runs, run_tiles, Out, Tile};
use super::{mr, Isa, PackedQ4, BLOCK, MC, MR_AVX2, MR_AVX512, NR, PANEL_BLOCK};

/// Broadcast units per block: 8 of four `i8`.
const UNITS: usize = BLOCK / 4;

/// A row group's rounded activations: the units `[group][block][unit][row]`, the scales
/// and the sums `[group][block][row]` (rows past `m` are zero).
pub(super) struct Rows {
    units: Vec<u32>,
    scale: Vec<f32>,
    sum: Vec<f32>,
}

/// `x (m, k)` rounded per row and block for `isa`'s tiles.
///
/// # Safety
/// The CPU has AVX2 + FMA.
pub(super) unsafe fn quantize_rows(x: &[f32], m: usize, k: usize, isa: Isa) -> Rows {
    let (mr, blocks) = (mr(isa), k / BLOCK);
    let groups = m.div_ceil(mr);
    let mut units = vec![0u32; groups * blocks * UNITS * mr];
    let mut scale = vec![0f32; groups * blocks * mr];
    let mut sum = vec![0f32; groups * blocks * mr];
    units
        .par_chunks_mut(blocks * UNITS * mr)
        .zip(scale.par_chunks_mut(blocks * mr))
        .zip(sum.par_chunks_mut(blocks * mr))
        .enumerate()
        .for_each(|(gi, ((u, d), s))| {
            for r in 0..mr.min(m - gi * mr) {
                let row = &x[(gi * mr + r) * k..][..k];
                for (b, xs) in row.chunks_exact(BLOCK).enumerate() {
                    // SAFETY: the CPU has AVX2 + FMA; `xs` holds 32 floats and `u` the
                    // block's 8 units, `mr` apart, from this one.
                    let (dv, sv) =
                        unsafe { signed_units(xs, u.as_mut_ptr().add(b * UNITS * mr + r), mr) };
                    d[b * mr + r] = dv;
                    s[b * mr + r] = sv as f32;
                }
            }
        });
    Rows { units, scale, sum }
}

/// `xs` (32 floats) rounded as the `Q8_0` kernel rounds, written as 8 units of four `i8`
/// (`stride` units apart); returns the scale and the sum of the rounded values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn signed_units(xs: &[f32], out: *mut u32, stride: usize) -> (f32, i32) {
    let (d, q) = x86_rounded(xs);
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let mut lanes = [0i32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, sum);
    // i32 -> i16 -> i8, each pack interleaving 128-bit lanes; 0xD8 restores the order
    let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
    let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
    let b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
    let mut units = [0u32; UNITS];
    _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, b);
    for (g, &unit) in units.iter().enumerate() {
        *out.add(g * stride) = unit;
    }
    (d, lanes.iter().sum())
}

/// AVX2: rows `0..R` × one panel over `blocks` blocks. `u` / `sx` / `ss`: the row group's
/// units, scales and sums; `w` / `wa` / `wb`: the panel's values, `A` and `B`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    blocks: usize,
    u: *const u32,
    sx: *const f32,
    ss: *const f32,
    w: *const u8,
    wa: *const f32,
    wb: *const f32,
    out: &mut Tile,
) {
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut f = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ub = u.add(b * UNITS * MR_AVX2);
        let wblk = w.add(b * PANEL_BLOCK);
        for g in 0..4 {
            for h in 0..2 {
                let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                let lo = _mm256_and_si256(v, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                    let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, al),
                        _mm256_maddubs_epi16(hi, ah),
                    );
                    acc[h] = _mm256_add_epi16(acc[h], p);
                }
            }
        }
        let av = [0, 8].map(|o| _mm256_loadu_ps(wa.add(b * NR + o)));
        let bv = [0, 8].map(|o| _mm256_loadu_ps(wb.add(b * NR + o)));
        for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
            let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
            for h in 0..2 {
                let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[h], ones));
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

/// AVX-VNNI: [`tile_avx2`]'s sums with `vpdpbusd` on 8 lanes (exact in i32 as they are).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn tile_vnni256<const R: usize>(
    blocks: usize,
    u: *const u32,
    sx: *const f32,
    ss: *const f32,
    w: *const u8,
    wa: *const f32,
    wb: *const f32,
    out: &mut Tile,
) {
    let nib = _mm256_set1_epi8(0x0F);
    // the f32 sums live in `out`: with them in registers too the tile spills its integer
    // sums (measured: a third of the kernel's time on stack traffic)
    for row in out.iter_mut().take(R) {
        row[..NR].fill(0.0);
    }
    for b in 0..blocks {
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        let ub = u.add(b * UNITS * MR_AVX2);
        let wblk = w.add(b * PANEL_BLOCK);
        for g in 0..4 {
            for h in 0..2 {
                let v = _mm256_loadu_si256(wblk.add(g * 64 + h * 32) as *const __m256i);
                let lo = _mm256_and_si256(v, nib);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let al = _mm256_set1_epi32(*ub.add(g * MR_AVX2 + r) as i32);
                    let ah = _mm256_set1_epi32(*ub.add((g + 4) * MR_AVX2 + r) as i32);
                    acc[h] = _mm256_dpbusd_avx_epi32(acc[h], lo, al);
                    acc[h] = _mm256_dpbusd_avx_epi32(acc[h], hi, ah);
                }
            }
        }
        let av = [0, 8].map(|o| _mm256_loadu_ps(wa.add(b * NR + o)));
        let bv = [0, 8].map(|o| _mm256_loadu_ps(wb.add(b * NR + o)));
        for (r, (row, acc)) in out.iter_mut().zip(&acc).enumerate() {
            let dx = _mm256_set1_ps(*sx.add(b * MR_AVX2 + r));
            let s = _mm256_set1_ps(*ss.add(b * MR_AVX2 + r));
            for h in 0..2 {
                let at = row.as_mut_ptr().add(h * 8);
                let dot = _mm256_cvtepi32_ps(acc[h]);
                let t = _mm256_fmsub_ps(dot, av[h], _mm256_mul_ps(bv[h], s));
                _mm256_storeu_ps(at, _mm256_fmadd_ps(t, dx, _mm256_loadu_ps(at)));
            }
        }
    }
}

/// AVX-512 VNNI: rows `0..R` × `P` panels (`wstride` bytes / `dstride` scales apart) over
/// `blocks` blocks.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_avx512<const R: usize, const P: usize>(
    blocks: usize,
    u: *const u32,
    sx: *const f32,
    ss: *const f32,
    w: *const u8,
    wstride: usize,
    wa: *const f32,
    wb: *const f32,
    dstride: usize,
    out: &mut Tile,
) {
    let nib = _mm512_set1_epi8(0x0F);
    let mut f = [[_mm512_setzero_ps(); P]; R];
    for b in 0..blocks {
        let mut acc = [[_mm512_setzero_si512(); P]; R];
        let ub = u.add(b * UNITS * MR_AVX512);
        for g in 0..4 {
            let mut lo = [_mm512_setzero_si512(); P];
            let mut hi = [_mm512_setzero_si512(); P];
            for j in 0..P {
                let at = w.add(j * wstride + b * PANEL_BLOCK + g * 64);
                let v = _mm512_loadu_si512(at as *const __m512i);
                lo[j] = _mm512_and_si512(v, nib);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
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
            let av = _mm512_loadu_ps(wa.add(j * dstride + b * NR));
            let bv = _mm512_loadu_ps(wb.add(j * dstride + b * NR));
            for (r, (f, acc)) in f.iter_mut().zip(&acc).enumerate() {
                let dx = _mm512_set1_ps(*sx.add(b * MR_AVX512 + r));
                let s = _mm512_set1_ps(*ss.add(b * MR_AVX512 + r));
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

/// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panels each).
pub(super) fn product(x: &[f32], m: usize, w: &PackedQ4) -> Vec<f32> {
    product_with(x, m, w, Out::Product)
}

/// [`product`], or (`Out::SwiGlu`, a weight of [`PackedQ4::gate_up`]) its SwiGLU
/// `(m, n / 2)`, taken as each pair of panels' tile is written.
pub(super) fn product_with(x: &[f32], m: usize, w: &PackedQ4, out: Out) -> Vec<f32> {
    let (n, k, isa) = (w.n, w.k, w.isa);
    // SAFETY: the CPU has `isa` (`linear` checked), so AVX2 + FMA
    let rows = unsafe { quantize_rows(x, m, k, isa) };
    by_panel_runs(m, n, isa == Isa::Avx512, out, |p0, p1, y| {
        // SAFETY: the CPU has `isa`; `rows` holds every row group `run` reads and the
        // weight every panel; runs of panels (of pairs, for the SwiGLU) write disjoint
        // columns of `y`, which holds m · out.cols(n) elements.
        unsafe { run(&rows, m, w, p0, p1, out, y) };
    })
}

/// Panels `p0..p1` of the product (or its SwiGLU: `p0`, `p1` even) into `y`.
#[allow(clippy::too_many_arguments)]
unsafe fn run(rows: &Rows, m: usize, w: &PackedQ4, p0: usize, p1: usize, out: Out, y: *mut f32) {
    let (blocks, mr) = (w.k / BLOCK, mr(w.isa));
    let wide = w.isa == Isa::Avx512;
    run_tiles(
        (m, w.n),
        (mr, MC),
        wide,
        (p0, p1),
        out,
        y,
        |p, width, g0, count, t| {
            let gi = g0 / mr;
            let group = (
                rows.units.as_ptr().add(gi * blocks * UNITS * mr),
                rows.scale.as_ptr().add(gi * blocks * mr),
                rows.sum.as_ptr().add(gi * blocks * mr),
            );
            tile_at(w, p, width, count, group, t);
        },
    );
}

/// Rows `0..count` of one row group (`(units, scales, sums)`) × panels `p..p + width`
/// (`width` 2 only under AVX-512) of `w` into `out`.
///
/// # Safety
/// The CPU has `w`'s ISA; the row group and panels are within `w` and the rounded rows.
unsafe fn tile_at(
    w: &PackedQ4,
    p: usize,
    width: usize,
    count: usize,
    (ug, sg, tg): (*const u32, *const f32, *const f32),
    out: &mut Tile,
) {
    let blocks = w.k / BLOCK;
    let wp = w.q.as_ptr().add(p * blocks * PANEL_BLOCK);
    let ap = w.a.as_ptr().add(p * blocks * NR);
    let bp = w.b.as_ptr().add(p * blocks * NR);
    match w.isa {
        Isa::Avx2 => {
            macro_rules! go {
                ($r:literal) => {
                    tile_avx2::<$r>(blocks, ug, sg, tg, wp, ap, bp, out)
                };
            }
            match count {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
        }
        Isa::AvxVnni => {
            macro_rules! go {
                ($r:literal) => {
                    tile_vnni256::<$r>(blocks, ug, sg, tg, wp, ap, bp, out)
                };
            }
            match count {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
        }
        Isa::Avx512 => {
            let (ws, ds) = (blocks * PANEL_BLOCK, blocks * NR);
            macro_rules! go {
                ($r:literal) => {
                    match width {
                        2 => tile_avx512::<$r, 2>(blocks, ug, sg, tg, wp, ws, ap, bp, ds, out),
                        _ => tile_avx512::<$r, 1>(blocks, ug, sg, tg, wp, ws, ap, bp, ds, out),
                    }
                };
            }
            match count {
                6 => go!(6),
                5 => go!(5),
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
        }
    }
}
