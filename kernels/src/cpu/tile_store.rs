//! Where the integer kernels' output tiles go ([`super::qgemm`], [`super::q4gemm`]):
//! their columns into the `(m, n)` product, or, for a gate | up weight whose panels alternate
//! (gate's panel `p`, then up's: [`alternate`]), `SiLU(gate) · up` into the `(m, n / 2)`
//! SwiGLU ([`Out::SwiGlu`]), so an MLP's `(…, 2F)` product is never stored. The SwiGLU is
//! [`super::math::silu_mul_rows16`] on the tile's rows of 16 gate and 16 up columns: with
//! `F` a multiple of 16 every element goes through the same vector lanes as in the pass over
//! whole rows (the backends' `layers::swiglu`), so the two agree bit for bit (tested in the
//! backends for both kernels).

// the tiles' loop and stores run only in the x86 kernels (`cfg`); `alternate` everywhere

use super::aligned::{Aligned, Plain};
#[cfg(target_arch = "x86_64")]
use super::panel::NR;

/// An integer kernel's output tile: up to 6 rows × two panels of [`NR`] columns.
#[cfg(target_arch = "x86_64")]
pub(crate) type Tile = [[f32; 2 * NR]; 6];

/// What a product writes.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Out {
    /// `y (m, n)`.
    Product,
    /// `y (m, n / 2)`: SiLU of each pair's gate panel times its up panel.
    SwiGlu,
}

#[cfg(target_arch = "x86_64")]
impl Out {
    /// Columns of `y` for a weight of `n` outputs.
    pub fn cols(self, n: usize) -> usize {
        match self {
            Out::Product => n,
            Out::SwiGlu => n / 2,
        }
    }
}

/// Two weights' per-panel chunks (`per` elements each) alternating: `a`'s panel `p`, then
/// `b`'s. `a` and `b` hold the same number of whole panels.
pub(crate) fn alternate<T: Plain>(a: &[T], b: &[T], per: usize) -> Aligned<T> {
    let mut out = Aligned::zeroed(a.len() + b.len());
    if per > 0 {
        let pairs = a.chunks_exact(per).zip(b.chunks_exact(per));
        for (dst, (a, b)) in out.chunks_exact_mut(2 * per).zip(pairs) {
            dst[..per].copy_from_slice(a);
            dst[per..].copy_from_slice(b);
        }
    }
    out
}

/// A product of `m` rows over a weight of `n` outputs into a new `y`: `run(p0, p1, y)` for each
/// run of panels on the rayon threads (runs of whole pairs where the kernel's tiles pair panels
/// or `out` is the SwiGLU).
#[cfg(target_arch = "x86_64")]
pub(crate) fn by_panel_runs(
    m: usize,
    n: usize,
    paired: bool,
    out: Out,
    run: impl Fn(usize, usize, *mut f32) + Sync,
) -> Vec<f32> {
    let mut y = vec![0f32; m * out.cols(n)];
    let y_addr = y.as_mut_ptr() as usize;
    super::host::for_panel_runs(n.div_ceil(NR), paired || out == Out::SwiGlu, |p0, p1| {
        run(p0, p1, y_addr as *mut f32)
    });
    y
}

/// Panels `p0..p1` of an integer product (or, `Out::SwiGlu` with `p0`, `p1` even, its SwiGLU)
/// into `y`, the loop both integer kernels share: row blocks of `mc` rows (whose rounded rows
/// stay in L2 while the run's panels pass), row groups of `mr`, tiles of two panels where
/// `wide` (AVX-512) and the run has the next one, else one. `tile(p, width, g0, rows, out)`
/// computes rows `g0..g0 + rows` × panels `p..p + width` into `out`.
///
/// # Safety
/// As [`store`], for every tile of the run; `tile` is safe to call for each.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_tiles(
    (m, n): (usize, usize),
    (mr, mc): (usize, usize),
    wide: bool,
    (p0, p1): (usize, usize),
    out: Out,
    y: *mut f32,
    mut tile: impl FnMut(usize, usize, usize, usize, &mut Tile),
) {
    let mut t: Tile = [[0f32; 2 * NR]; 6];
    // the up panel's tile of a SwiGLU pair where tiles hold one panel
    let mut up: Tile = [[0f32; 2 * NR]; 6];
    for ic in (0..m).step_by(mc) {
        let ie = (ic + mc).min(m);
        let mut p = p0;
        while p < p1 {
            let width = if wide && p + 1 < p1 { 2 } else { 1 };
            for g0 in (ic..ie).step_by(mr) {
                let rows = mr.min(m - g0);
                tile(p, width, g0, rows, &mut t);
                if out == Out::SwiGlu && width == 1 {
                    tile(p + 1, 1, g0, rows, &mut up);
                }
                store(&t, &up, rows, g0, p, width, n, out, y);
            }
            // a SwiGLU pair is two panels whatever the tile width
            p += match out {
                Out::SwiGlu => 2,
                Out::Product => width,
            };
        }
    }
}

/// Rows `0..rows` of the tile of panels `p..p + width` at row `g0` into `y`: its real columns
/// (`Out::Product`, `y (m, n)`), or (`Out::SwiGlu`, `p` even) SiLU(gate) · up with the gate in
/// the tile's first 16 columns and up beside it (`width` 2) or in `up`'s (`width` 1).
///
/// # Safety
/// `y` holds `m · out.cols(n)` floats, `g0 + rows ≤ m`, and the panels lie within `n`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store(
    tile: &Tile,
    up: &Tile,
    rows: usize,
    g0: usize,
    p: usize,
    width: usize,
    n: usize,
    out: Out,
    y: *mut f32,
) {
    match out {
        Out::Product => {
            let cols = (width * NR).min(n - p * NR);
            for (r, row) in tile.iter().enumerate().take(rows) {
                std::ptr::copy_nonoverlapping(row.as_ptr(), y.add((g0 + r) * n + p * NR), cols);
            }
        }
        Out::SwiGlu => {
            let f = n / 2;
            let gate = (tile.as_ptr() as *const f32, 2 * NR);
            let upr = match width {
                2 => (tile[0][NR..].as_ptr(), 2 * NR),
                _ => (up.as_ptr() as *const f32, 2 * NR),
            };
            let dst = (y.add(g0 * f + p / 2 * NR), f);
            super::math::silu_mul_rows16(rows, gate, upr, dst);
        }
    }
}
