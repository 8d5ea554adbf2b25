use std::arch::asm;

use rayon::prelude::*;

use super::{bf16_bits_fast, Aligned, AmxBlocking, AmxWeight, Parts, KSTEP, NR};

/// bf16 values per tile (16 rows × 32).
pub(super) const TILE: usize = 16 * KSTEP;

/// The tile configuration: palette 1, tiles 0–7 all 16 rows × 64 bytes (C: 16 × 16 f32;
/// A: 16 rows × 32 bf16; B: 16 `k` pairs × 16 columns × 2 bf16).
#[repr(C, align(64))]
pub(super) struct Config(pub(super) [u8; 64]);

pub(super) fn config() -> Config {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
        c[48 + t] = 16;
    }
    Config(c)
}

macro_rules! load {
    ($t:literal, $p:expr) => {
        asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $p, s = in(reg) 64usize, options(nostack, readonly))
    };
}
macro_rules! load_c {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $p, s = in(reg) $stride, options(nostack, readonly))
    };
}
macro_rules! store {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $p, s = in(reg) $stride, options(nostack))
    };
}
/// C tiles 0–3 set to zero.
macro_rules! zero_c {
    () => {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        )
    };
}
macro_rules! dot {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem)
        )
    };
}
// the in-place bf16 product (`super::inplace`) runs the same tile instructions
pub(super) use {load_c, store, zero_c};

/// The six part products of one 32-`k` step into C tiles 0–3 (row tiles 0|1 × panels
/// 0|1): `a` the step's 6 A tiles (`[part][row tile]`, contiguous), `b[part][panel]` its B
/// tiles (each contiguous). Per step: 12 A-tile and 6 B-tile loads, 24 tile products.
#[inline(always)]
unsafe fn step(a: *const u16, b: &[[*const u16; 2]; 3]) {
    let at = |part: usize, i: usize| a.add((part * 2 + i) * TILE);
    macro_rules! quad {
        () => {
            dot!(0, 4, 6);
            dot!(1, 4, 7);
            dot!(2, 5, 6);
            dot!(3, 5, 7);
        };
    }
    // B = hi: A hi, mid, lo
    load!(6, b[0][0]);
    load!(7, b[0][1]);
    for part in 0..3 {
        load!(4, at(part, 0));
        load!(5, at(part, 1));
        quad!();
    }
    // B = mid: A hi, mid
    load!(6, b[1][0]);
    load!(7, b[1][1]);
    for part in 0..2 {
        load!(4, at(part, 0));
        load!(5, at(part, 1));
        quad!();
    }
    // B = lo: A hi
    load!(6, b[2][0]);
    load!(7, b[2][1]);
    load!(4, at(0, 0));
    load!(5, at(0, 1));
    quad!();
}

/// The one product of a one-part 32-`k` step into C tiles 0–3: `a` the step's 2 A tiles
/// (`[row tile]`, contiguous), `b[panel]` its B tiles. 2 A-tile and 2 B-tile loads, 4 tile
/// products.
#[inline(always)]
pub(super) unsafe fn step_one(a: *const u16, b: [*const u16; 2]) {
    load!(6, b[0]);
    load!(7, b[1]);
    load!(4, a);
    load!(5, a.add(TILE));
    dot!(0, 4, 6);
    dot!(1, 4, 7);
    dot!(2, 5, 6);
    dot!(3, 5, 7);
}

/// The int8 product's tile configuration: C tiles 0–3 16 rows × 16 i32; A tiles 4–5 16
/// rows × 32 int8 (one block of 16 rows); B tiles 6–7 8 rows × 64 bytes (a block's 8
/// groups of 16 columns × 4 int8: one panel block of the AVX-512 `Q8_0` layout).
fn config_q8() -> Config {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        let (colsb, rows) = match t {
            0..=3 => (64u16, 16u8),
            4 | 5 => (32, 16),
            _ => (64, 8),
        };
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        c[48 + t] = rows;
    }
    Config(c)
}

