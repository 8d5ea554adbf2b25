//! Exact top-K log-probabilities of one row of f32 logits, with one logsumexp per row and a
//! block-max prefilter, and the plain path it must equal bit for bit.
//!
//! In: one row of logits over the whole vocabulary (finite or −inf; NaN and +inf are refused)
//! and K. Out: a [`VocabRow`]: the row's f32 logsumexp and its K most probable tokens as
//! `(id, log-probability)`, best first.
//!
//! Definitions shared by both paths (so they are bitwise comparable):
//! - `logsumexp`: `m + ln Σ exp(x − m)` with `m` the row maximum, `exp` in f32, the sum
//!   accumulated in f64, the result rounded to f32; a row of only −inf has logsumexp −inf;
//! - the log-probability of a logit `x` is `x − logsumexp` in f32 ([`log_prob`]), −inf for −inf;
//! - the order is log-probability descending, ties broken by ascending token id ([`order`]).
//!
//! The plain path ([`top_k_reference`]) materialises the full log-softmax and sorts all of it.
//! The fast path ([`top_k`]) makes one pass that takes the maximum of every block of
//! [`BLOCK`] logits (and the row maximum from them), one pass for the logsumexp, then visits
//! blocks by descending block maximum and stops at the first block whose maximum cannot enter
//! the current top K; only the visited blocks' logits are converted and compared. Because
//! `x ↦ x − lse` is monotone under round-to-nearest, a block whose maximum's log-probability is
//! strictly below the K-th best cannot hold a member of the top K, so the result is exactly
//! the reference's first K entries (ties included: equal log-probabilities are not skipped).
//! Cost: two streaming passes over the row plus `O(visited · 64 · log K)`; no allocation of
//! the row's size.

use crate::vocab::{TokenLogprob, VocabRow};
use std::cmp::Ordering;

/// Logits per prefilter block.
pub const BLOCK: usize = 64;

pub use crate::error::NonFiniteLogit;

/// The log-probability of logit `x` in a row whose logsumexp is `lse` (−inf stays −inf, also
/// when the whole row is −inf).
#[inline]
pub fn log_prob(x: f32, lse: f32) -> f32 {
    if x == f32::NEG_INFINITY {
        x
    } else {
        x - lse
    }
}

