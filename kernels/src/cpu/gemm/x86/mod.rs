//! The packed f32 GEMM on x86: row packing, the split over panels and threads, and the tile
//! loop; the micro-kernels of each instruction set live in [`avx2`] and [`avx512`].

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::super::tile_store::Out;
use super::{Blocking, Isa, PackedWeight, NR};

mod avx2;
mod avx512;

use avx2::micro_rows;
use avx512::micro512_rows;
pub(crate) use avx512::{load_acc512, store_acc512};

/// `x (m, k)` into groups of `mr` rows, k-major: `a[g][kk][r] = x[g·mr + r][kk]`
/// (missing rows of the last group are 0).
fn pack_rows(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<f32> {
    let groups = m.div_ceil(mr);
    let mut a = vec![0f32; groups * mr * k];
    a.par_chunks_mut(mr * k).enumerate().for_each(|(g, dst)| {
        for r in 0..mr.min(m - g * mr) {
            let src = &x[(g * mr + r) * k..][..k];
            for (kk, &v) in src.iter().enumerate() {
                dst[kk * mr + r] = v;
            }
        }
    });
    a
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panels each), with
/// the microkernels of `isa` (supported by the CPU: the caller checked) and blocking `bl`
/// (validated for `isa`: [`Blocking::parse`]).
pub(super) fn product(x: &[f32], m: usize, w: &PackedWeight, isa: Isa, bl: &Blocking) -> Vec<f32> {
    product_out(x, m, w, isa, bl, Out::Product)
}

/// [`product`], or (`Out::SwiGlu`: a weight of [`PackedWeight::gate_up`], `k ≤
/// bl.short_k`, the caller checked) its SwiGLU `(m, n / 2)`.
pub(super) fn product_out(
    x: &[f32],
    m: usize,
    w: &PackedWeight,
    isa: Isa,
    bl: &Blocking,
    out: Out,
) -> Vec<f32> {
    let a = pack_rows(x, m, w.k, bl.mr);
    let mr = bl.mr;
    let paired = isa == Isa::Avx512;
    // SAFETY: the CPU has `isa` (the caller checked); `a` holds ⌈m/mr⌉·mr·k and the panels
    // ⌈n/16⌉·k·16 elements, the layout `product_with` reads.
    unsafe {
        product_with(
            &a,
            m,
            w.n,
            w.k,
            &w.panels,
            paired,
            bl,
            out,
            |t: Tile<f32>| match isa {
                Isa::Avx512 => micro512_rows(
                    t.rows, t.panels, t.kc, t.a, mr, t.b, t.bstride, t.c, t.ldc, t.first, bl.pf,
                ),
                Isa::Avx2 | Isa::AvxVnni => {
                    micro_rows(t.rows, t.kc, t.a, mr, t.b, t.c, t.ldc, t.first, bl.pf)
                }
            },
        )
    }
}

/// One microkernel call of [`product_with`]: `C (rows, 16·panels) (+)= A (rows, kc) ·
/// [B₀ B₁] (kc, 16·panels)`, `a` a packed row group at its `k` block (`mr` units per `k`),
/// `b` the first panel at its block, the second `bstride` units after it, `c` row-major
/// with row stride `ldc`; `first` overwrites `C`.
pub(crate) struct Tile<T> {
    pub rows: usize,
    pub panels: usize,
    pub kc: usize,
    pub a: *const T,
    pub b: *const T,
    pub bstride: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub first: bool,
}

/// `y (m, n) = A · Wᵀ` for any kernel whose operands have this module's packed layout in
/// units of `T` (an f32 here; a pair of bf16 in [`super::super::bf16gemm`]): `a` the
/// activations in groups of `bl.mr` rows (`[group][k][row]`, the last group zero-padded),
/// `panels` the weight's `(⌈n/16⌉, k, 16)`, `k` counted in units. The panels are split into
/// one run per rayon thread (`paired`: runs of whole panel pairs, for two-panel tiles),
/// each walked in [`Blocking`] `bl`'s blocks, `tile` computing one tile.
///
/// # Safety
/// `a` and `panels` hold the elements that layout implies, and `tile` is safe to call on
/// this CPU with such pointers.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_with<T: Sync>(
    a: &[T],
    m: usize,
    n: usize,
    k: usize,
    panels: &[T],
    paired: bool,
    bl: &Blocking,
    out: Out,
    tile: impl Fn(Tile<T>) + Sync,
) -> Vec<f32> {
    let count = n.div_ceil(NR);
    let cols = out.cols(n);
    let mut y: Vec<f32> = Vec::with_capacity(m * cols);
    let y_addr = y.as_mut_ptr() as usize;
    let pairs = paired || out == Out::SwiGlu;
    super::super::host::for_panel_runs(count, pairs, |p0, p1| {
        // SAFETY: as the caller promised; `y` has capacity m·n and runs of panels write
        // disjoint columns.
        unsafe {
            run(
                a,
                m,
                n,
                k,
                panels,
                p0,
                p1,
                y_addr as *mut f32,
                paired,
                bl,
                out,
                &tile,
            )
        };
    });
    // SAFETY: every column of every row was written (the panel runs cover 0..n, and the
    // first k block of each tile overwrites its output; with the SwiGLU every pair's 16
    // columns of every row block).
    unsafe { y.set_len(m * cols) };
    y
}

