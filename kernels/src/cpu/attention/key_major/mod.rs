//! The key-major form of one [`super::attention`] tile: scores held key-major (the keys as
//! rows, the tile's query rows as columns), so that every step runs on full-width registers
//! without a transpose or a pass that packs scores, and a softmax taken online over blocks of
//! keys (`key_block`, whole groups of the width's `KR` keys), so no score matrix larger than one
//! block is ever written.
//!
//! Two vector widths ([`Lanes`]) share everything here but the register kernels (a tile's
//! product and the softmax step):
//! - [`Avx512`]: 16 lanes; groups of 14 keys; 14 × 32 tiles (28 of the 32 registers
//!   accumulate);
//! - [`Avx2`]: AVX2 + FMA, 8 lanes; groups of 6 keys; 6 × 16 tiles (12 of the 16 registers).
//!
//! Why: the products of the other form run through the `gemm` crate, which packs both
//! operands on every call (and takes its AVX2 kernel on AVX-512 CPUs), and its `(M, P + N)`
//! score matrix (1.7 MB for a 64-query block at a 964-token prefix) does not stay in L2 across
//! its three passes. On two AVX-512 cores that form ran at 120–170 GFLOP/s against
//! ~430 for the linear layers, and attention was 28 % of a 28-field q8_0 decision.
//!
//! Layouts, in f32:
//! - `keys` of one segment (a past slot, or one row's new keys), packed once per call by
//!   [`pack_keys`] into groups of `KR` keys, `[group][d][KR]`, the last group zero-padded:
//!   the broadcast operand of the score product;
//! - the tile's queries transposed and pre-scaled, `qt (hd, mp)` with `mp` the column count
//!   rounded up to 16: the vector operand of the score product;
//! - one block's scores `s (kb, mp)`, `s[kk][c]` = column `c`'s query · key `kk`; the softmax
//!   step turns them into `e^(s - max_c)` in place, and they are the broadcast operand of the
//!   value product as they lie (a tile's `R` columns are `R` adjacent floats of each key's row);
//! - `values (n, hd)` row-major, read in place: the vector operand of the value product;
//! - the output `o (M, hd)` row-major, accumulated in place, rescaled whenever a column's
//!   running maximum grows, and divided by the column's sum at the end.
//!
//! Which keys a column sees is given per column as a range (`lo..hi`: a row's past from its
//! start, or new keys up to the query's own position) and, for a packed tree, a visibility row;
//! hidden keys get `-inf`, so exactly 0 after the exponential, as in the other form.

// The register kernels of each width ([`Lanes`] for [`Avx512`], [`Avx2`]). Their online
// softmax step: new running maxima, the scores replaced by `e^(s - max)`, the sums and the
// output rows rescaled by `e^(old max - new max)`. A column that sees nothing yet keeps a shift
// of 0, so -inf scores give 0, not NaN.
mod avx2;
mod avx512;

/// One vector width's register kernels of the key-major form.
pub(super) trait Lanes {
    /// f32 lanes per register.
    const LANES: usize;
    /// Keys per packed group: the rows of a score tile.
    const KR: usize;
    /// Query columns per value tile.
    const QR: usize;

    /// `C (rows, w) (+)= A (rows, kc) · B (kc, w)` for `rows ≤ max(KR, QR)`, `w ≤ 2·LANES`:
    /// `A[r][kk] = a[kk·a_ks + r]`, `B[kk][j] = b[kk·b_ks + j]`, `C[r][j] = c[r·ldc + j]`
    /// (columns past `w` neither read nor written); `first` overwrites `C`.
    ///
    /// # Safety
    /// The CPU has the width's instructions and every addressed element is in bounds.
    unsafe fn tile(
        rows: usize,
        w: usize,
        kc: usize,
        a: (*const f32, usize),
        b: (*const f32, usize),
        c: (*mut f32, usize),
        first: bool,
    );

