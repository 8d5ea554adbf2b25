//! Attention tiles on the AMX bf16 tiles, for models whose linear layers already compute in
//! bf16 or int8 (`--quantize bf16|int8`, `--dtype bf16` on the CPU): the same tiles, visibility
//! and online softmax as the key-major form ([`super::key_major`]), with the two products on
//! `tdpbf16ps` instead of f32 FMAs. The queries (pre-scaled), keys and values are rounded to
//! bf16 once, and each block's softmax weights `e^(s − max)` once before the value product;
//! scores, maxima, sums and the output accumulate in f32 (the sums add the weights before their
//! rounding: the two differ by under 2^-9 of a weight).
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

use super::key_major::{hide, Sees, TileSees};
use super::*;
use crate::cpu::amx::bf16_bits_fast;

/// Keys per step of the value product (one A tile row of bf16).
const KSTEP: usize = 32;

/// Whether AMX tiles compute a call of head dim `hd`: AMX runs in this process (under the
/// `FORKSCORE_CPU_ISA` cap: AVX-512 chosen), the CPU has AVX-512 BF16 (its conversions) and
/// `hd` is whole 32-dim steps.
pub(super) fn runs(hd: usize) -> bool {
    use super::super::isa::Isa;
    hd > 0
        && hd.is_multiple_of(KSTEP)
        && Isa::chosen() == Some(Isa::Avx512)
        && crate::cpu::amx::available()
        && std::arch::is_x86_feature_detected!("avx512bf16")
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
        *o = bf16_bits_fast(x);
    }
    let mut vt = vec![0u16; hd * n32];
    for (kk, row) in v[..n * hd].chunks_exact(hd).enumerate() {
        for (d, &x) in row.iter().enumerate() {
            vt[d * n32 + kk] = bf16_bits_fast(x);
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
    pub(super) fn pack(
        d: &Dims,
        b: usize,
        (kd, vd): (&[f32], &[f32]),
        (pkd, pvd): (&[f32], &[f32]),
    ) -> Self {
        let (p, l, hd) = (d.p, d.l, d.hd);
        Packed {
            past: (0..d.hkv * d.slots)
                .into_par_iter()
                .map(|js| {
                    pack(
                        &pkd[js * p * hd..][..p * hd],
                        &pvd[js * p * hd..][..p * hd],
                        p,
                        hd,
                    )
                })
                .collect(),
            new: (0..b * d.hkv)
                .into_par_iter()
                .map(|bj| {
                    pack(
                        &kd[bj * l * hd..][..l * hd],
                        &vd[bj * l * hd..][..l * hd],
                        l,
                        hd,
                    )
                })
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
        // the output is written whole by `finish`
        if self.o.len() < m * hd {
            self.o.resize(m * hd, 0.0);
        }
    }

    /// Column `c`'s query `q (hd,)`, times `scale`, rounded to bf16 (nearest even): 32 dims
    /// at a time, their 16 pairs scattered down the column.
    ///
    /// # Safety
    /// The CPU has AVX-512 BF16; `c < mp`, `q` holds `hd` values (a multiple of 32).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn query(&mut self, c: usize, q: &[f32], scale: f32) {
        let mp = self.mp as i32;
        let sc = _mm512_set1_ps(scale);
        let rows = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(mp),
        );
        let qv = self.qv.as_mut_ptr() as *mut i32;
        for d in (0..self.hd).step_by(KSTEP) {
            let a = _mm512_mul_ps(_mm512_loadu_ps(q.as_ptr().add(d)), sc);
            let b = _mm512_mul_ps(_mm512_loadu_ps(q.as_ptr().add(d + 16)), sc);
            // u16 lanes 0..32 = dims d..d+32 in order: u32 lane p = the pair (d + 2p, d + 2p + 1)
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
            _mm512_i32scatter_epi32::<4>(qv.add((d / 2) * self.mp + c), rows, v);
        }
    }

    /// Attend columns `cols` to one segment of `n` visible-at-most keys (`sees` per column).
    ///
    /// # Safety
    /// AMX runs and this thread has loaded the tile configuration; the CPU has AVX-512; `cols`
    /// lies in `0..m`, `sees` has one entry per column with `hi ≤ n ≤ seg.n32`, and a tree's
    /// rows cover the keys.
    unsafe fn segment(
        &mut self,
        seg: &Segment,
        n: usize,
        cols: std::ops::Range<usize>,
        sees: &Sees<'_>,
    ) {
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
            // scores s[kk][c] = k[k0 + kk] · q[c], per 32 keys (kend − k0 is whole 32-key
            // steps): 32 columns at a time in four C tiles (each key and query tile loaded
            // once for two products), a last 16 in two
            let key = |g: usize, d0: usize| seg.k.as_ptr().add(g * hd + d0) as *const u8;
            let qry =
                |d0: usize, t: usize| self.qv.as_ptr().add((d0 / 2 * mp + t) * 2) as *const u8;
            let score = |g: usize, t: usize| self.s.as_ptr().add((g - k0) * mp + t) as *mut u8;
            let (ldk, ldq, lds) = (hd * 2, mp * 4, mp * 4);
            let mut t = t0;
            while t + 32 <= t1 {
                for g0 in (k0..kend).step_by(32) {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        options(nostack, nomem)
                    );
                    for d0 in (0..hd).step_by(KSTEP) {
                        tile_load::<4>(key(g0, d0), ldk);
                        tile_load::<5>(key(g0 + 16, d0), ldk);
                        tile_load::<6>(qry(d0, t), ldq);
                        tile_load::<7>(qry(d0, t + 16), ldq);
                        asm!(
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm5, tmm6",
                            "tdpbf16ps tmm2, tmm4, tmm7",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            options(nostack, nomem)
                        );
                    }
                    tile_store::<0>(score(g0, t), lds);
                    tile_store::<1>(score(g0 + 16, t), lds);
                    tile_store::<2>(score(g0, t + 16), lds);
                    tile_store::<3>(score(g0 + 16, t + 16), lds);
                }
                t += 32;
            }
            if t < t1 {
                for g0 in (k0..kend).step_by(32) {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    for d0 in (0..hd).step_by(KSTEP) {
                        tile_load::<2>(qry(d0, t), ldq);
                        tile_load::<3>(key(g0, d0), ldk);
                        tile_load::<4>(key(g0 + 16, d0), ldk);
                        asm!(
                            "tdpbf16ps tmm0, tmm3, tmm2",
                            "tdpbf16ps tmm1, tmm4, tmm2",
                            options(nostack, nomem)
                        );
                    }
                    tile_store::<0>(score(g0, t), lds);
                    tile_store::<1>(score(g0 + 16, t), lds);
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
                        asm!(
                            "tdpbf16ps tmm0, tmm5, tmm4",
                            "tdpbf16ps tmm1, tmm6, tmm4",
                            options(nostack, nomem)
                        );
                        tile_load::<5>(v(d0 + 32, kk), ldv);
                        tile_load::<6>(v(d0 + 48, kk), ldv);
                        asm!(
                            "tdpbf16ps tmm2, tmm5, tmm4",
                            "tdpbf16ps tmm3, tmm6, tmm4",
                            options(nostack, nomem)
                        );
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
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn softmax_block(
        &mut self,
        kb: usize,
        (c0, c1): (usize, usize),
        (t0, t1): (usize, usize),
    ) {
        use crate::cpu::math::x86::exp16;
        let (mp, hd) = (self.mp, self.hd);
        let s = self.s.as_ptr();
        let ev = self.ev.as_mut_ptr() as *mut u32;
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        // u16 lane 2c ← lane c (the first key's weights), 2c + 1 ← lane 16 + c (the second's)
        let interleave = _mm512_loadu_si512(INTERLEAVE.as_ptr() as *const _);
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
            // per key pair: e^(s − shift) for both keys ([`exp_nonpositive`]), summed, and
            // rounded to bf16 (nearest even) as one B-tile row: column c's lane holds key
            // 2·pair's weight in its low half and key 2·pair + 1's in its high half
            for pair in 0..kb / 2 {
                let x0 = _mm512_maskz_loadu_ps(lanes, s.add(2 * pair * mp + t));
                let x1 = _mm512_maskz_loadu_ps(lanes, s.add((2 * pair + 1) * mp + t));
                let e0 = _mm512_maskz_mov_ps(lanes, exp_nonpositive(_mm512_sub_ps(x0, shift)));
                let e1 = _mm512_maskz_mov_ps(lanes, exp_nonpositive(_mm512_sub_ps(x1, shift)));
                acc = _mm512_add_ps(acc, _mm512_add_ps(e0, e1));
                let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(e1, e0));
                _mm512_storeu_si512(
                    ev.add(pair * mp + t) as *mut _,
                    _mm512_permutexvar_epi16(interleave, both),
                );
            }
            let sum = _mm512_maskz_loadu_ps(lanes, self.sum.as_ptr().add(t));
            _mm512_mask_storeu_ps(
                self.sum.as_mut_ptr().add(t),
                lanes,
                _mm512_fmadd_ps(alpha, sum, acc),
            );
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

    /// The `(M, hd)` output, row `c` = column `c` of `ot` divided by its sum: per 16 columns
    /// and dim, one register of `ot` scaled and scattered down the output rows.
    ///
    /// # Safety
    /// The CPU has AVX-512.
    #[target_feature(enable = "avx512f")]
    unsafe fn finish(&mut self) -> &[f32] {
        let (m, mp, hd) = (self.m, self.mp, self.hd);
        let rows = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(hd as i32),
        );
        let o = self.o.as_mut_ptr();
        for c in (0..m).step_by(16) {
            let w = (m - c).min(16);
            let lanes: __mmask16 = if w == 16 { !0 } else { (1u16 << w) - 1 };
            let inv = _mm512_div_ps(
                _mm512_set1_ps(1.0),
                _mm512_mask_loadu_ps(_mm512_set1_ps(1.0), lanes, self.sum.as_ptr().add(c)),
            );
            for d in 0..hd {
                let v = _mm512_mul_ps(_mm512_loadu_ps(self.ot.as_ptr().add(d * mp + c)), inv);
                _mm512_mask_i32scatter_ps::<4>(o.add(c * hd + d), lanes, rows, v);
            }
        }
        &self.o[..m * hd]
    }
}

/// The permutation of [`State::softmax_block`]: two keys' 16 bf16 weights (lanes 0..16 and
/// 16..32 of `vcvtne2ps2bf16`'s result) interleaved column by column.
static INTERLEAVE: [u16; 32] = {
    let mut idx = [0u16; 32];
    let mut c = 0;
    while c < 16 {
        idx[2 * c] = c as u16;
        idx[2 * c + 1] = 16 + c as u16;
        c += 1;
    }
    idx
};

/// `e^x` for `x ≤ 0` (a softmax weight; `-inf` and anything below −87.3 give exactly 0) to
/// about 5e-6 relative, ample for a weight then rounded to bf16 (2^-9): the range reduction of
/// [`crate::cpu::math`] with a degree-5 polynomial and `vscalefps` for `2^n`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp_nonpositive(x: __m512) -> __m512 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let flush = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.3));
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.3));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    // 1 + r + r²/2 + r³/6 + r⁴/24 + r⁵/120 (Horner)
    let mut p = _mm512_set1_ps(1.0 / 120.0);
    for c in [1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_maskz_mov_ps(!flush, _mm512_scalef_ps(p, n))
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
tile_op!(0, 1, 2, 3, 4, 5, 6, 7);

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
    let Dims {
        hkv,
        g,
        l,
        hd,
        p,
        slots,
        per_slot,
        ..
    } = *d;
    let extent = t.extent(g, l, keys);
    let Extent {
        nb,
        per_row,
        m,
        n_new,
        ..
    } = extent;
    STATE.with(|cell| {
        let st = &mut *cell.borrow_mut();
        st.reset(m, hd, key_block.max(1).next_multiple_of(KSTEP));
        t.queries(d, &extent, qd, |c, q| st.query(c, q, scale));
        let cfg = crate::cpu::amx::tile_config();
        asm!("ldtilecfg [{0}]", in(reg) cfg.as_ptr(), options(nostack, readonly));
        let sees = TileSees::new(&t, &extent, (p, l), (starts, keys));
        if p > 0 {
            let js = t.j * slots + t.b0 / per_slot;
            st.segment(&packed.past[js], p, 0..m, &sees.past());
        }
        let new_sees = sees.new_keys();
        for bb in 0..nb {
            let bj = (t.b0 + bb) * hkv + t.j;
            st.segment(
                &packed.new[bj],
                n_new,
                bb * per_row..(bb + 1) * per_row,
                &new_sees,
            );
        }
        asm!("tilerelease", options(nostack, nomem));
        done(st.finish())
    })
}
