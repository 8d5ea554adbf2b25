//! Attention tiles on the AMX bf16 tiles, for models whose linear layers already compute in
//! bf16 or int8 (`--quantize bf16|int8`, `--dtype bf16` on the CPU): the same tiles, visibility
//! and online softmax as the key-major form ([`super::key_major`]), with the two products on
//! `tdpbf16ps` instead of f32 FMAs. The queries (pre-scaled), keys and values are rounded to
//! bf16 once, and each block's softmax weights `e^(s − max)` once before the value product;
//! scores, maxima, sums and the output accumulate in f32. The row sums add the rounded weights,
//! so each output row is a convex combination of the (rounded) values.
//!
//! Why: on the prefill of a 964-token prompt the f32 key-major form ran near the cores' f32 FMA
//! peak and still took about 40 % of an int8 decision (the linear layers being on the int8
//! tiles); a bf16 tile product does 16 × 16 × 32 multiply-adds in one instruction.
//!
//! Layouts (bf16 as `u16`; every tile 16 rows × 64 bytes, tile configuration of
//! [`crate::cpu::amx`]):
//! - a segment's keys `(n32, hd)` row-major, `n32` = its keys rounded up to 32 with zero keys:
//!   A tiles of the score product (16 keys × 32 dims), read in place;
//! - its values transposed, `vt (hd, n32)`: A tiles of the value product (16 dims × 32 keys);
//! - the tile's queries as `qv (hd/2, mp, 2)`: B tiles of the score product (16 dim pairs × 16
//!   columns), `mp` the columns rounded up to 16 (zero columns past `m`);
//! - one block's scores `s (kb, mp)` f32 key-major (the C tiles stored as they lie), and its
//!   weights as `ev (kb/2, mp, 2)`: B tiles of the value product (16 key pairs × 16 columns),
//!   zero in the columns outside the segment's, so a 16-column tile shared with another
//!   segment's columns adds nothing to them;
//! - the output transposed, `ot (hd, mp)` f32: C tiles loaded, accumulated and stored per block,
//!   rescaled by columns (one register per 16 columns) when a running maximum grows.
//!
//! Key blocks start on multiples of 32 keys; keys past a block's last visible one are hidden
//! (`-inf`, weight exactly 0), as are the zero keys of the padding.

use std::arch::asm;
use std::arch::x86_64::*;

use super::key_major::{hide, Sees};
use super::*;
use crate::cpu::amx::{bf16_bits, bf16_bits_fast};

/// Keys per step of the value product (one A tile row of bf16).
const KSTEP: usize = 32;

/// Whether AMX tiles compute a call of head dim `hd`: AMX runs in this process (under the
/// `FORKSCORE_CPU_ISA` cap: AVX-512 chosen) and `hd` is whole 32-dim steps.
pub(super) fn runs(hd: usize) -> bool {
    use super::super::isa::Isa;
    hd > 0
        && hd.is_multiple_of(KSTEP)
        && Isa::chosen() == Some(Isa::Avx512)
        && crate::cpu::amx::available()
}

/// One segment's keys and transposed values in bf16 ([`pack`]).
pub(super) struct Segment {
    /// `(n32, hd)` keys.
    k: Vec<u16>,
    /// `(hd, n32)` values, transposed.
    vt: Vec<u16>,
    n32: usize,
}

fn pack(k: &[f32], v: &[f32], n: usize, hd: usize) -> Segment {
    let n32 = n.next_multiple_of(KSTEP).max(KSTEP);
    let mut kb = vec![0u16; n32 * hd];
    for (o, &x) in kb.iter_mut().zip(&k[..n * hd]) {
        *o = bf16_bits(x);
    }
    let mut vt = vec![0u16; hd * n32];
    for (kk, row) in v[..n * hd].chunks_exact(hd).enumerate() {
        for (d, &x) in row.iter().enumerate() {
            vt[d * n32 + kk] = bf16_bits(x);
        }
    }
    Segment { k: kb, vt, n32 }
}

/// A call's segments packed once, before its tiles: each past slot's and each row's new keys
/// and values, per KV head.
pub(super) struct Packed {
    /// `[j · slots + slot]`.
    past: Vec<Segment>,
    /// `[row · Hkv + j]`.
    new: Vec<Segment>,
}

impl Packed {
    pub(super) fn pack(d: &Dims, b: usize, (kd, vd): (&[f32], &[f32]), (pkd, pvd): (&[f32], &[f32])) -> Self {
        let (p, l, hd) = (d.p, d.l, d.hd);
        Packed {
            past: (0..d.hkv * d.slots)
                .into_par_iter()
                .map(|js| pack(&pkd[js * p * hd..][..p * hd], &pvd[js * p * hd..][..p * hd], p, hd))
                .collect(),
            new: (0..b * d.hkv)
                .into_par_iter()
                .map(|bj| pack(&kd[bj * l * hd..][..l * hd], &vd[bj * l * hd..][..l * hd], l, hd))
                .collect(),
        }
    }
}