    /// The online softmax step over a block of `kb` keys for columns `c0..c1`
    /// ([`State::softmax_block`]).
    ///
    /// # Safety
    /// The CPU has the width's instructions; `kb` rows of `st`'s score block are written and
    /// `c0..c1` lies in its columns.
    unsafe fn softmax_block(st: &mut State, kb: usize, c0: usize, c1: usize);
}

/// AVX-512 F: 16 lanes.
pub(super) struct Avx512;

/// AVX2 + FMA: 8 lanes.
pub(super) struct Avx2;

/// `k (n, hd)` row-major into groups of `L::KR` keys, `[group][d][KR]` (missing keys of the
/// last group are 0).
pub(super) fn pack_keys<L: Lanes>(k: &[f32], n: usize, hd: usize) -> Vec<f32> {
    let kr = L::KR;
    let mut out = vec![0f32; n.div_ceil(kr) * hd * kr];
    for (g, dst) in out.chunks_exact_mut(hd * kr).enumerate() {
        for r in 0..kr.min(n - g * kr) {
            for (d, &x) in k[(g * kr + r) * hd..][..hd].iter().enumerate() {
                dst[d * kr + r] = x;
            }
        }
    }
    out
}

/// Which keys of a segment the columns `cols` see: column `cols.start + i` sees keys
/// `lo[i]..hi[i]` and, with `tree = Some((vis, query, l))`, of those only the keys `kk` with
/// `vis[query[i]·l + kk] != 0`.
pub(super) struct Sees<'a> {
    pub lo: &'a [usize],
    pub hi: &'a [usize],
    pub tree: Option<(&'a [u8], &'a [usize], usize)>,
}

/// What a tile's columns see, for the tile forms that attend segment by segment (key-major,
/// AMX): all `m` columns the slot's past from their row's start, and each row's `per_row`
/// columns (head in group, query) the row's new keys up to their query (causal), all of them,
/// or a tree's visible ones.
pub(super) struct TileSees<'a> {
    past_lo: Vec<usize>,
    past_hi: Vec<usize>,
    query: Vec<usize>,
    new_lo: Vec<usize>,
    new_hi: Vec<usize>,
    tree: Option<&'a [u8]>,
    l: usize,
}

impl<'a> TileSees<'a> {
    /// Tile `t`'s visibility: `p` past keys per slot (each row's from `starts[row]`), `l` new
    /// tokens a row, `n_new` of them visible to the tile's last query.
    pub(super) fn new(
        t: &super::Tile,
        e: &super::Extent,
        (p, l): (usize, usize),
        (starts, keys): (&[usize], &super::NewKeys<'a>),
    ) -> Self {
        let query: Vec<usize> = (0..e.per_row).map(|c| t.i0 + c % e.ni).collect();
        TileSees {
            past_lo: (0..e.m).map(|c| starts[t.b0 + c / e.per_row]).collect(),
            past_hi: vec![p; e.m],
            new_lo: vec![0; e.per_row],
            new_hi: match keys {
                super::NewKeys::Causal => query.iter().map(|&i| i + 1).collect(),
                super::NewKeys::All | super::NewKeys::Tree(_) => vec![e.n_new; e.per_row],
            },
            tree: match keys {
                super::NewKeys::Tree(vis) => Some(*vis),
                _ => None,
            },
            query,
            l,
        }
    }

    /// The past segment's, for all the tile's columns.
    pub(super) fn past(&self) -> Sees<'_> {
        Sees {
            lo: &self.past_lo,
            hi: &self.past_hi,
            tree: None,
        }
    }

    /// A row's new keys', for that row's columns.
    pub(super) fn new_keys(&self) -> Sees<'_> {
        Sees {
            lo: &self.new_lo,
            hi: &self.new_hi,
            tree: self.tree.map(|vis| (vis, &self.query[..], self.l)),
        }
    }
}

