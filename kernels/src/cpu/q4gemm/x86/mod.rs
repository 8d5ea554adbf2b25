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

use avx2::{tile6_avx2, tile_avx2};
use avx512::{tile6_avx512, tile_avx512};
use vnni::{tile6_vnni256, tile_vnni256};

/// Broadcast units per block: 8 of four `i8`.
const UNITS: usize = BLOCK / 4;

/// A row group's rounded activations: the units `[group][block][unit][row]`, the scales,
/// the sums and the sums of the first 16 values `[group][block][row]` (rows past `m` are
/// zero).
pub(super) struct Rows {
    units: Vec<u32>,
    scale: Vec<f32>,
    sum: Vec<f32>,
    low: Vec<f32>,
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
    let mut low = vec![0f32; groups * blocks * mr];
    units
        .par_chunks_mut(blocks * UNITS * mr)
        .zip(scale.par_chunks_mut(blocks * mr))
        .zip(sum.par_chunks_mut(blocks * mr))
        .zip(low.par_chunks_mut(blocks * mr))
        .enumerate()
        .for_each(|(gi, (((u, d), s), l))| {
            for r in 0..mr.min(m - gi * mr) {
                let row = &x[(gi * mr + r) * k..][..k];
                for (b, xs) in row.chunks_exact(BLOCK).enumerate() {
                    // SAFETY: the CPU has AVX2 + FMA; `xs` holds 32 floats and `u` the
                    // block's 8 units, `mr` apart, from this one.
                    let (dv, sv, lv) =
                        unsafe { signed_units(xs, u.as_mut_ptr().add(b * UNITS * mr + r), mr) };
                    d[b * mr + r] = dv;
                    s[b * mr + r] = sv as f32;
                    l[b * mr + r] = lv as f32;
                }
            }
        });
    Rows {
        units,
        scale,
        sum,
        low,
    }
}

/// `xs` (32 floats) rounded as the `Q8_0` kernel rounds, written as 8 units of four `i8`
/// (`stride` units apart); returns the scale, the sum of the rounded values and the sum of the
/// first 16.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn signed_units(xs: &[f32], out: *mut u32, stride: usize) -> (f32, i32, i32) {
    let (d, q) = x86_rounded(xs);
    let (low, high) = (_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let mut lanes = [0i32; 8];
    let mut low_lanes = [0i32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, high);
    _mm256_storeu_si256(low_lanes.as_mut_ptr() as *mut __m256i, low);
    // i32 -> i16 -> i8, each pack interleaving 128-bit lanes; 0xD8 restores the order
    let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
    let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
    let b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
    let mut units = [0u32; UNITS];
    _mm256_storeu_si256(units.as_mut_ptr() as *mut __m256i, b);
    for (g, &unit) in units.iter().enumerate() {
        *out.add(g * stride) = unit;
    }
    let low: i32 = low_lanes.iter().sum();
    (d, low + lanes.iter().sum::<i32>(), low)
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
        // only `Q4_K` keeps a second factor; the others' `B` factor is `d`
        let db = match w.format {
            super::Q4Format::Q4K => w.db.as_ptr(),
            _ => w.da.as_ptr(),
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
            let group = Group {
                units: rows.units.as_ptr().add(gi * blocks * UNITS * mr),
                scale: rows.scale.as_ptr().add(gi * blocks * mr),
                sum: rows.sum.as_ptr().add(gi * blocks * mr),
                low: rows.low.as_ptr().add(gi * blocks * mr),
            };
            tile_at(w, p, width, count, group, t);
        },
    );
}

/// One row group's rounded activations, as [`Rows`] holds them.
#[derive(Clone, Copy)]
pub(super) struct Group {
    units: *const u32,
    scale: *const f32,
    sum: *const f32,
    low: *const f32,
}

/// Rows `0..count` of one row group × panels `p..p + width` (`width` 2 only under AVX-512) of
/// `w` into `out`.
///
/// # Safety
/// The CPU has `w`'s ISA; the row group and panels are within `w` and the rounded rows.
unsafe fn tile_at(w: &PackedQ4, p: usize, width: usize, count: usize, rg: Group, out: &mut Tile) {
    let blocks = w.k / BLOCK;
    let bits = PANEL_BITS * w.format.high_bits();
    let planes = Planes {
        w: w.q.as_ptr().add(p * blocks * PANEL_BLOCK),
        wstride: blocks * PANEL_BLOCK,
        // the panels' high bits (none for the 4-bit formats: never read)
        h: w.qh.as_ptr().wrapping_add(p * blocks * bits),
        hstride: blocks * bits,
    };
    let sp = Scales::panel(w, p);
    let pair = [
        sp,
        match width {
            2 => Scales::panel(w, p + 1),
            _ => sp,
        },
    ];
    use super::Q4Format::{Q4K, Q4_0, Q5_0, Q6K};
    let format = w.format;
    macro_rules! narrow {
        ($tile:ident, $tile6:ident) => {{
            macro_rules! go {
                ($r:literal) => {
                    match format {
                        Q4_0 | Q4K => $tile::<$r, false>(blocks, rg, planes, &sp, out),
                        Q5_0 => $tile::<$r, true>(blocks, rg, planes, &sp, out),
                        Q6K => $tile6::<$r>(blocks, rg, planes, &sp, out),
                    }
                };
            }
            match count {
                4 => go!(4),
                3 => go!(3),
                2 => go!(2),
                _ => go!(1),
            }
        }};
    }
    match w.isa {
        Isa::Avx2 => narrow!(tile_avx2, tile6_avx2),
        Isa::AvxVnni => narrow!(tile_vnni256, tile6_vnni256),
        Isa::Avx512 => {
            macro_rules! go {
                ($r:literal) => {
                    match (width, format) {
                        (2, Q4_0 | Q4K) => {
                            tile_avx512::<$r, 2, false>(blocks, rg, planes, &pair, out)
                        }
                        (2, Q5_0) => tile_avx512::<$r, 2, true>(blocks, rg, planes, &pair, out),
                        (2, Q6K) => tile6_avx512::<$r, 2>(blocks, rg, planes, &pair, out),
                        (_, Q4_0 | Q4K) => {
                            tile_avx512::<$r, 1, false>(blocks, rg, planes, &[sp], out)
                        }
                        (_, Q5_0) => tile_avx512::<$r, 1, true>(blocks, rg, planes, &[sp], out),
                        (_, Q6K) => tile6_avx512::<$r, 1>(blocks, rg, planes, &[sp], out),
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

/// Where a tile's panels keep their values: the first panel's low nibbles `w` (the next panel's
/// `wstride` bytes on) and high bits `h` (`hstride` on; not to be read for the 4-bit formats).
#[derive(Clone, Copy)]
pub(super) struct Planes {
    w: *const u8,
    wstride: usize,
    h: *const u8,
    hstride: usize,
}
