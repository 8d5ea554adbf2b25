//! One attention tile of the CPU kernel: a block of query rows of one KV head against its
//! visible keys, as f32 products ([`tile`]) or in the key-major form on AVX2 / AVX-512.

use super::*;

/// The widths of the key-major form.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyMajor {
    Avx512,
    Avx2,
}

/// Which key-major width tiles take, if any: asked for (`form`), the CPU's level, a head dim
/// that is a multiple of the width's lanes (its registers of output columns) and, for the
/// 8-lane width under `Auto`, a long call (`long`: a prefill's query blocks). The 8-lane form
/// measured 0–7 % faster than the products form on a prefill layer on CPUs capped at AVX2,
/// but 5–11 % slower on the scoring shapes there (the `cpu_attention`
/// bench), so short calls keep the products form.
#[cfg(target_arch = "x86_64")]
pub(super) fn key_major(form: TileForm, hd: usize, long: bool) -> Option<KeyMajor> {
    use super::super::isa::Isa;
    let level = Isa::chosen()?;
    match form {
        TileForm::Products => None,
        TileForm::Auto if level == Isa::Avx512 && hd.is_multiple_of(16) => Some(KeyMajor::Avx512),
        TileForm::Auto if !long => None,
        TileForm::Auto | TileForm::KeyMajorAvx2 => hd.is_multiple_of(8).then_some(KeyMajor::Avx2),
    }
}

/// A call's keys packed for the key-major form once, before its tiles: each past slot's and
/// each row's new keys, per KV head.
#[cfg(target_arch = "x86_64")]
pub(super) struct KeyMajorKeys {
    /// `[j · slots + slot]`: KV head `j`'s keys of a past slot.
    past: Vec<Vec<f32>>,
    /// `[row · Hkv + j]`: a row's new keys of KV head `j`.
    new: Vec<Vec<f32>>,
}

#[cfg(target_arch = "x86_64")]
impl KeyMajorKeys {
    pub(super) fn pack<L: super::key_major::Lanes>(
        d: &Dims,
        b: usize,
        kd: &[f32],
        pkd: &[f32],
    ) -> Self {
        use super::key_major::pack_keys;
        let (p, l, hd) = (d.p, d.l, d.hd);
        KeyMajorKeys {
            past: (0..d.hkv * d.slots)
                .into_par_iter()
                .map(|js| pack_keys::<L>(&pkd[js * p * hd..][..p * hd], p, hd))
                .collect(),
            new: (0..b * d.hkv)
                .into_par_iter()
                .map(|bj| pack_keys::<L>(&kd[bj * l * hd..][..l * hd], l, hd))
                .collect(),
        }
    }
}

/// One tile in the key-major form of width `L` ([`super::key_major`]): the same function
/// as [`tile`], its `(M, hd)` output rows (same order) handed to `done`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_key_major<L: super::key_major::Lanes>(
    t: Tile,
    d: &Dims,
    scale: f32,
    (qd, vd): (&[f32], &[f32]),
    pvd: &[f32],
    packed: &KeyMajorKeys,
    (starts, keys): (&[usize], &NewKeys<'_>),
    key_block: usize,
    done: impl FnOnce(&[f32]),
) {
    use super::key_major::{with_state, TileSees};
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
    with_state::<L, _>(m, hd, key_block, |st| {
        t.queries(d, &extent, qd, |c, q| st.query(c, q, scale));
        let sees = TileSees::new(&t, &extent, (p, l), (starts, keys));
        if p > 0 {
            let js = t.j * slots + t.b0 / per_slot;
            // SAFETY: the caller checked L's instructions and that hd is a multiple of its lanes
            // (`key_major`); the slot's packed keys and values hold P keys of hd; columns 0..M,
            // every `hi` is P.
            unsafe {
                st.segment::<L>(
                    &packed.past[js],
                    &pvd[js * p * hd..][..p * hd],
                    p,
                    0..m,
                    &sees.past(),
                )
            };
        }
        let new_sees = sees.new_keys();
        for bb in 0..nb {
            let bj = (t.b0 + bb) * hkv + t.j;
            let values = &vd[bj * l * hd..][..n_new * hd];
            // SAFETY: as above; the row's packed new keys hold L ≥ N keys, its values N; the
            // columns are the row's, every `hi` is at most N (a query sees keys up to itself,
            // and N reaches the tile's last query), and the tree's rows have L entries.
            unsafe {
                st.segment::<L>(
                    &packed.new[bj],
                    values,
                    n_new,
                    bb * per_row..(bb + 1) * per_row,
                    &new_sees,
                )
            };
        }
        done(st.finish())
    })
}

/// The extents every tile reads.
pub(super) struct Dims {
    pub(super) h: usize,
    pub(super) hkv: usize,
    pub(super) g: usize,
    pub(super) l: usize,
    pub(super) hd: usize,
    /// Past keys per slot (0 without a past).
    pub(super) p: usize,
    /// Past slots (1 without a past).
    pub(super) slots: usize,
    /// Rows per past slot.
    pub(super) per_slot: usize,
}

