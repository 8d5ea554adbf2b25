//! The one-part (bf16) product on the AMX tiles written in place: the form `--quantize bf16`
//! layers run where AMX does ([`super::bf16_product`], [`super::bf16_swiglu_product`]).
//!
//! Each 32 × 32 output block (two row tiles × a panel pair) accumulates its whole `k` in C tiles
//! 0–3, one `tdpbf16ps` per tile pair and 32-`k` step in `k` order, exactly as
//! [`super::tiles::product`] does: the two agree bit for bit (tested). What differs is where the
//! time went there:
//!
//! - **The output**: the C tiles are stored straight into `y (m, n)` (row stride `n`), not into a
//!   zero-initialised padded copy that is copied again when `m` or `n` is ragged. Only a block
//!   that is ragged itself (the last rows, a partial last panel) goes through a 4 KiB scratch.
//! - **The order**: per thread a run of panel pairs (disjoint columns); the run's weight in
//!   blocks of panel pairs of at most [`WEIGHT_BLOCK_BYTES`], each block read from memory once
//!   and kept in L2 while every row pair of a row chunk passes; the packed activations in row
//!   chunks of at most [`ROW_CHUNK_BYTES`], kept in L2 while the run's blocks pass. Consecutive
//!   output blocks share their 32 rows, so their stores stay on the same pages.
//! - **The SwiGLU** ([`Epilogue::SwiGlu`]): over a gate | up weight whose panels alternate
//!   (gate's `p`, up's `p`: [`super::AmxWeight::gate_up`]), a panel pair's C tiles are the gate
//!   and the up columns of the same 16 outputs; `SiLU(gate) · up` is taken from the scratch by
//!   [`crate::cpu::math::silu_mul_rows16`] (the lanes of the pass over whole rows, so equal to
//!   the stacked product followed by that pass bit for bit) and only the `(m, n / 2)` result is
//!   written.

use std::arch::asm;

use super::tiles::{config, pack_rows, step_one, store, zero_c, TILE};
use super::{Aligned, AmxWeight, Parts, NR};

/// Weight bytes of one block of panel pairs: read from memory once per row chunk and kept in
/// L2 (2 MiB per core on the AMX Xeons) beside a row chunk of activations.
pub(super) const WEIGHT_BLOCK_BYTES: usize = 512 * 1024;
/// Packed-activation bytes of one row chunk, kept in L2 while the run's weight blocks pass.
pub(super) const ROW_CHUNK_BYTES: usize = 1024 * 1024;

/// What a product writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Epilogue {
    /// `y (m, n)`.
    Product,
    /// `y (m, n / 2)`: SiLU of each panel pair's first panel times its second.
    SwiGlu,
}

/// `x (m, k) · Wᵀ` for a one-part weight: `(m, n)`, or with [`Epilogue::SwiGlu`] over an
/// alternating gate | up weight `(m, n / 2)`. The caller checked that AMX runs, that `x` is
/// `m` rows of `k` and, for the SwiGLU, that the weight alternates whole panel pairs.
pub(super) fn product(x: &[f32], m: usize, w: &AmxWeight, out: Epilogue) -> Vec<f32> {
    debug_assert_eq!(w.parts, Parts::One);
    let (n, k, kp) = (w.n, w.k, w.kp);
    let cols = match out {
        Epilogue::Product => n,
        Epilogue::SwiGlu => n / 2,
    };
    let a = pack_rows(x, m, k, kp, Parts::One);
    let zero = Aligned::<u16>::zeroed(kp * NR);
    let mut y: Vec<f32> = Vec::with_capacity(m * cols);
    let y_addr = y.as_mut_ptr() as usize;
    let run = Run {
        a: &a,
        plane: &w.planes[0],
        zero: &zero,
        kp,
        steps: kp / super::KSTEP,
        m,
        n,
        cols,
        y: y_addr as *mut f32,
        out,
    };
    crate::cpu::host::for_panel_runs(n.div_ceil(NR), true, |p0, p1| {
        // SAFETY: AMX runs here (the caller checked); `a` holds ⌈m/32⌉ packed row pairs of
        // `kp`, the plane ⌈n/16⌉ panels of `kp`, `zero` one panel; `y` has capacity
        // m · cols and the runs write disjoint columns of it.
        unsafe { run.panels(p0, p1) }
    });
    // SAFETY: the runs cover every panel pair and each every row pair, so every element of
    // the m · cols output was written once.
    unsafe { y.set_len(m * cols) };
    y
}