/// `-inf` for the scores of block `k0..k1` a column does not see: `s (k1 - k0, mp)` holds the
/// block's scores key-major, column `c0 + i` seeing what `sees` says for index `i`.
pub(super) fn hide(s: &mut [f32], mp: usize, (k0, k1): (usize, usize), c0: usize, sees: &Sees<'_>) {
    for (i, (&lo, &hi)) in sees.lo.iter().zip(sees.hi).enumerate() {
        let c = c0 + i;
        for kk in (k0..lo.clamp(k0, k1)).chain(hi.clamp(k0, k1)..k1) {
            s[(kk - k0) * mp + c] = f32::NEG_INFINITY;
        }
        if let Some((vis, query, l)) = sees.tree {
            let (a, z) = (lo.clamp(k0, k1), hi.clamp(k0, k1).max(lo.clamp(k0, k1)));
            for (kk, &v) in vis[query[i] * l..][a..z].iter().enumerate() {
                if v == 0 {
                    s[(a + kk - k0) * mp + c] = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The buffers of one tile, reused from tile to tile on a thread ([`with_state`]).
#[derive(Default)]
pub(super) struct State {
    m: usize,
    mp: usize,
    hd: usize,
    /// Keys per block (a multiple of the width's `KR`).
    kb: usize,
    /// `(hd, mp)` queries, transposed and scaled.
    qt: Vec<f32>,
    /// `(kb, mp)` one block's scores, then their exponentials.
    s: Vec<f32>,
    /// `(mp,)` each column's running maximum and sum.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `(M, hd)` the output, unnormalised until [`State::finish`].
    o: Vec<f32>,
}

/// `f` with this thread's [`State`], reset for a tile of `m` columns of head dim `hd` and
/// blocks of `key_block` keys (rounded up to whole groups of `L::KR`).
pub(super) fn with_state<L: Lanes, T>(
    m: usize,
    hd: usize,
    key_block: usize,
    f: impl FnOnce(&mut State) -> T,
) -> T {
    use std::cell::RefCell;
    thread_local! {
        static STATE: RefCell<State> = RefCell::new(State::default());
    }
    STATE.with(|cell| {
        let mut st = cell.borrow_mut();
        st.reset(m, hd, key_block.max(1).next_multiple_of(L::KR));
        f(&mut st)
    })
}

impl State {
    fn reset(&mut self, m: usize, hd: usize, kb: usize) {
        let mp = m.next_multiple_of(16);
        (self.m, self.mp, self.hd, self.kb) = (m, mp, hd, kb);
        let fill = |v: &mut Vec<f32>, n: usize, x: f32| {
            v.clear();
            v.resize(n, x);
        };
        // the queries (every column < m is written by `query`, and no load reads a column past
        // the ones it computes) and the score block (written before it is read) are only sized
        for (v, n) in [(&mut self.qt, hd * mp), (&mut self.s, kb * mp)] {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        }
        fill(&mut self.max, mp, f32::NEG_INFINITY);
        fill(&mut self.sum, mp, 0.0);
        fill(&mut self.o, m * hd, 0.0);
    }

    /// Column `c`'s query `q (hd,)`, times `scale`.
    pub fn query(&mut self, c: usize, q: &[f32], scale: f32) {
        for (d, &x) in q[..self.hd].iter().enumerate() {
            self.qt[d * self.mp + c] = x * scale;
        }
    }

    /// Attend columns `cols` to one segment of `n` keys: `keys` packed by [`pack_keys`] for
    /// `L`, `values (n, hd)` row-major, visibility `sees`.
    ///
    /// # Safety
    /// The CPU has `L`'s instructions; `hd` is a multiple of `L::LANES`; `keys` and `values`
    /// hold `n` keys of `hd`; `cols` lies in `0..m` and `sees` has one entry per column with
    /// `hi ≤ n` (and a tree's rows cover the keys); the state was reset for `L`
    /// ([`with_state`]).
    pub unsafe fn segment<L: Lanes>(
        &mut self,
        keys: &[f32],
        values: &[f32],
        n: usize,
        cols: std::ops::Range<usize>,
        sees: &Sees<'_>,
    ) {
        let (c0, c1) = (cols.start, cols.end);
        if c0 >= c1 {
            return;
        }
        let (mp, hd, kr, wide) = (self.mp, self.hd, L::KR, 2 * L::LANES);
        let first = sees.lo.iter().copied().min().unwrap_or(0);
        let last = sees.hi.iter().copied().max().unwrap_or(0).min(n);
        let mut k0 = first / kr * kr;
        while k0 < last {
            let k1 = (k0 + self.kb).min(last);
            let kb = k1 - k0;
            // scores: s[kk][c] for the block's keys and the columns
            for g0 in (k0..k1).step_by(kr) {
                let rows = kr.min(k1 - g0);
                let a = keys.as_ptr().add(g0 / kr * hd * kr);
                let mut c = c0;
                while c < c1 {
                    let w = (c1 - c).min(wide);
                    L::tile(
                        rows,
                        w,
                        hd,
                        (a, kr),
                        (self.qt.as_ptr().add(c), mp),
                        (self.s.as_mut_ptr().add((g0 - k0) * mp + c), mp),
                        true,
                    );
                    c += w;
                }
            }
            hide(&mut self.s, mp, (k0, k1), c0, sees);
            L::softmax_block(self, kb, c0, c1);
            // o[c] += Σ_kk e[kk][c] · values[k0 + kk]
            let mut q0 = c0;
            while q0 < c1 {
                let rows = L::QR.min(c1 - q0);
                for d0 in (0..hd).step_by(wide) {
                    L::tile(
                        rows,
                        (hd - d0).min(wide),
                        kb,
                        (self.s.as_ptr().add(q0), mp),
                        (values.as_ptr().add(k0 * hd + d0), hd),
                        (self.o.as_mut_ptr().add(q0 * hd + d0), hd),
                        false,
                    );
                }
                q0 += rows;
            }
            k0 = k1;
        }
    }

    /// Scale output row `c` by `f` (a column whose running maximum grew).
    fn rescale(&mut self, c: usize, f: f32) {
        let hd = self.hd;
        self.o[c * hd..][..hd].iter_mut().for_each(|x| *x *= f);
    }

    /// Rescale the output rows `c0 + i` whose bit `i` is set in `moved`, each by `alpha[i]`
    /// (a register's columns after a softmax step; `alpha` its lanes).
    fn rescale_moved(&mut self, c0: usize, alpha: &[f32], moved: u32) {
        for (i, &f) in alpha.iter().enumerate() {
            if moved & (1 << i) != 0 {
                self.rescale(c0 + i, f);
            }
        }
    }

    /// The `(M, hd)` output, each column's row divided by its sum.
    pub fn finish(&mut self) -> &[f32] {
        let hd = self.hd;
        for (row, &s) in self.o.chunks_exact_mut(hd).zip(&self.sum) {
            let inv = 1.0 / s;
            row.iter_mut().for_each(|x| *x *= inv);
        }
        &self.o[..self.m * hd]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing puts key `g·KR + r`'s element `d` at `[g][d][r]` and zero-pads the last group,
    /// at both widths' group sizes.
    #[test]
    fn keys_pack_into_zero_padded_groups() {
        fn check<L: Lanes>() {
            let kr = L::KR;
            let (n, hd) = (kr + 3, 16);
            let k: Vec<f32> = (0..n * hd).map(|i| i as f32 + 1.0).collect();
            let p = pack_keys::<L>(&k, n, hd);
            assert_eq!(p.len(), 2 * hd * kr);
            for g in 0..2 {
                for d in 0..hd {
                    for r in 0..kr {
                        let key = g * kr + r;
                        let want = if key < n { k[key * hd + d] } else { 0.0 };
                        assert_eq!(p[(g * hd + d) * kr + r], want, "group {g} d {d} r {r}");
                    }
                }
            }
        }
        check::<Avx512>();
        check::<Avx2>();
    }
}