/// One tile of [`attend`]: its `(M, hd)` output rows, ordered (row, head in group, query).
pub(super) fn tile(
    t: Tile,
    d: &Dims,
    scale: f32,
    (qd, kd, vd): (&[f32], &[f32], &[f32]),
    (pkd, pvd): (&[f32], &[f32]),
    starts: &[usize],
    keys: &NewKeys<'_>,
) -> Vec<f32> {
    let Dims {
        h,
        hkv,
        g,
        l,
        hd,
        p,
        slots,
        per_slot,
    } = *d;
    let Extent {
        nb,
        ni,
        per_row,
        m,
        n_new,
    } = t.extent(g, l, keys);
    let width = p + n_new;

    // (M, hd) queries, rows (row, head in group, query), pre-scaled
    let mut qt = vec![0f32; m * hd];
    for bb in 0..nb {
        for gg in 0..g {
            let head = t.j * g + gg;
            let src = &qd[(((t.b0 + bb) * h + head) * l + t.i0) * hd..][..ni * hd];
            let dst = &mut qt[(bb * g + gg) * ni * hd..][..ni * hd];
            for (o, &x) in dst.iter_mut().zip(src) {
                *o = x * scale;
            }
        }
    }

    // (M, P + N) scores: past part in one product, then each row's new keys
    let mut sc = vec![0f32; m * width];
    let slot = t.b0 / per_slot;
    let past_off = (t.j * slots + slot) * p * hd;
    if p > 0 {
        let kp = &pkd[past_off..][..p * hd];
        // SAFETY: qt is M × hd, kp is P × hd (read as its transpose), sc is M × width.
        unsafe {
            product(
                (m, p, hd),
                sc.as_mut_ptr(),
                width,
                false,
                (qt.as_ptr(), hd, 1),
                (kp.as_ptr(), 1, hd),
            )
        };
    }
    for bb in 0..nb {
        let kn = &kd[(((t.b0 + bb) * hkv + t.j) * l) * hd..][..n_new * hd];
        let r0 = bb * per_row;
        // SAFETY: rows r0..r0+per_row of qt and sc; kn is N × hd read as its transpose; the
        // destination columns p..p+N of those sc rows are in bounds.
        unsafe {
            product(
                (per_row, n_new, hd),
                sc.as_mut_ptr().add(r0 * width + p),
                width,
                false,
                (qt.as_ptr().add(r0 * hd), hd, 1),
                (kn.as_ptr(), 1, hd),
            )
        };
    }

    // softmax per query row over past[start..P] ++ its visible new keys; hidden keys get 0
    let mut inv_sum = vec![0f32; m];
    for bb in 0..nb {
        let start = starts[t.b0 + bb];
        for gg in 0..g {
            for ii in 0..ni {
                let i = t.i0 + ii;
                let row = &mut sc[((bb * g + gg) * ni + ii) * width..][..width];
                let (past_part, new_part) = row.split_at_mut(p);
                past_part[..start].fill(0.0);
                let visible_new = match keys {
                    NewKeys::All => n_new,
                    NewKeys::Causal => {
                        new_part[i + 1..].fill(0.0);
                        i + 1
                    }
                    NewKeys::Tree(vis) => {
                        for (s, &v) in new_part.iter_mut().zip(&vis[i * l..][..n_new]) {
                            if v == 0 {
                                *s = f32::NEG_INFINITY;
                            }
                        }
                        n_new
                    }
                };
                let past_vis = &mut past_part[start..];
                let new_vis = &mut new_part[..visible_new];
                let max = super::super::math::max(past_vis).max(super::super::math::max(new_vis));
                let sum = super::super::math::exp_shifted_sum(past_vis, max)
                    + super::super::math::exp_shifted_sum(new_vis, max);
                // the row is left unnormalised; its output row is divided by `sum` instead
                // (hd values rather than P + N)
                inv_sum[(bb * g + gg) * ni + ii] = 1.0 / sum;
            }
        }
    }

    // (M, hd) = probs_past (M, P) · V_past (P, hd) + per row probs_new (G·n, N) · V_new (N, hd)
    let mut ot = vec![0f32; m * hd];
    if p > 0 {
        let vp = &pvd[past_off..][..p * hd];
        // SAFETY: sc columns 0..P of M rows, vp P × hd, ot M × hd.
        unsafe {
            product(
                (m, hd, p),
                ot.as_mut_ptr(),
                hd,
                false,
                (sc.as_ptr(), width, 1),
                (vp.as_ptr(), hd, 1),
            )
        };
    }
    for bb in 0..nb {
        let vn = &vd[(((t.b0 + bb) * hkv + t.j) * l) * hd..][..n_new * hd];
        let r0 = bb * per_row;
        // SAFETY: rows r0..r0+per_row of sc (columns p..p+N) and ot; vn is N × hd.
        unsafe {
            product(
                (per_row, hd, n_new),
                ot.as_mut_ptr().add(r0 * hd),
                hd,
                p > 0,
                (sc.as_ptr().add(r0 * width + p), width, 1),
                (vn.as_ptr(), hd, 1),
            )
        };
    }

    for (row, &inv) in ot.chunks_exact_mut(hd).zip(&inv_sum) {
        row.iter_mut().for_each(|x| *x *= inv);
    }
    ot
}