/// The buffers of one tile, reused from tile to tile on a thread.
#[derive(Default)]
struct State {
    m: usize,
    mp: usize,
    hd: usize,
    /// Keys per block, a multiple of 32.
    kb: usize,
    qv: Vec<u16>,
    s: Vec<f32>,
    ev: Vec<u16>,
    ot: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    o: Vec<f32>,
}

impl State {
    fn reset(&mut self, m: usize, hd: usize, kb: usize) {
        let mp = m.next_multiple_of(16);
        (self.m, self.mp, self.hd, self.kb) = (m, mp, hd, kb);
        let fill = |v: &mut Vec<f32>, n: usize, x: f32| {
            v.clear();
            v.resize(n, x);
        };
        // queries: zero columns past m must be zero (they are read by the score tiles)
        self.qv.clear();
        self.qv.resize(hd * mp, 0);
        // scores and weights are written before they are read
        if self.s.len() < kb * mp {
            self.s.resize(kb * mp, 0.0);
        }
        if self.ev.len() < kb * mp {
            self.ev.resize(kb * mp, 0);
        }
        fill(&mut self.ot, hd * mp, 0.0);
        fill(&mut self.max, mp, f32::NEG_INFINITY);
        fill(&mut self.sum, mp, 0.0);
        fill(&mut self.o, m * hd, 0.0);
    }

    /// Column `c`'s query `q (hd,)`, times `scale`, rounded to bf16.
    fn query(&mut self, c: usize, q: &[f32], scale: f32) {
        let mp = self.mp;
        for (d, &x) in q[..self.hd].iter().enumerate() {
            self.qv[((d / 2) * mp + c) * 2 + d % 2] = bf16_bits_fast(x * scale);
        }
    }

    /// Attend columns `cols` to one segment of `n` visible-at-most keys (`sees` per column).
    ///
    /// # Safety
    /// AMX runs and this thread has loaded the tile configuration; the CPU has AVX-512; `cols`
    /// lies in `0..m`, `sees` has one entry per column with `hi ≤ n ≤ seg.n32`, and a tree's
    /// rows cover the keys.
    unsafe fn segment(&mut self, seg: &Segment, n: usize, cols: std::ops::Range<usize>, sees: &Sees<'_>) {
        let (c0, c1) = (cols.start, cols.end);
        if c0 >= c1 {
            return;
        }
        let (mp, hd, n32) = (self.mp, self.hd, seg.n32);
        let (t0, t1) = (c0 / 16 * 16, c1.next_multiple_of(16));
        let first = sees.lo.iter().copied().min().unwrap_or(0);
        let last = sees.hi.iter().copied().max().unwrap_or(0).min(n);
        let mut k0 = first / KSTEP * KSTEP;
        while k0 < last {
            let k1 = (k0 + self.kb).min(last);
            let kend = k1.next_multiple_of(KSTEP);
            debug_assert!(kend <= n32);
            // scores s[kk][c] = k[k0 + kk] · q[c]: per 16 columns, two 16-key C tiles at a
            // time (kend − k0 is whole 32-key steps), each query B tile loaded once for both
            for t in (t0..t1).step_by(16) {
                for g0 in (k0..kend).step_by(32) {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    for d0 in (0..hd).step_by(KSTEP) {
                        tile_load::<2>(self.qv.as_ptr().add((d0 / 2 * mp + t) * 2) as *const u8, mp * 4);
                        tile_load::<3>(seg.k.as_ptr().add(g0 * hd + d0) as *const u8, hd * 2);
                        tile_load::<4>(seg.k.as_ptr().add((g0 + 16) * hd + d0) as *const u8, hd * 2);
                        asm!("tdpbf16ps tmm0, tmm3, tmm2", "tdpbf16ps tmm1, tmm4, tmm2", options(nostack, nomem));
                    }
                    let at = self.s.as_mut_ptr().add((g0 - k0) * mp + t) as *mut u8;
                    tile_store::<0>(at, mp * 4);
                    tile_store::<1>(at.add(16 * mp * 4), mp * 4);
                }
            }
            hide(&mut self.s, mp, (k0, kend), c0, sees);
            self.softmax_block(kend - k0, (c0, c1), (t0, t1));
            // ot[d][c] += Σ_kk v[k0 + kk][d] · e[kk][c]: per 16 columns, 64 dims (four C tiles)
            // at a time where hd allows, so each weight B tile is loaded once for the four
            for t in (t0..t1).step_by(16) {
                let ot = self.ot.as_mut_ptr();
                let c = |d0: usize| ot.add(d0 * mp + t) as *mut u8;
                let e = |kk: usize| self.ev.as_ptr().add((kk / 2 * mp + t) * 2) as *const u8;
                let v = |d0: usize, kk: usize| seg.vt.as_ptr().add(d0 * n32 + k0 + kk) as *const u8;
                let (ldc, ldv) = (mp * 4, n32 * 2);
                let mut d0 = 0;
                while d0 + 64 <= hd {
                    tile_load::<0>(c(d0), ldc);
                    tile_load::<1>(c(d0 + 16), ldc);
                    tile_load::<2>(c(d0 + 32), ldc);
                    tile_load::<3>(c(d0 + 48), ldc);
                    for kk in (0..kend - k0).step_by(KSTEP) {
                        tile_load::<4>(e(kk), ldc);
                        tile_load::<5>(v(d0, kk), ldv);
                        tile_load::<6>(v(d0 + 16, kk), ldv);
                        asm!("tdpbf16ps tmm0, tmm5, tmm4", "tdpbf16ps tmm1, tmm6, tmm4", options(nostack, nomem));
                        tile_load::<5>(v(d0 + 32, kk), ldv);
                        tile_load::<6>(v(d0 + 48, kk), ldv);
                        asm!("tdpbf16ps tmm2, tmm5, tmm4", "tdpbf16ps tmm3, tmm6, tmm4", options(nostack, nomem));
                    }
                    tile_store::<0>(c(d0), ldc);
                    tile_store::<1>(c(d0 + 16), ldc);
                    tile_store::<2>(c(d0 + 32), ldc);
                    tile_store::<3>(c(d0 + 48), ldc);
                    d0 += 64;
                }
                while d0 < hd {
                    tile_load::<0>(c(d0), ldc);
                    for kk in (0..kend - k0).step_by(KSTEP) {
                        tile_load::<4>(e(kk), ldc);
                        tile_load::<5>(v(d0, kk), ldv);
                        asm!("tdpbf16ps tmm0, tmm5, tmm4", options(nostack, nomem));
                    }
                    tile_store::<0>(c(d0), ldc);
                    d0 += 16;
                }
            }
            k0 = k1;
        }
    }

