//! The AVX-512 form of one [`super::cpu_attention`] tile: scores held key-major (the keys as
//! rows, the tile's query rows as columns), so that every step runs on 16-lane registers
//! without a transpose or a pass that packs scores, and a softmax taken online over blocks of
//! keys (`key_block`, whole groups of [`KR`]), so no score matrix larger than one block is ever
//! written.
//!
//! Why: the products of the other form run through the `gemm` crate, which takes the AVX2
//! kernel on these CPUs and packs both operands on every call, and its `(M, P + N)` score
//! matrix (1.7 MB for a 64-query block at a 964-token prefix) does not stay in L2 across its
//! three passes. On the 2-core Zen 5 build machine that form ran at 120–170 GFLOP/s against
//! ~430 for the linear layers, and attention was 28 % of a 28-field q8_0 decision.
//!
//! Layouts, in f32:
//! - `keys` of one segment (a past slot, or one row's new keys), packed once per call by
//!   [`pack_keys`] into groups of [`KR`] keys, `[group][d][KR]`, the last group zero-padded:
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

use std::arch::x86_64::*;

use super::cpu_math::x86::exp16;

/// Keys per packed group: the rows of a score tile (14 × 2 registers of accumulators).
pub(super) const KR: usize = 14;
/// Query columns per value tile (14 rows × 2 registers of output columns).
const QR: usize = 14;