/// One product's operands, shared by its threads' runs.
struct Run<'a> {
    /// The packed activations ([`pack_rows`], one part).
    a: &'a [u16],
    /// The weight's one plane.
    plane: &'a [u16],
    /// A zero panel, the partner of an odd last panel.
    zero: &'a [u16],
    kp: usize,
    steps: usize,
    m: usize,
    n: usize,
    /// Columns of `y`.
    cols: usize,
    y: *mut f32,
    out: Epilogue,
}

// SAFETY: the runs write disjoint columns of `y` (see `product`).
unsafe impl Sync for Run<'_> {}

impl Run<'_> {
    /// Panel pairs `p0..p1` (`p0` even) for every row pair, in weight blocks and row chunks.
    unsafe fn panels(&self, p0: usize, p1: usize) {
        let cfg = config();
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        // bytes of one panel pair's weight, and of one row pair's activations
        let pair_bytes = (2 * self.kp * NR * 2).max(1);
        let rows_bytes = (32 * self.kp * 2).max(1);
        let nb = (WEIGHT_BLOCK_BYTES / pair_bytes).max(1);
        let chunk = (ROW_CHUNK_BYTES / rows_bytes).max(1);
        let pairs = self.m.div_ceil(32);
        let mut scratch = Aligned::<f32>::zeroed(32 * 32);
        let s = scratch.as_mut_ptr();
        for rc in (0..pairs).step_by(chunk) {
            for pb in (p0..p1).step_by(2 * nb) {
                let pe = (pb + 2 * nb).min(p1);
                for rp in rc..(rc + chunk).min(pairs) {
                    for p in (pb..pe).step_by(2) {
                        self.block(rp, p, p + 1 < p1, s);
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }

    /// The 32 × 32 block of row pair `rp` and panels `p`, `p + 1` (the zero panel for the
    /// second unless `pair`), its whole `k`, then its store.
    unsafe fn block(&self, rp: usize, p: usize, pair: bool, scratch: *mut f32) {
        let kp = self.kp;
        zero_c!();
        let ar = self.a.as_ptr().add(rp * self.steps * 2 * TILE);
        let b0 = self.plane.as_ptr().add(p * kp * NR);
        let b1 = match pair {
            true => self.plane.as_ptr().add((p + 1) * kp * NR),
            false => self.zero.as_ptr(),
        };
        for ks in 0..self.steps {
            step_one(ar.add(ks * 2 * TILE), [b0.add(ks * TILE), b1.add(ks * TILE)]);
        }
        let r0 = rp * 32;
        let rows = 32.min(self.m - r0);
        match self.out {
            Epilogue::Product => {
                let (n, c0) = (self.n, p * NR);
                let width = (2 * NR).min(n - c0);
                if rows == 32 && width == 2 * NR {
                    let y0 = self.y.add(r0 * n + c0);
                    store!(0, y0, n * 4);
                    store!(1, y0.add(NR), n * 4);
                    store!(2, y0.add(16 * n), n * 4);
                    store!(3, y0.add(16 * n + NR), n * 4);
                    return;
                }
                to_scratch(scratch);
                for r in 0..rows {
                    std::ptr::copy_nonoverlapping(
                        scratch.add(r * 32),
                        self.y.add((r0 + r) * n + c0),
                        width,
                    );
                }
            }
            Epilogue::SwiGlu => {
                to_scratch(scratch);
                crate::cpu::math::silu_mul_rows16(
                    rows,
                    (scratch, 32),
                    (scratch.add(NR), 32),
                    (self.y.add(r0 * self.cols + (p / 2) * NR), self.cols),
                );
            }
        }
    }
}

/// C tiles 0–3 into the 32 × 32 row-major `scratch` (tile (i, j) at row 16·i, column 16·j).
#[inline(always)]
unsafe fn to_scratch(scratch: *mut f32) {
    store!(0, scratch, 128usize);
    store!(1, scratch.add(16), 128usize);
    store!(2, scratch.add(16 * 32), 128usize);
    store!(3, scratch.add(16 * 32 + 16), 128usize);
}
