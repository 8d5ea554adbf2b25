//! The Q8_0 W8A8 GEMM on x86: the activations rounded per row and block, the split over panels
//! and threads, and the tile loop; the tiles of each instruction set live in [`avx2`], [`vnni`]
//! (AVX-VNNI) and [`avx512`].

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::tile_store::{by_panel_runs, run_tiles, Out, Tile};
use super::{group, mr, Isa, PackedQ8, BLOCK, MC, MR_AVX2, MR_AVX512, MR_VNNI256, NR, PANEL_BLOCK};

mod avx2;
mod avx512;
mod vnni;

use avx2::tile_avx2;
use avx512::tile_avx512;
use vnni::tile_vnni256;

/// `x (m, k)` rounded per row and block and laid out for `isa`'s kernel: the broadcast units
/// `[row group][block][group][row]` and the scales `[row group][block][row]` (rows past `m`
/// are zero).
///
/// # Safety
/// The CPU has `isa`.
pub(super) unsafe fn quantize_rows(
    x: &[f32],
    m: usize,
    k: usize,
    isa: Isa,
) -> (Vec<u32>, Vec<f32>) {
    let (mr, blocks) = (mr(isa), k / BLOCK);
    let units = BLOCK / group(isa);
    let groups = m.div_ceil(mr);
    let mut a = vec![0u32; groups * blocks * units * mr];
    let mut s = vec![0f32; groups * blocks * mr];
    a.par_chunks_mut((blocks * units * mr).max(1))
        .zip(s.par_chunks_mut((blocks * mr).max(1)))
        .enumerate()
        .for_each(|(gi, (a, s))| {
            for r in 0..mr.min(m - gi * mr) {
                let row = &x[(gi * mr + r) * k..][..k];
                for (b, xs) in row.chunks_exact(BLOCK).enumerate() {
                    // SAFETY: the CPU has AVX2 (every level includes it); `xs` holds 32
                    // floats and `a` the block's `units` units, `mr` apart, from this one.
                    s[b * mr + r] = unsafe {
                        quantize_units(xs, isa, a.as_mut_ptr().add(b * units * mr + r), mr)
                    };
                }
            }
        });
    (a, s)
}

/// The scale of `xs` (32 floats) and its values rounded and clamped to ±127, as four
/// (8,) i32 registers (values 8i..8i+8 in register i).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rounded(xs: &[f32]) -> (f32, [__m256i; 4]) {
    let p = xs.as_ptr();
    let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for v in &v {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let amax = lanes.iter().fold(0f32, |a, &x| a.max(x));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
    let q = v.map(|v| {
        let r = _mm256_cvtps_epi32(_mm256_mul_ps(v, idv));
        _mm256_min_epi32(_mm256_max_epi32(r, lo), hi)
    });
    (d, q)
}

/// [`super::portable::quantize_block`] and the packing of its values into `isa`'s broadcast
/// units, in registers: rounds `xs` (32 floats), writes the block's `32 / G` units to `out`,
/// `stride` units apart, and returns the scale (the same rounding, so the same units:
/// tested against the scalar form).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_units(xs: &[f32], isa: Isa, out: *mut u32, stride: usize) -> f32 {
    let (d, q) = rounded(xs);
    // i32 -> i16 packs 128-bit lanes pairwise: [a0..3 b0..3 a4..7 b4..7]; 0xD8 restores order
    let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
    let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
    let mut units = [0u32; 16];
    let n = match isa {
        // (16,) i16 pairs: values 0..16 and 16..32, two per unit
        Isa::Avx2 => {
            _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, w01);
            _mm256_storeu_si256(units.as_mut_ptr().add(8) as *mut __m256i, w23);
            16
        }
        // values + 128 as u8 (1..=255), four per unit
        Isa::AvxVnni | Isa::Avx512 => {
            let off = _mm256_set1_epi16(128);
            let b = _mm256_packus_epi16(_mm256_add_epi16(w01, off), _mm256_add_epi16(w23, off));
            let b = _mm256_permute4x64_epi64(b, 0xD8);
            _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, b);
            8
        }
    };
    for (u, &unit) in units.iter().enumerate().take(n) {
        *out.add(u * stride) = unit;
    }
    d
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panels each).
pub(super) fn product(x: &[f32], m: usize, w: &PackedQ8) -> Vec<f32> {
    product_with(x, m, w, Out::Product)
}