/// `k (n, hd)` row-major into groups of [`KR`] keys, `[group][d][KR]` (missing keys of the
/// last group are 0).
pub(super) fn pack_keys(k: &[f32], n: usize, hd: usize) -> Vec<f32> {
    let mut out = vec![0f32; n.div_ceil(KR) * hd * KR];
    for (g, dst) in out.chunks_exact_mut(hd * KR).enumerate() {
        for r in 0..KR.min(n - g * KR) {
            for (d, &x) in k[(g * KR + r) * hd..][..hd].iter().enumerate() {
                dst[d * KR + r] = x;
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

/// The buffers of one tile, reused from tile to tile on a thread ([`with_state`]).
#[derive(Default)]
pub(super) struct State {
    m: usize,
    mp: usize,
    hd: usize,
    /// Keys per block (a multiple of [`KR`]).
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
/// blocks of `key_block` keys (rounded up to whole groups).
pub(super) fn with_state<T>(
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
        st.reset(m, hd, key_block.max(1).next_multiple_of(KR));
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

    /// Attend columns `cols` to one segment of `n` keys: `keys` packed by [`pack_keys`],
    /// `values (n, hd)` row-major, visibility `sees`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `hd` is a multiple of 16; `keys` and `values` hold `n` keys of
    /// `hd`; `cols` lies in `0..m` and `sees` has one entry per column with `hi ≤ n` (and a
    /// tree's rows cover the keys).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn segment(
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
        let (mp, hd) = (self.mp, self.hd);
        let first = sees.lo.iter().copied().min().unwrap_or(0);
        let last = sees.hi.iter().copied().max().unwrap_or(0).min(n);
        let mut k0 = first / KR * KR;
        while k0 < last {
            let k1 = (k0 + self.kb).min(last);
            let kb = k1 - k0;
            // scores: s[kk][c] for the block's keys and the columns
            for g0 in (k0..k1).step_by(KR) {
                let rows = KR.min(k1 - g0);
                let a = keys.as_ptr().add(g0 / KR * hd * KR);
                let mut c = c0;
                while c < c1 {
                    let w = (c1 - c).min(32);
                    tile(
                        rows,
                        w,
                        hd,
                        (a, KR),
                        (self.qt.as_ptr().add(c), mp),
                        (self.s.as_mut_ptr().add((g0 - k0) * mp + c), mp),
                        true,
                    );
                    c += w;
                }
            }
            self.hide(k0, k1, c0, sees);
            self.softmax_block(kb, c0, c1);
            // o[c] += Σ_kk e[kk][c] · values[k0 + kk]
            let mut q0 = c0;
            while q0 < c1 {
                let rows = QR.min(c1 - q0);
                for d0 in (0..hd).step_by(32) {
                    tile(
                        rows,
                        (hd - d0).min(32),
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

    /// `-inf` for the scores of block `k0..k1` a column does not see.
    fn hide(&mut self, k0: usize, k1: usize, c0: usize, sees: &Sees<'_>) {
        let mp = self.mp;
        for (i, (&lo, &hi)) in sees.lo.iter().zip(sees.hi).enumerate() {
            let c = c0 + i;
            for kk in (k0..lo.clamp(k0, k1)).chain(hi.clamp(k0, k1)..k1) {
                self.s[(kk - k0) * mp + c] = f32::NEG_INFINITY;
            }
            if let Some((vis, query, l)) = sees.tree {
                let (a, z) = (lo.clamp(k0, k1), hi.clamp(k0, k1).max(lo.clamp(k0, k1)));
                for (kk, &v) in vis[query[i] * l..][a..z].iter().enumerate() {
                    if v == 0 {
                        self.s[(a + kk - k0) * mp + c] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    /// The online softmax step over a block of `kb` keys for columns `c0..c1`: new running
    /// maxima, the scores replaced by `e^(s - max)`, the sums and the output rows rescaled by
    /// `e^(old max - new max)`.
    #[target_feature(enable = "avx512f")]
    unsafe fn softmax_block(&mut self, kb: usize, c0: usize, c1: usize) {
        let (mp, hd) = (self.mp, self.hd);
        let s = self.s.as_mut_ptr();
        let mut c = c0;
        while c < c1 {
            let w = (c1 - c).min(16);
            let lanes: __mmask16 = if w == 16 { !0 } else { (1u16 << w) - 1 };
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            let old = _mm512_mask_loadu_ps(ninf, lanes, self.max.as_ptr().add(c));
            let mut mx = old;
            for kk in 0..kb {
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, lanes, s.add(kk * mp + c)));
            }
            // a column that sees nothing yet keeps a shift of 0, so -inf scores give 0, not NaN
            let seen = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, ninf);
            let shift = _mm512_maskz_mov_ps(seen, mx);
            let alpha = exp16(_mm512_sub_ps(old, shift));
            let mut acc = _mm512_setzero_ps();
            for kk in 0..kb {
                let p = s.add(kk * mp + c);
                let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, p), shift));
                _mm512_mask_storeu_ps(p, lanes, e);
                acc = _mm512_add_ps(acc, e);
            }
            let sum = _mm512_maskz_loadu_ps(lanes, self.sum.as_ptr().add(c));
            _mm512_mask_storeu_ps(
                self.sum.as_mut_ptr().add(c),
                lanes,
                _mm512_fmadd_ps(alpha, sum, acc),
            );
            _mm512_mask_storeu_ps(self.max.as_mut_ptr().add(c), lanes, mx);
            // rescale the output rows whose maximum moved (alpha < 1)
            let moved = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(alpha, _mm512_set1_ps(1.0)) & lanes;
            if moved != 0 {
                let mut a = [0f32; 16];
                _mm512_storeu_ps(a.as_mut_ptr(), alpha);
                for (i, &f) in a.iter().enumerate().take(w) {
                    if moved & (1 << i) != 0 {
                        let row = self.o.as_mut_ptr().add((c + i) * hd);
                        let fv = _mm512_set1_ps(f);
                        for d in (0..hd).step_by(16) {
                            let p = row.add(d);
                            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), fv));
                        }
                    }
                }
            }
            c += w;
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

/// `C (rows, w) (+)= A (rows, kc) · B (kc, w)` for `rows ≤ 14`, `w ≤ 32`: `A[r][kk] =
/// a[kk·a_ks + r]`, `B[kk][j] = b[kk·b_ks + j]`, `C[r][j] = c[r·ldc + j]` (columns past `w`
/// neither read nor written); `first` overwrites `C`.
///
/// # Safety
/// The CPU has AVX-512 F and every addressed element is in bounds.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tile(
    rows: usize,
    w: usize,
    kc: usize,
    (a, a_ks): (*const f32, usize),
    (b, b_ks): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    first: bool,
) {
    let last: __mmask16 = match w % 16 {
        0 => !0,
        r => (1u16 << r) - 1,
    };
    macro_rules! go {
        ($($r:literal)*) => {
            match rows {
                $($r => match w.div_ceil(16) {
                    2 => micro::<$r, 2>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                    _ => micro::<$r, 1>(kc, a, a_ks, b, b_ks, c, ldc, first, last),
                },)*
                _ => unreachable!("a tile of {rows} rows"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
}

/// [`tile`] with `R` rows and `P` registers of columns, the last one masked to `last`. (Not
/// `cpu_gemm`'s `micro512`: that one reads a packed weight panel, 16 floats per `k`, with no
/// ragged columns; here the vector operand is a strided matrix — the transposed queries, the
/// values in place — and a tile's last register may be partly outside it.)
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn micro<const R: usize, const P: usize>(
    kc: usize,
    a: *const f32,
    a_ks: usize,
    b: *const f32,
    b_ks: usize,
    c: *mut f32,
    ldc: usize,
    first: bool,
    last: __mmask16,
) {
    let mask = |j: usize| if j + 1 == P { last } else { !0 };
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_maskz_loadu_ps(mask(j), c.add(r * ldc + 16 * j));
            }
        }
    }
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); P];
        for (j, bv) in bv.iter_mut().enumerate() {
            *bv = _mm512_maskz_loadu_ps(mask(j), b.add(16 * j));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add(r));
            for (acc, bv) in acc.iter_mut().zip(&bv) {
                *acc = _mm512_fmadd_ps(av, *bv, *acc);
            }
        }
        a = a.add(a_ks);
        b = b.add(b_ks);
    }
    for (r, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(c.add(r * ldc + 16 * j), mask(j), *acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing puts key `g·KR + r`'s element `d` at `[g][d][r]` and zero-pads the last group.
    #[test]
    fn keys_pack_into_zero_padded_groups() {
        let (n, hd) = (KR + 3, 16);
        let k: Vec<f32> = (0..n * hd).map(|i| i as f32 + 1.0).collect();
        let p = pack_keys(&k, n, hd);
        assert_eq!(p.len(), 2 * hd * KR);
        for g in 0..2 {
            for d in 0..hd {
                for r in 0..KR {
                    let key = g * KR + r;
                    let want = if key < n { k[key * hd + d] } else { 0.0 };
                    assert_eq!(p[(g * hd + d) * KR + r], want, "group {g} d {d} r {r}");
                }
            }
        }
    }
}