/// `xs` (32 floats) rounded as `Q8_0` rounds (the VNNI kernel's rounding) into 32 int8 at
/// `out`; returns the scale.
#[target_feature(enable = "avx2,fma")]
unsafe fn round_block(xs: &[f32], out: *mut i8) -> f32 {
    use std::arch::x86_64::*;
    let (d, q) = super::super::qgemm::x86_rounded(xs);
    // i32 -> i16 -> i8 packs 128-bit lanes pairwise; 0xD8 restores the order each time
    let w01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
    let w23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
    let b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w01, w23), 0xD8);
    _mm256_storeu_si256(out as *mut __m256i, b);
    d
}

/// `x (m, k)` rounded to `Q8_0` blocks as A tiles `[row pair][block][row tile][16][32]`
/// and their scales `[row][block]` (`m` padded to 32 rows of zeros, scale 0).
fn pack_q8_rows(x: &[f32], m: usize, k: usize) -> (Aligned<i8>, Vec<f32>) {
    let (mp, blocks) = (m.next_multiple_of(32), k / 32);
    let pair = blocks * 2 * 512;
    let mut a = Aligned::<i8>::zeroed((mp / 32) * pair);
    let mut s = vec![0f32; mp * blocks];
    a.par_chunks_mut(pair.max(1))
        .zip(s.par_chunks_mut((32 * blocks).max(1)))
        .enumerate()
        .for_each(|(rp, (dst, s))| {
            for rr in 0..32.min(m.saturating_sub(rp * 32)) {
                let row = &x[(rp * 32 + rr) * k..][..k];
                let (i, r) = (rr / 16, rr % 16);
                for (b, xs) in row.chunks_exact(32).enumerate() {
                    let at = b * 1024 + i * 512 + r * 32;
                    // SAFETY: every level of the CPU kernels includes AVX2; `xs` holds 32
                    // floats and `dst` 32 bytes from `at`
                    s[rr * blocks + b] = unsafe { round_block(xs, dst.as_mut_ptr().add(at)) };
                }
            }
        });
    (a, s)
}

/// One block's i32 sums of a 32 × 32 output block (`c`, row stride 32) added into `out`
/// (row stride `np`) scaled by the rows' scales (`s`, `sstride` apart) times the two
/// panels' column scales (`d0`, `d1`): `out = fma(f32(c), s · d, out)`, as the VNNI kernel.
#[target_feature(enable = "avx512f")]
unsafe fn scale_q8(
    c: *const i32,
    s: *const f32,
    sstride: usize,
    d: [*const f32; 2],
    out: *mut f32,
    np: usize,
) {
    use std::arch::x86_64::*;
    let dv = d.map(|d| _mm512_loadu_ps(d));
    for r in 0..32 {
        let sv = _mm512_set1_ps(*s.add(r * sstride));
        let o = out.add(r * np);
        for (j, dv) in dv.iter().enumerate() {
            let ci = _mm512_loadu_si512(c.add(r * 32 + 16 * j) as *const __m512i);
            let f = _mm512_loadu_ps(o.add(16 * j));
            let f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ci), _mm512_mul_ps(sv, *dv), f);
            _mm512_storeu_ps(o.add(16 * j), f);
        }
    }
}

/// `x (m, k) · Wᵀ -> (m, n)` through the int8 tiles: `q` / `d` the AVX-512 `Q8_0` layout's
/// values `[panel][block][8][16][4]` and scales `[panel][block][16]` of `W (n, k)`.
pub(super) fn product_q8(
    x: &[f32],
    m: usize,
    (n, k): (usize, usize),
    q: &[i8],
    d: &[f32],
) -> Vec<f32> {
    let (a, s) = pack_q8_rows(x, m, k);
    let panels = n.div_ceil(NR);
    let (mp, np) = (m.next_multiple_of(32), panels.next_multiple_of(2) * NR);
    let mut acc = vec![0f32; mp * np];
    let acc_addr = acc.as_mut_ptr() as usize;
    super::super::host::for_panel_runs(panels, true, |p0, p1| {
        // SAFETY: AMX-INT8 runs here (the caller checked); `a` / `s` hold the mp padded rows'
        // tiles and scales, `q` / `d` every panel's blocks; `acc` holds mp · np and the runs
        // of panel pairs write disjoint columns.
        unsafe { run_q8(&a, &s, mp, np, k / 32, q, d, p0, p1, acc_addr as *mut f32) };
    });
    if np == n {
        acc.truncate(m * n);
        return acc;
    }
    let mut y = Vec::with_capacity(m * n);
    for row in acc.chunks_exact(np).take(m) {
        y.extend_from_slice(&row[..n]);
    }
    y
}

