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
//!   chunks of at most [`ROW_CHUNK_BYTES`], kept in L2 while the run's blocks pass. Where every
//!   row's activations outgrow that budget (a wide `k`: an MLP's down product) `k` is cut into
//!   chunks first, so a chunk's activations and a weight block both stay in L2; the C tiles are
//!   stored and reloaded between chunks (in `y` itself, or a small slot for a ragged block),
//!   which changes no sum: each C tile still takes its steps in `k` order. Consecutive output
//!   blocks share their 32 rows, so their stores stay on the same pages.
//! - **The SwiGLU** ([`Epilogue::SwiGlu`]): over a gate | up weight whose panels alternate
//!   (gate's `p`, up's `p`: [`super::AmxWeight::gate_up`]), a panel pair's C tiles are the gate
//!   and the up columns of the same 16 outputs; `SiLU(gate) · up` is taken from the scratch by
//!   [`crate::cpu::math::silu_mul_rows16`] (the lanes of the pass over whole rows, so equal to
//!   the stacked product followed by that pass bit for bit) and only the `(m, n / 2)` result is
//!   written.

use std::arch::asm;

use super::tiles::{config, load_c, pack_rows, step_one, store, zero_c};
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

/// What the tiles multiply, and how a block's C tiles become outputs.
#[derive(Clone, Copy)]
pub(super) enum Kind<'a> {
    /// bf16 × bf16 summed in f32 (`tdpbf16ps`): the C tiles are the outputs.
    Bf16,
    /// int8 × int8 summed in i32 (`tdpbssd`): output `(r, c)` is the sum, as f32, times
    /// `rows[r] · cols[c]` (the row's activation scale, the column's weight scale).
    Int8 { rows: &'a [f32], cols: &'a [f32] },
}

/// `x (m, k) · Wᵀ` for a one-part weight: `(m, n)`, or with [`Epilogue::SwiGlu`] over an
/// alternating gate | up weight `(m, n / 2)`. The caller checked that AMX runs, that `x` is
/// `m` rows of `k` and, for the SwiGLU, that the weight alternates whole panel pairs.
pub(super) fn product(x: &[f32], m: usize, w: &AmxWeight, out: Epilogue) -> Vec<f32> {
    debug_assert_eq!(w.parts, Parts::One);
    let a = pack_rows(x, m, w.k, w.kp, Parts::One);
    let operands = Operands {
        a: a.as_ptr() as *const u8,
        plane: w.planes[0].as_ptr() as *const u8,
        steps: w.kp / super::KSTEP,
        n: w.n,
    };
    run_product(&operands, m, out, Kind::Bf16)
}

/// The packed operands of one product: `steps` tile steps of 1 KiB tiles (A: per row pair
/// and step its two row tiles; the weight: per panel `steps` B tiles), `n` outputs.
pub(super) struct Operands {
    pub a: *const u8,
    pub plane: *const u8,
    pub steps: usize,
    pub n: usize,
}

/// The product of packed `operands` over `m` rows on the rayon threads (one run of panel
/// pairs each), written as `out` asks.
pub(super) fn run_product(operands: &Operands, m: usize, out: Epilogue, kind: Kind) -> Vec<f32> {
    let n = operands.n;
    let cols = match out {
        Epilogue::Product => n,
        Epilogue::SwiGlu => n / 2,
    };
    let zero = Aligned::<u8>::zeroed(operands.steps * TILE_BYTES);
    let mut y: Vec<f32> = Vec::with_capacity(m * cols);
    let y_addr = y.as_mut_ptr() as usize;
    let run = Run {
        a: operands.a,
        plane: operands.plane,
        zero: zero.as_ptr(),
        steps: operands.steps,
        m,
        n,
        cols,
        y: y_addr as *mut f32,
        out,
        kind,
    };
    crate::cpu::host::for_panel_runs(n.div_ceil(NR), true, |p0, p1| {
        // SAFETY: AMX runs here (the caller checked); `a` holds ⌈m/32⌉ packed row pairs of
        // `steps` steps, the plane ⌈n/16⌉ panels of `steps` tiles, `zero` one panel; `y` has
        // capacity m · cols and the runs write disjoint columns of it.
        unsafe { run.panels(p0, p1) }
    });
    // SAFETY: the runs cover every panel pair and each every row pair, so every element of
    // the m · cols output was written once.
    unsafe { y.set_len(m * cols) };
    y
}

/// Bytes of one tile (16 rows of 64 bytes), A's or B's.
const TILE_BYTES: usize = 1024;

/// One product's operands, shared by its threads' runs.
struct Run<'a> {
    /// The packed activations: per row pair `steps` × two row tiles.
    a: *const u8,
    /// The weight's panels, `steps` B tiles each.
    plane: *const u8,
    /// A zero panel, the partner of an odd last panel.
    zero: *const u8,
    steps: usize,
    m: usize,
    n: usize,
    /// Columns of `y`.
    cols: usize,
    y: *mut f32,
    out: Epilogue,
    kind: Kind<'a>,
}

