//! The 4-bit W4A8 GEMM on x86: the activations rounded per row and block, the split over panels
//! and threads, and the tile loop; the tiles of each instruction set live in [`avx2`], [`vnni`]
//! (AVX-VNNI) and [`avx512`].

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::qgemm::x86_rounded;
use super::super::tile_store::{by_panel_runs, run_tiles, Out, Tile};
use super::{mr, Isa, PackedQ4, BLOCK, MC, MR_AVX2, MR_AVX512, NR, PANEL_BITS, PANEL_BLOCK};

mod avx2;
mod avx512;
mod vnni;

use avx2::tile_avx2;
use avx512::tile_avx512;
use vnni::tile_vnni256;

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

/// One panel's `A` / `B` multipliers and factors (see [`PackedQ4`]): the tiles compute each
/// block's `A = da·ma` and `B = db·mb` for the panel's 16 columns.
#[derive(Clone, Copy)]
pub(super) struct Scales {
    ma: *const u8,
    mb: *const u8,
    da: *const f32,
    db: *const f32,
    shift: u32,
}

impl Scales {
    /// Panel `p` of `w`.
    ///
    /// # Safety
    /// `p` is a panel of `w`.
    unsafe fn panel(w: &PackedQ4, p: usize) -> Self {
        let blocks = w.k / BLOCK;
        let groups = blocks >> w.shift;
        // `Q4_0` and `Q5_0` keep one factor, `d`, for both
        let db = match w.format {
            super::Q4Format::Q4_0 | super::Q4Format::Q5_0 => w.da.as_ptr(),
            super::Q4Format::Q4K => w.db.as_ptr(),
        };
        Scales {
            ma: w.ma.as_ptr().add(p * blocks * NR),
            mb: w.mb.as_ptr().add(p * blocks * NR),
            da: w.da.as_ptr().add(p * groups * NR),
            db: db.add(p * groups * NR),
            shift: w.shift,
        }
    }

    /// Block `b`'s `(ma, mb, da, db)`, each at the panel's first column.
    ///
    /// # Safety
    /// `b` is a block of the weight.
    #[inline(always)]
    unsafe fn block(&self, b: usize) -> (*const u8, *const u8, *const f32, *const f32) {
        let g = (b >> self.shift) * NR;
        (
            self.ma.add(b * NR),
            self.mb.add(b * NR),
            self.da.add(g),
            self.db.add(g),
        )
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
    let five = w.format.five_bits();
    // the panel's fifth bits (`Q5_0`; never read otherwise)
    let hp = match five {
        true => w.qh.as_ptr().add(p * blocks * PANEL_BITS),
        false => std::ptr::null(),
    };
    let sp = Scales::panel(w, p);
    match w.isa {
        Isa::Avx2 => {
            macro_rules! go {
                ($r:literal) => {
                    match five {
                        true => tile_avx2::<$r, true>(blocks, ug, sg, tg, wp, hp, &sp, out),
                        false => tile_avx2::<$r, false>(blocks, ug, sg, tg, wp, hp, &sp, out),
                    }
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
                    match five {
                        true => tile_vnni256::<$r, true>(blocks, ug, sg, tg, wp, hp, &sp, out),
                        false => tile_vnni256::<$r, false>(blocks, ug, sg, tg, wp, hp, &sp, out),
                    }
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
            let ws = blocks * PANEL_BLOCK;
            let hs = blocks * PANEL_BITS;
            let pair = [
                sp,
                if width == 2 {
                    Scales::panel(w, p + 1)
                } else {
                    sp
                },
            ];
            let planes = Planes {
                w: wp,
                wstride: ws,
                h: hp,
                hstride: hs,
            };
            macro_rules! go {
                ($r:literal) => {
                    match (width, five) {
                        (2, true) => {
                            tile_avx512::<$r, 2, true>(blocks, ug, sg, tg, planes, &pair, out)
                        }
                        (2, false) => {
                            tile_avx512::<$r, 2, false>(blocks, ug, sg, tg, planes, &pair, out)
                        }
                        (_, true) => {
                            tile_avx512::<$r, 1, true>(blocks, ug, sg, tg, planes, &[sp], out)
                        }
                        (_, false) => {
                            tile_avx512::<$r, 1, false>(blocks, ug, sg, tg, planes, &[sp], out)
                        }
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

/// Where a tile's panels keep their values: the first panel's 4-bit values `w` (the next panel's
/// `wstride` bytes on) and fifth bits `h` (`hstride` on; null for the 4-bit formats).
#[derive(Clone, Copy)]
pub(super) struct Planes {
    w: *const u8,
    wstride: usize,
    h: *const u8,
    hstride: usize,
}