    /// The online softmax step over a block of `kb` keys (a multiple of 32) for columns
    /// `c0..c1`: running maxima and sums, the weights `e^(s − max)` rounded to bf16 into `ev`
    /// (zero in the other columns of tiles `t0..t1`), `ot` rescaled where a maximum grew.
    #[target_feature(enable = "avx512f")]
    unsafe fn softmax_block(&mut self, kb: usize, (c0, c1): (usize, usize), (t0, t1): (usize, usize)) {
        use crate::cpu::math::x86::exp16;
        let (mp, hd) = (self.mp, self.hd);
        let s = self.s.as_ptr();
        let ev = self.ev.as_mut_ptr() as *mut u32;
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let round = _mm512_set1_epi32(0x7FFF);
        let one = _mm512_set1_epi32(1);
        let mut t = t0;
        while t < t1 {
            // lanes of this 16-column group that belong to c0..c1
            let lo = c0.max(t) - t;
            let hi = c1.min(t + 16) - t;
            let lanes: __mmask16 = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
            let old = _mm512_mask_loadu_ps(ninf, lanes, self.max.as_ptr().add(t));
            let mut mx = old;
            for kk in 0..kb {
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, lanes, s.add(kk * mp + t)));
            }
            let seen = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, ninf);
            let shift = _mm512_maskz_mov_ps(seen, mx);
            let alpha = exp16(_mm512_sub_ps(old, shift));
            let mut acc = _mm512_setzero_ps();
            // per key pair: e^(s − shift) rounded to bf16 (nearest even) in the low half of each
            // lane, the rounded values added to the sum
            for pair in 0..kb / 2 {
                let mut r = [_mm512_setzero_si512(); 2];
                for (half, r) in r.iter_mut().enumerate() {
                    let x = _mm512_maskz_loadu_ps(lanes, s.add((2 * pair + half) * mp + t));
                    let b = _mm512_castps_si512(exp16(_mm512_sub_ps(x, shift)));
                    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), one);
                    let bits = _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(b, round), odd));
                    *r = _mm512_maskz_mov_epi32(lanes, bits);
                    acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(*r)));
                }
                // lane c: key 2·pair's weight in the low half, key 2·pair + 1's in the high
                let packed = _mm512_or_si512(r[0], _mm512_slli_epi32::<16>(r[1]));
                _mm512_storeu_si512(ev.add(pair * mp + t) as *mut _, packed);
            }
            let sum = _mm512_maskz_loadu_ps(lanes, self.sum.as_ptr().add(t));
            _mm512_mask_storeu_ps(self.sum.as_mut_ptr().add(t), lanes, _mm512_fmadd_ps(alpha, sum, acc));
            _mm512_mask_storeu_ps(self.max.as_mut_ptr().add(t), lanes, mx);
            let moved = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(alpha, _mm512_set1_ps(1.0)) & lanes;
            if moved != 0 {
                for d in 0..hd {
                    let p = self.ot.as_mut_ptr().add(d * mp + t);
                    _mm512_mask_storeu_ps(p, moved, _mm512_mul_ps(_mm512_loadu_ps(p), alpha));
                }
            }
            t += 16;
        }
    }

    /// The `(M, hd)` output, row `c` = column `c` of `ot` divided by its sum.
    fn finish(&mut self) -> &[f32] {
        let (mp, hd) = (self.mp, self.hd);
        for c in 0..self.m {
            let inv = 1.0 / self.sum[c];
            for d in 0..hd {
                self.o[c * hd + d] = self.ot[d * mp + c] * inv;
            }
        }
        &self.o[..self.m * hd]
    }
}