/// [`product`], or (`Out::SwiGlu`, a weight of [`PackedQ8::gate_up`]) its SwiGLU
/// `(m, n / 2)`, taken as each pair of panels' tile is written.
pub(super) fn product_with(x: &[f32], m: usize, w: &PackedQ8, out: Out) -> Vec<f32> {
    let (n, k, isa) = (w.n, w.k, w.isa);
    // SAFETY: the CPU has `isa` (`linear` checked)
    let (a, s) = unsafe { quantize_rows(x, m, k, isa) };
    // AVX-512 tiles pair panels
    by_panel_runs(m, n, isa == Isa::Avx512, out, |p0, p1, y| {
        // SAFETY: the CPU has `isa` (`linear` checked); `a` / `s` hold every row group `run`
        // reads and the weight every panel; runs of panels (of pairs, for the SwiGLU)
        // write disjoint columns of `y`, which holds m · out.cols(n) elements.
        unsafe { run(&a, &s, m, w, p0, p1, out, y) };
    })
}

/// Panels `p0..p1` of the product (or its SwiGLU: `p0`, `p1` even) into `y`.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    a: &[u32],
    s: &[f32],
    m: usize,
    w: &PackedQ8,
    p0: usize,
    p1: usize,
    out: Out,
    y: *mut f32,
) {
    let (blocks, mr, units) = (w.k / BLOCK, mr(w.isa), BLOCK / group(w.isa));
    let wide = w.isa == Isa::Avx512;
    let pf = super::prefetch(w.isa);
    run_tiles(
        (m, w.n),
        (mr, MC),
        wide,
        (p0, p1),
        out,
        y,
        |p, width, g0, rows, t| {
            let gi = g0 / mr;
            let ag = a.as_ptr().add(gi * blocks * units * mr);
            let sg = s.as_ptr().add(gi * blocks * mr);
            tile_at(w, p, width, rows, ag, sg, t, pf);
        },
    );
}

/// Rows `0..rows` of one row group (`ag` / `sg`: its units and scales) × panels
/// `p..p + width` (`width` 2 only under AVX-512) of `w` into `out`.
///
/// # Safety
/// The CPU has `w`'s ISA; the row group and panels are within `w` and the rounded rows.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_at(
    w: &PackedQ8,
    p: usize,
    width: usize,
    rows: usize,
    ag: *const u32,
    sg: *const f32,
    out: &mut Tile,
    pf: usize,
) {
    let blocks = w.k / BLOCK;
    let wp = w.q.as_ptr().add(p * blocks * PANEL_BLOCK);
    let dp = w.d.as_ptr().add(p * blocks * NR);
    // one arm per tile height: `$r` rows, the tile's kernel at that height
    macro_rules! by_rows {
        ($call:ident; $($r:literal)*) => {
            match rows {
                $($r => $call!($r),)*
                _ => unreachable!("a tile of {rows} rows (at most the level's tile)"),
            }
        };
    }
    match w.isa {
        Isa::Avx2 => {
            macro_rules! go {
                ($r:literal) => {
                    tile_avx2::<$r>(blocks, ag, sg, wp, dp, out)
                };
            }
            by_rows!(go; 1 2 3 4)
        }
        Isa::AvxVnni => {
            let op = w.offset.as_ptr().add(p * blocks * NR);
            macro_rules! go {
                ($r:literal) => {
                    match pf {
                        0 => tile_vnni256::<$r, false>(blocks, ag, sg, wp, dp, op, out, 0),
                        _ => tile_vnni256::<$r, true>(blocks, ag, sg, wp, dp, op, out, pf),
                    }
                };
            }
            by_rows!(go; 1 2 3 4 5 6)
        }
        Isa::Avx512 => {
            let op = w.offset.as_ptr().add(p * blocks * NR);
            let (ws, ds) = (blocks * PANEL_BLOCK, blocks * NR);
            macro_rules! go {
                ($r:literal) => {
                    match (width, pf) {
                        (2, 0) => {
                            tile_avx512::<$r, 2, false>(blocks, ag, sg, wp, ws, dp, op, ds, out, 0)
                        }
                        (2, _) => {
                            tile_avx512::<$r, 2, true>(blocks, ag, sg, wp, ws, dp, op, ds, out, pf)
                        }
                        (_, 0) => {
                            tile_avx512::<$r, 1, false>(blocks, ag, sg, wp, ws, dp, op, ds, out, 0)
                        }
                        (_, _) => {
                            tile_avx512::<$r, 1, true>(blocks, ag, sg, wp, ws, dp, op, ds, out, pf)
                        }
                    }
                };
            }
            by_rows!(go; 1 2 3 4 5 6)
        }
    }
}