/// Panel pairs `p0..p1` of the int8 product into the padded `acc (mp, np)` (zeros before):
/// per panel pair, per row pair, block after block, the four tile sums then their scaled
/// addition (the weight's pair stays in L2 while every row pair passes).
#[allow(clippy::too_many_arguments)]
unsafe fn run_q8(
    a: &[i8],
    s: &[f32],
    mp: usize,
    np: usize,
    blocks: usize,
    q: &[i8],
    d: &[f32],
    p0: usize,
    p1: usize,
    acc: *mut f32,
) {
    let zero_q = Aligned::<i8>::zeroed(512);
    let zero_d = vec![0f32; blocks * NR];
    let c = Aligned::<i32>::zeroed(32 * 32);
    let cp = c.as_ptr() as *mut i32;
    let cfg = config_q8();
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
    for p in (p0..p1).step_by(2) {
        let pair = p + 1 < p1;
        for rp in 0..mp / 32 {
            let ar = a.as_ptr().add(rp * blocks * 1024);
            for b in 0..blocks {
                let qb = |panel: usize| q.as_ptr().add((panel * blocks + b) * 512);
                let b1 = if pair { qb(p + 1) } else { zero_q.as_ptr() };
                zero_c!();
                load_c!(4, ar.add(b * 1024), 32usize);
                load_c!(5, ar.add(b * 1024 + 512), 32usize);
                load_c!(6, qb(p), 64usize);
                load_c!(7, b1, 64usize);
                asm!(
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    options(nostack, nomem)
                );
                store!(0, cp, 128usize);
                store!(1, cp.add(16), 128usize);
                store!(2, cp.add(16 * 32), 128usize);
                store!(3, cp.add(16 * 32 + 16), 128usize);
                let d1 = match pair {
                    true => d.as_ptr().add(((p + 1) * blocks + b) * NR),
                    false => zero_d.as_ptr().add(b * NR),
                };
                scale_q8(
                    cp,
                    s.as_ptr().add(rp * 32 * blocks + b),
                    blocks,
                    [d.as_ptr().add((p * blocks + b) * NR), d1],
                    acc.add(rp * 32 * np + p * NR),
                    np,
                );
            }
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// Prefetch `bytes` from `p` into L1, a line at a time.
#[inline(always)]
unsafe fn prefetch(p: *const u16, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for off in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>((p as *const i8).add(off));
    }
}

/// `x (m, k)` split into `parts` and packed as A tiles:
/// `[row pair][step][part][row tile][16][32]` (`mp` = `m` rounded up to 32 rows; padding
/// rows and `k` are 0).
pub(super) fn pack_rows(x: &[f32], m: usize, k: usize, kp: usize, parts: Parts) -> Aligned<u16> {
    let mp = m.next_multiple_of(32);
    let steps = kp / KSTEP;
    let count = parts.count();
    let pair = steps * count * 2 * TILE;
    let mut a = Aligned::<u16>::zeroed((mp / 32) * pair);
    a.par_chunks_mut(pair).enumerate().for_each(|(rp, dst)| {
        for rr in 0..32.min(m.saturating_sub(rp * 32)) {
            let row = &x[(rp * 32 + rr) * k..][..k];
            let (i, r) = (rr / 16, rr % 16);
            for (ks, chunk) in row.chunks(KSTEP).enumerate() {
                let base = ks * count * 2 * TILE + i * TILE + r * KSTEP;
                if parts == Parts::One {
                    for (kk, &v) in chunk.iter().enumerate() {
                        dst[base + kk] = bf16_bits_fast(v);
                    }
                    continue;
                }
                for (kk, &v) in chunk.iter().enumerate() {
                    let hi = bf16_bits_fast(v);
                    let r1 = v - f32::from_bits((hi as u32) << 16);
                    let mid = bf16_bits_fast(r1);
                    let r2 = r1 - f32::from_bits((mid as u32) << 16);
                    dst[base + kk] = hi;
                    dst[base + 2 * TILE + kk] = mid;
                    dst[base + 4 * TILE + kk] = bf16_bits_fast(r2);
                }
            }
        }
    });
    a
}

/// `x (m, k) · Wᵀ -> (m, n)` row-major, on the rayon threads (one run of panel pairs each).
pub(super) fn product(x: &[f32], m: usize, w: &AmxWeight, bl: &AmxBlocking) -> Vec<f32> {
    let (n, k, kp) = (w.n, w.k, w.kp);
    let a = pack_rows(x, m, k, kp, w.parts);
    let panels = n.div_ceil(NR);
    let zero = Aligned::<u16>::zeroed(kp * NR);
    // the output padded to whole tiles: (⌈m/32⌉·32, ⌈panels/2⌉·32); y itself when m and n
    // are whole already
    let (mp, np) = (m.next_multiple_of(32), panels.next_multiple_of(2) * NR);
    let mut acc: Vec<f32> = Vec::with_capacity(mp * np);
    let acc_addr = acc.as_mut_ptr() as usize;
    super::super::host::for_panel_runs(panels, true, |p0, p1| {
        // SAFETY: AMX runs here (the caller checked `available`); `a` holds the packed row
        // pairs of mp rows, each plane ⌈n/16⌉·kp·16 elements, `zero` kp·16, as `run` reads
        // them; `acc` has capacity mp·np and the runs of panel pairs write disjoint columns.
        unsafe { run(&a, mp, np, w, &zero, p0, p1, acc_addr as *mut f32, bl) };
    });
    // SAFETY: every tile of the padded output was written (the runs cover all panel pairs
    // and every row pair).
    unsafe { acc.set_len(mp * np) };
    if mp == m && np == n {
        return acc;
    }
    let mut y = Vec::with_capacity(m * n);
    for row in acc.chunks_exact(np).take(m) {
        y.extend_from_slice(&row[..n]);
    }
    y
}

/// What one thread's tile passes read and write.
struct Pass<'a> {
    /// The packed activations (`pack_rows`).
    a: &'a [u16],
    /// Elements per packed row pair.
    pair: usize,
    w: &'a AmxWeight,
    /// A zero panel (`kp · 16`), the partner of an odd last panel.
    zero: &'a [u16],
    /// The thread's panels end here.
    p1: usize,
    /// The padded output and its row length.
    acc: *mut f32,
    np: usize,
    steps: usize,
    bl: &'a AmxBlocking,
}

impl Pass<'_> {
    /// The `k` step whose tiles a step reads (the first, under the `hot` probe).
    fn at(&self, ks: usize) -> usize {
        if self.bl.hot {
            0
        } else {
            ks
        }
    }

    /// B tile of `part` for `panel` at step `ks` (the zero panel past the thread's last).
    unsafe fn b(&self, part: usize, panel: usize, ks: usize) -> *const u16 {
        let kp = self.w.kp;
        match panel < self.p1 {
            true => self.w.planes[part]
                .as_ptr()
                .add(panel * kp * NR + self.at(ks) * TILE),
            false => self.zero.as_ptr().add(self.at(ks) * TILE),
        }
    }

    /// Steps `k0..k1` of the 32 × 32 output block (row pair `rp`, panels `p`, `p + 1`):
    /// the C tiles start from zero at `k0 == 0`, else from the output; stored back after.
    unsafe fn block(&self, rp: usize, p: usize, k0: usize, k1: usize) {
        let sc = self.np * 4; // C-tile row stride, bytes
                              // C tile (i, j): rows 32·rp + 16i, columns 16·(p + j)
        let c = |i: usize, j: usize| self.acc.add((rp * 32 + 16 * i) * self.np + (p + j) * NR);
        if k0 == 0 {
            zero_c!();
        } else {
            load_c!(0, c(0, 0), sc);
            load_c!(1, c(0, 1), sc);
            load_c!(2, c(1, 0), sc);
            load_c!(3, c(1, 1), sc);
        }
        let ar = self.a.as_ptr().add(rp * self.pair);
        let (q, pf) = (p + 1, self.bl.pf);
        let count = self.w.parts.count();
        // A tiles of one step: `count` parts × 2 row tiles
        let a_step = count * 2 * TILE;
        for ks in k0..k1 {
            if pf > 0 && ks + pf < self.steps {
                prefetch(ar.add(self.at(ks + pf) * a_step), a_step * 2);
                for part in 0..count {
                    prefetch(self.b(part, p, ks + pf), TILE * 2);
                    prefetch(self.b(part, q, ks + pf), TILE * 2);
                }
            }
            let a = ar.add(self.at(ks) * a_step);
            match self.w.parts {
                Parts::One => step_one(a, [self.b(0, p, ks), self.b(0, q, ks)]),
                Parts::Three => {
                    let bt = [
                        [self.b(0, p, ks), self.b(0, q, ks)],
                        [self.b(1, p, ks), self.b(1, q, ks)],
                        [self.b(2, p, ks), self.b(2, q, ks)],
                    ];
                    step(a, &bt);
                }
            }
        }
        store!(0, c(0, 0), sc);
        store!(1, c(0, 1), sc);
        store!(2, c(1, 0), sc);
        store!(3, c(1, 1), sc);
    }
}