// SAFETY: the runs only read the operands and write disjoint columns of `y` (see
// `run_product`).
unsafe impl Sync for Run<'_> {}

impl Run<'_> {
    /// Panel pairs `p0..p1` (`p0` even) for every row pair, in `k` chunks, row chunks and
    /// weight blocks.
    unsafe fn panels(&self, p0: usize, p1: usize) {
        let cfg = config();
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        let pairs = self.m.div_ceil(32);
        // bytes of one 32-`k` step of one row pair's activations, or one panel pair's weight
        let step_bytes = 2 * TILE_BYTES;
        // `k` chunk: all of `k` unless every row's activations outgrow the row budget (a wide
        // `k`, e.g. an MLP's down product); then as many steps as the budget holds (at least
        // 8), the C tiles stored and reloaded between chunks. The SwiGLU needs both halves whole
        // at its store, so it takes all of `k` (its `k` is the model width).
        let kc = match self.out {
            Epilogue::SwiGlu => self.steps.max(1),
            Epilogue::Product => {
                let fit = ROW_CHUNK_BYTES / (pairs * step_bytes).max(1);
                let chunks = self.steps.div_ceil(fit.clamp(8, self.steps.max(8)));
                self.steps.div_ceil(chunks.max(1)).max(1)
            }
        };
        let chunk = (ROW_CHUNK_BYTES / (kc * step_bytes)).max(1);
        let nb = (WEIGHT_BLOCK_BYTES / (kc * step_bytes)).max(1);
        // partial C tiles of blocks that are not whole (the last rows, a ragged last panel)
        // between `k` chunks: one 32 × 32 slot per such block
        let run_pairs = (p1 - p0).div_ceil(2);
        let chunked = kc < self.steps;
        let mut edge = Aligned::<f32>::zeroed(if chunked { run_pairs + pairs } else { 1 } * 1024);
        let mut scratch = Aligned::<f32>::zeroed(32 * 32);
        let (e, s) = (edge.as_mut_ptr(), scratch.as_mut_ptr());
        for k0 in (0..self.steps.max(1)).step_by(kc) {
            let ks = k0..(k0 + kc).min(self.steps);
            for rc in (0..pairs).step_by(chunk) {
                for pb in (p0..p1).step_by(2 * nb) {
                    let pe = (pb + 2 * nb).min(p1);
                    for rp in rc..(rc + chunk).min(pairs) {
                        for p in (pb..pe).step_by(2) {
                            let slot = match (chunked, rp + 1 == pairs && self.m % 32 != 0) {
                                (false, _) => 0,
                                (true, true) => (p - p0) / 2,
                                (true, false) => run_pairs + rp,
                            };
                            let at = Block {
                                rp,
                                p,
                                pair: p + 1 < p1,
                            };
                            self.block(&at, ks.clone(), e.add(slot * 1024), s);
                        }
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }

    /// Steps `ks` of `at`'s 32 × 32 block: its C tiles start from zero at step 0, else from
    /// where the previous `k` chunk left them (`y` for a whole block, as raw f32 or i32 sums;
    /// its `edge` slot otherwise); after the last step, its store.
    unsafe fn block(
        &self,
        at: &Block,
        ks: std::ops::Range<usize>,
        edge: *mut f32,
        scratch: *mut f32,
    ) {
        let n = self.n;
        let (r0, c0) = (at.rp * 32, at.p * NR);
        let rows = 32.min(self.m - r0);
        let whole = rows == 32 && n >= c0 + 2 * NR && self.out == Epilogue::Product;
        // where the block's partial C lives between `k` chunks, and its row stride in bytes
        let (c, sc) = match whole {
            true => (self.y.add(r0 * n + c0), n * 4),
            false => (edge, 128),
        };
        let last = ks.end == self.steps;
        if ks.start == 0 {
            zero_c!();
        } else {
            load_c!(0, c, sc);
            load_c!(1, c.add(NR), sc);
            load_c!(2, c.add(16 * sc / 4), sc);
            load_c!(3, c.add(16 * sc / 4 + NR), sc);
        }
        let panel = self.steps * TILE_BYTES;
        let ar = self.a.add(at.rp * self.steps * 2 * TILE_BYTES);
        let b0 = self.plane.add(at.p * panel);
        let b1 = match at.pair {
            true => self.plane.add((at.p + 1) * panel),
            false => self.zero,
        };
        let tiles = |k: usize| {
            (
                ar.add(k * 2 * TILE_BYTES),
                [b0.add(k * TILE_BYTES), b1.add(k * TILE_BYTES)],
            )
        };
        match self.kind {
            Kind::Bf16 => ks.for_each(|k| {
                let (a, b) = tiles(k);
                step_one(a as *const u16, b.map(|b| b as *const u16));
            }),
            Kind::Int8 { .. } => ks.for_each(|k| {
                let (a, b) = tiles(k);
                step_i8(a, b);
            }),
        }
        // the C tiles are the outputs only for a whole bf16 block after its last step
        if !last || (whole && matches!(self.kind, Kind::Bf16)) {
            store!(0, c, sc);
            store!(1, c.add(NR), sc);
            store!(2, c.add(16 * sc / 4), sc);
            store!(3, c.add(16 * sc / 4 + NR), sc);
            return;
        }
        to_scratch(scratch);
        let width = (2 * NR).min(n - c0);
        if let Kind::Int8 { rows: sa, cols: sw } = self.kind {
            // i32 sums -> f32 outputs in place
            scale_sums(scratch, &sa[r0..r0 + rows], &sw[c0..c0 + width]);
        }
        match self.out {
            Epilogue::Product => {
                for r in 0..rows {
                    std::ptr::copy_nonoverlapping(
                        scratch.add(r * 32),
                        self.y.add((r0 + r) * n + c0),
                        width,
                    );
                }
            }
            Epilogue::SwiGlu => crate::cpu::math::silu_mul_rows16(
                rows,
                (scratch, 32),
                (scratch.add(NR), 32),
                (self.y.add(r0 * self.cols + (at.p / 2) * NR), self.cols),
            ),
        }
    }
}

/// The int8 block's i32 sums in `scratch` (32 × 32, row stride 32) turned in place into its
/// outputs: sum `(r, j)` as f32 times `rows[r] · cols[j]`, for `rows.len()` rows and
/// `cols.len()` (≤ 32) columns. 16 lanes at a time under AVX-512 (every AMX CPU has it), the same
/// products in the same order as the scalar loop, so the same bits.
#[inline(always)]
unsafe fn scale_sums(scratch: *mut f32, rows: &[f32], cols: &[f32]) {
    static AVX512: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| std::arch::is_x86_feature_detected!("avx512f"));
    if cols.len() == 32 && *AVX512 {
        return scale_whole(scratch, rows, cols);
    }
    let sums = scratch as *mut i32;
    for (r, &s) in rows.iter().enumerate() {
        for (j, &c) in cols.iter().enumerate() {
            let v = *sums.add(r * 32 + j) as f32;
            *scratch.add(r * 32 + j) = v * (s * c);
        }
    }
}

/// [`scale_sums`] for whole 32-column blocks on 16-lane registers.
#[target_feature(enable = "avx512f")]
unsafe fn scale_whole(scratch: *mut f32, rows: &[f32], cols: &[f32]) {
    use std::arch::x86_64::*;
    let c = [
        _mm512_loadu_ps(cols.as_ptr()),
        _mm512_loadu_ps(cols.as_ptr().add(16)),
    ];
    for (r, &s) in rows.iter().enumerate() {
        let sv = _mm512_set1_ps(s);
        for (h, &ch) in c.iter().enumerate() {
            let at = scratch.add(r * 32 + 16 * h);
            let v = _mm512_cvtepi32_ps(_mm512_loadu_si512(at as *const __m512i));
            _mm512_storeu_ps(at, _mm512_mul_ps(v, _mm512_mul_ps(sv, ch)));
        }
    }
}

/// The int8 product of one 64-`k` step into C tiles 0–3: `a` the step's 2 A tiles (16 rows ×
/// 64 int8 each, contiguous), `b[panel]` its B tiles (16 groups of 4 `k` × 16 columns).
#[inline(always)]
unsafe fn step_i8(a: *const u8, b: [*const u8; 2]) {
    asm!(
        "tileloadd tmm6, [{b0} + {s}*1]",
        "tileloadd tmm7, [{b1} + {s}*1]",
        "tileloadd tmm4, [{a0} + {s}*1]",
        "tileloadd tmm5, [{a1} + {s}*1]",
        "tdpbssd tmm0, tmm4, tmm6",
        "tdpbssd tmm1, tmm4, tmm7",
        "tdpbssd tmm2, tmm5, tmm6",
        "tdpbssd tmm3, tmm5, tmm7",
        b0 = in(reg) b[0], b1 = in(reg) b[1], a0 = in(reg) a, a1 = in(reg) a.add(TILE_BYTES),
        s = in(reg) 64usize, options(nostack, readonly)
    );
}

/// One output block: row pair `rp`, panels `p` and `p + 1` (the zero panel unless `pair`).
struct Block {
    rp: usize,
    p: usize,
    pair: bool,
}

/// C tiles 0–3 into the 32 × 32 row-major `scratch` (tile (i, j) at row 16·i, column 16·j).
#[inline(always)]
unsafe fn to_scratch(scratch: *mut f32) {
    store!(0, scratch, 128usize);
    store!(1, scratch.add(16), 128usize);
    store!(2, scratch.add(16 * 32), 128usize);
    store!(3, scratch.add(16 * 32 + 16), 128usize);
}