/// Panels `p0..p1` of [`product_with`]'s product into `y (m, n)`, or (`Out::SwiGlu`: `p0`,
/// `p1` even, `k ≤ bl.short_k`, no ragged panel) each block of rows and panels into a
/// scratch block, then its SwiGLU into `y (m, n / 2)`.
#[allow(clippy::too_many_arguments)]
unsafe fn run<T>(
    a: &[T],
    m: usize,
    n: usize,
    k: usize,
    panels: &[T],
    p0: usize,
    p1: usize,
    y: *mut f32,
    paired: bool,
    bl: &Blocking,
    out: Out,
    tile: &impl Fn(Tile<T>),
) {
    let mr = bl.mr;
    let swiglu = out == Out::SwiGlu;
    // the SwiGLU's block of (mc rows, nc panels), row stride nc · 16
    let mut scratch = match swiglu {
        true => vec![0f32; bl.mc * bl.nc * NR],
        false => Vec::new(),
    };
    let scratch_ptr = scratch.as_mut_ptr();
    // a ragged last panel goes to a scratch strip (m, 16), copied out at the end
    let ragged = !n.is_multiple_of(NR) && p1 == n.div_ceil(NR);
    let mut strip = if ragged {
        vec![0f32; m * NR]
    } else {
        Vec::new()
    };
    let strip_ptr = strip.as_mut_ptr();
    let block = |jc: usize, ic: usize, pc: usize| {
        let je = (jc + bl.nc).min(p1);
        let mc = bl.mc.min(m - ic);
        let kc = bl.kc.min(k - pc);
        let mut p = jc;
        while p < je {
            let b = panels.as_ptr().add((p * k + pc) * NR);
            let in_strip = ragged && p == p1 - 1;
            // row `row0` of the output is at `c0` (the scratch block starts at the row
            // block's first row)
            let (c0, ldc, row0) = match (in_strip, swiglu) {
                (true, _) => (strip_ptr, NR, 0),
                (false, true) => (scratch_ptr.add((p - jc) * NR), bl.nc * NR, ic),
                (false, false) => (y.add(p * NR), n, 0),
            };
            // two-panel tiles pair a panel with the next unless that one is the strip's
            let pair = paired && p + 1 < je && !(ragged && p + 1 == p1 - 1);
            let count = if pair { 2 } else { 1 };
            let mut ir = 0;
            while ir < mc {
                // `ic` and `ir` are multiples of `mr`, so `row` starts a packed group
                let rows = mr.min(mc - ir);
                let row = ic + ir;
                tile(Tile {
                    rows,
                    panels: count,
                    kc,
                    a: a.as_ptr().add(row * k + pc * mr),
                    b,
                    bstride: k * NR,
                    c: c0.add((row - row0) * ldc),
                    ldc,
                    first: pc == 0,
                });
                ir += rows;
            }
            p += count;
        }
    };
    if k <= bl.short_k {
        for jc in (p0..p1).step_by(bl.nc) {
            for ic in (0..m).step_by(bl.mc) {
                for pc in (0..k).step_by(bl.kc) {
                    block(jc, ic, pc);
                }
                if swiglu {
                    // the block is whole: its pairs (gate, up) through SiLU(gate) · up
                    let (je, mc) = ((jc + bl.nc).min(p1), bl.mc.min(m - ic));
                    let (ld, f) = (bl.nc * NR, n / 2);
                    for q in (jc..je).step_by(2) {
                        super::super::math::silu_mul_rows16(
                            mc,
                            (scratch_ptr.add((q - jc) * NR), ld),
                            (scratch_ptr.add((q + 1 - jc) * NR), ld),
                            (y.add(ic * f + q / 2 * NR), f),
                        );
                    }
                }
            }
        }
    } else {
        for pc in (0..k).step_by(bl.kc) {
            for jc in (p0..p1).step_by(bl.nc) {
                for ic in (0..m).step_by(bl.mc) {
                    block(jc, ic, pc);
                }
            }
        }
    }
    if ragged {
        let (col0, width) = ((p1 - 1) * NR, n % NR);
        for r in 0..m {
            std::ptr::copy_nonoverlapping(strip.as_ptr().add(r * NR), y.add(r * n + col0), width);
        }
    }
}