/// Best first: log-probability descending, then token id ascending. Total on NaN-free input.
#[inline]
pub fn order(a: &TokenLogprob, b: &TokenLogprob) -> Ordering {
    b.logprob
        .partial_cmp(&a.logprob)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// The first NaN or +inf logit of `row`, if any.
fn first_non_finite(row: &[f32]) -> Option<NonFiniteLogit> {
    row.iter()
        .position(|x| x.is_nan() || *x == f32::INFINITY)
        .map(|i| NonFiniteLogit {
            id: i as u32,
            value: row[i],
        })
}

/// logsumexp of `row` given its maximum `max` (see the module docs).
fn logsumexp_with_max(row: &[f32], max: f32) -> f32 {
    if max == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let sum: f64 = row.iter().map(|&x| f64::from((x - max).exp())).sum();
    (f64::from(max) + sum.ln()) as f32
}

/// The f32 logsumexp of a row (NaN / +inf refused; an empty row is −inf).
pub fn logsumexp(row: &[f32]) -> Result<f32, NonFiniteLogit> {
    if let Some(bad) = first_non_finite(row) {
        return Err(bad);
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    Ok(logsumexp_with_max(row, max))
}

/// The plain path: the full log-softmax of `row`, fully sorted, cut to `k` entries (all of
/// them when `k` exceeds the row).
pub fn top_k_reference(row: &[f32], k: usize) -> Result<VocabRow, NonFiniteLogit> {
    let lse = logsumexp(row)?;
    top_k_reference_with_lse(row, k, lse)
}

/// The plain path with a given logsumexp (e.g. one an accelerator computed in another
/// summation order): the full log-softmax `x − lse` of `row`, fully sorted, cut to `k`.
pub fn top_k_reference_with_lse(
    row: &[f32],
    k: usize,
    lse: f32,
) -> Result<VocabRow, NonFiniteLogit> {
    if let Some(bad) = first_non_finite(row) {
        return Err(bad);
    }
    let mut all: Vec<TokenLogprob> = row
        .iter()
        .enumerate()
        .map(|(i, &x)| TokenLogprob {
            id: i as u32,
            logprob: log_prob(x, lse),
        })
        .collect();
    all.sort_by(order);
    all.truncate(k);
    Ok(VocabRow {
        logsumexp: lse,
        top: all,
    })
}

/// The fast path: equal, bit for bit, to [`top_k_reference`] (see the module docs).
pub fn top_k(row: &[f32], k: usize) -> Result<VocabRow, NonFiniteLogit> {
    // pass 1: block maxima (and a NaN / +inf flag folded into the same pass)
    let mut block_max: Vec<f32> = Vec::with_capacity(row.len().div_ceil(BLOCK));
    let mut finite = true;
    for block in row.chunks(BLOCK) {
        let mut m = f32::NEG_INFINITY;
        for &x in block {
            finite &= x < f32::INFINITY;
            m = if x > m { x } else { m };
        }
        block_max.push(m);
    }
    if !finite {
        return Err(first_non_finite(row).unwrap_or(NonFiniteLogit {
            id: 0,
            value: f32::NAN,
        }));
    }
    let max = block_max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // pass 2: the one logsumexp of the row
    let lse = logsumexp_with_max(row, max);
    let k = k.min(row.len());
    if k == 0 {
        return Ok(VocabRow {
            logsumexp: lse,
            top: Vec::new(),
        });
    }
    // blocks by descending maximum (ties: lower block first, i.e. lower ids first)
    let mut blocks: Vec<u32> = (0..block_max.len() as u32).collect();
    blocks.sort_unstable_by(|&a, &b| {
        block_max[b as usize]
            .partial_cmp(&block_max[a as usize])
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b))
    });
    // `top` stays sorted best first, at most k long
    let mut top: Vec<TokenLogprob> = Vec::with_capacity(k + 1);
    for &b in &blocks {
        let b = b as usize;
        if top.len() == k && log_prob(block_max[b], lse) < top[k - 1].logprob {
            break;
        }
        let start = b * BLOCK;
        for (j, &x) in row[start..(start + BLOCK).min(row.len())]
            .iter()
            .enumerate()
        {
            let cand = TokenLogprob {
                id: (start + j) as u32,
                logprob: log_prob(x, lse),
            };
            if top.len() == k && order(&cand, &top[k - 1]) != Ordering::Less {
                continue;
            }
            let at = top.partition_point(|t| order(t, &cand) == Ordering::Less);
            top.insert(at, cand);
            top.truncate(k);
        }
    }
    Ok(VocabRow {
        logsumexp: lse,
        top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bitwise view of a row, so −0.0 / +0.0 and NaN payloads would show.
    fn bits(r: &VocabRow) -> (u32, Vec<(u32, u32)>) {
        (
            r.logsumexp.to_bits(),
            r.top.iter().map(|t| (t.id, t.logprob.to_bits())).collect(),
        )
    }

    fn same(row: &[f32], k: usize) {
        let fast = top_k(row, k).unwrap();
        let plain = top_k_reference(row, k).unwrap();
        assert_eq!(bits(&fast), bits(&plain), "k = {k}, vocab = {}", row.len());
    }

    /// Random logits with ties (values from a small pool), −inf, zeros of both signs, and a few
    /// large peaks, over a vocabulary of `n` entries.
    fn row_of(n: usize, seed: u64, pool: u32, neg_inf_per_mille: u32) -> Vec<f32> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        (0..n)
            .map(|_| {
                let r = next();
                match r % 1000 {
                    x if (x as u32) < neg_inf_per_mille => f32::NEG_INFINITY,
                    1 => -0.0,
                    2 => 0.0,
                    3 => 20.0 + (r >> 40) as f32 / 1e6,
                    _ if pool > 0 => ((r >> 32) as u32 % pool) as f32 * 0.25 - 8.0,
                    _ => ((r >> 40) as f32 / (1u64 << 24) as f32) * 24.0 - 12.0,
                }
            })
            .collect()
    }

    #[test]
    fn small_cases_and_edges() {
        same(&[], 0);
        same(&[], 5);
        same(&[1.0], 1);
        same(&[f32::NEG_INFINITY; 130], 3);
        same(&[f32::NEG_INFINITY; 130], 0);
        same(&[0.5; 200], 128);
        same(&[2.0, -1.0, 2.0, f32::NEG_INFINITY, 7.0], 10);
        let r = top_k(&[2.0, -1.0, 2.0, f32::NEG_INFINITY, 7.0], 3).unwrap();
        assert_eq!(
            r.top.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![4, 0, 2]
        );
        let all_neg_inf = top_k(&[f32::NEG_INFINITY; 3], 2).unwrap();
        assert_eq!(all_neg_inf.logsumexp, f32::NEG_INFINITY);
        assert_eq!(all_neg_inf.top[0].logprob, f32::NEG_INFINITY);
    }

    #[test]
    fn nan_and_positive_infinity_are_refused_by_both_paths() {
        for bad in [f32::NAN, f32::INFINITY] {
            let row = [0.0, 1.0, bad, 2.0];
            let want = NonFiniteLogit { id: 2, value: bad };
            for got in [top_k(&row, 2), top_k_reference(&row, 2)] {
                let e = got.unwrap_err();
                assert_eq!(e.id, want.id);
                assert_eq!(e.value.to_bits(), want.value.to_bits());
            }
        }
    }

    #[test]
    fn distinct_logits_that_round_to_one_log_probability_are_ordered_by_id() {
        // One huge logit makes the logsumexp ~10,000, where f32 steps are ~0.001: the distinct
        // logits 0.0002 (id 250) and 0.0001 (id 3) get the same log-probability. The reference
        // then orders them by id (3 first), so the fast path must not order by raw logit.
        let mut row = vec![f32::NEG_INFINITY; 300];
        row[0] = 10_000.0;
        row[250] = 0.0002;
        row[3] = 0.0001;
        let lse = logsumexp(&row).unwrap();
        assert_eq!(log_prob(row[250], lse), log_prob(row[3], lse));
        for k in [1, 2, 3, 5] {
            same(&row, k);
        }
        let ids: Vec<u32> = top_k(&row, 3).unwrap().top.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![0, 3, 250]);
    }

    #[test]
    fn real_vocabulary_sizes_with_k_0_1_128() {
        for (n, seed) in [(151_936, 11), (248_320, 12)] {
            for pool in [0, 7] {
                let row = row_of(n, seed + u64::from(pool), pool, 5);
                for k in [0, 1, 128] {
                    same(&row, k);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Small vocabularies (not multiples of the block), heavy ties and −inf, any K.
        #[test]
        fn fast_equals_full_sort_small(
            n in 0usize..700,
            seed in any::<u64>(),
            pool in 0u32..6,
            neg_inf in 0u32..600,
            k in 0usize..800,
        ) {
            let row = row_of(n, seed, pool, neg_inf);
            prop_assert_eq!(bits(&top_k(&row, k).unwrap()), bits(&top_k_reference(&row, k).unwrap()));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4))]

        /// The real vocabulary sizes, random rows with and without ties, K in {0, 1, 128}.
        #[test]
        fn fast_equals_full_sort_real_vocabularies(
            big in any::<bool>(),
            seed in any::<u64>(),
            pool in prop_oneof![Just(0u32), 1u32..40],
            k in prop_oneof![Just(0usize), Just(1usize), Just(128usize)],
        ) {
            let n = if big { 248_320 } else { 151_936 };
            let row = row_of(n, seed, pool, 3);
            prop_assert_eq!(bits(&top_k(&row, k).unwrap()), bits(&top_k_reference(&row, k).unwrap()));
        }
    }
}