/// Panel pairs `p0..p1` of the product into the padded output `acc (mp, np)`.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    a: &[u16],
    mp: usize,
    np: usize,
    w: &AmxWeight,
    zero: &[u16],
    p0: usize,
    p1: usize,
    acc: *mut f32,
    bl: &AmxBlocking,
) {
    let steps = w.kp / KSTEP;
    let pairs = mp / 32;
    let pass = Pass {
        a,
        pair: steps * w.parts.count() * 2 * TILE,
        w,
        zero,
        p1,
        acc,
        np,
        steps,
        bl,
    };
    let cfg = config();
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
    // k steps per L2 block: the row block's A tiles of that k range stay in L2 across the
    // thread's panel pairs (C stored and reloaded between blocks)
    let kc = match bl.kc {
        0 => steps,
        kc => kc.min(steps),
    };
    // k steps per pass over a row block: all of the L2 block's (C stays in tiles), or
    // `kb` (so the pair's B slice stays in L1 across the row pairs)
    let kb = match bl.kb {
        0 => kc,
        kb => kb.min(kc),
    };
    if bl.nb > 0 {
        // weight-block order: `nb` panel pairs × an L2 block's steps stay in L2 while every
        // row pair passes (the weight read from memory once per call)
        for pb in (p0..p1).step_by(2 * bl.nb) {
            for kc0 in (0..steps).step_by(kc) {
                for rp in 0..pairs {
                    for p in (pb..(pb + 2 * bl.nb).min(p1)).step_by(2) {
                        pass.block(rp, p, kc0, (kc0 + kc).min(steps));
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
        return;
    }
    for kc0 in (0..steps).step_by(kc) {
        let kc1 = (kc0 + kc).min(steps);
        for rb in (0..pairs).step_by(bl.mc / 32) {
            for p in (p0..p1).step_by(2) {
                for k0 in (kc0..kc1).step_by(kb) {
                    for rp in rb..(rb + bl.mc / 32).min(pairs) {
                        pass.block(rp, p, k0, (k0 + kb).min(kc1));
                    }
                }
            }
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}