macro_rules! tile_op {
    ($($t:literal),*) => {
        #[inline(always)]
        unsafe fn tile_load<const T: u8>(p: *const u8, stride: usize) {
            match T {
                $($t => asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) p, s = in(reg) stride, options(nostack, readonly)),)*
                _ => unreachable!("tile register {T}"),
            }
        }
        #[inline(always)]
        unsafe fn tile_store<const T: u8>(p: *mut u8, stride: usize) {
            match T {
                $($t => asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) p, s = in(reg) stride, options(nostack)),)*
                _ => unreachable!("tile register {T}"),
            }
        }
    };
}
tile_op!(0, 1, 2, 3, 4, 5, 6);

/// One tile on the AMX tiles: the same function as [`super::tile_key_major`] (with bf16
/// products), its `(M, hd)` output rows handed to `done`.
///
/// # Safety
/// [`runs`] holds for `d.hd`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    t: Tile,
    d: &Dims,
    scale: f32,
    qd: &[f32],
    packed: &Packed,
    (starts, keys): (&[usize], &NewKeys<'_>),
    key_block: usize,
    done: impl FnOnce(&[f32]),
) {
    use std::cell::RefCell;
    thread_local! {
        static STATE: RefCell<State> = RefCell::new(State::default());
    }
    let Dims { h, hkv, g, l, hd, p, slots, per_slot } = *d;
    let Extent { nb, ni, per_row, m, n_new } = t.extent(g, l, keys);
    STATE.with(|cell| {
        let st = &mut *cell.borrow_mut();
        st.reset(m, hd, key_block.max(1).next_multiple_of(KSTEP));
        // columns ordered (row, head in group, query), as the other forms' rows
        for bb in 0..nb {
            for gg in 0..g {
                let head = t.j * g + gg;
                let src = &qd[(((t.b0 + bb) * h + head) * l + t.i0) * hd..][..ni * hd];
                for ii in 0..ni {
                    st.query((bb * g + gg) * ni + ii, &src[ii * hd..][..hd], scale);
                }
            }
        }
        let cfg = crate::cpu::amx::tile_config();
        asm!("ldtilecfg [{0}]", in(reg) cfg.as_ptr(), options(nostack, readonly));
        if p > 0 {
            let js = t.j * slots + t.b0 / per_slot;
            let lo: Vec<usize> = (0..m).map(|c| starts[t.b0 + c / per_row]).collect();
            let hi = vec![p; m];
            let sees = Sees { lo: &lo, hi: &hi, tree: None };
            st.segment(&packed.past[js], p, 0..m, &sees);
        }
        let query: Vec<usize> = (0..per_row).map(|c| t.i0 + c % ni).collect();
        let lo = vec![0; per_row];
        let hi: Vec<usize> = match keys {
            NewKeys::Causal => query.iter().map(|&i| i + 1).collect(),
            NewKeys::All | NewKeys::Tree(_) => vec![n_new; per_row],
        };
        let tree = match keys {
            NewKeys::Tree(vis) => Some((*vis, &query[..], l)),
            _ => None,
        };
        let sees = Sees { lo: &lo, hi: &hi, tree };
        for bb in 0..nb {
            let bj = (t.b0 + bb) * hkv + t.j;
            st.segment(&packed.new[bj], n_new, bb * per_row..(bb + 1) * per_row, &sees);
        }
        asm!("tilerelease", options(nostack, nomem));
        done(st.finish())
    })
}
