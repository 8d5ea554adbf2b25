//! Packed prefill (several prefixes back to back in one row, no padding) on every
//! architecture: a prefix's retained state is bit-identical whatever it is packed with (batch
//! invariance), equal to the plain one-prefix-at-a-time prefill within f32 rounding, and the
//! scores from it agree; the `prefill_batch` policy packs short prefixes, runs long ones alone
//! through the chunked path, and keeps one bad prefix from failing the others.

mod common;

use common::{candidates, ids, load, models, rows_over_states, state_values};
use forkscore_backends::{
    Backend, CandleBackend, CandleState, LoadOptions, PrefixState, ResolvedCheckpoint, ScoreRow,
};
use forkscore_testkit::tiny_model::TinySpec;
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use proptest::prelude::*;
use std::sync::OnceLock;

/// Packed vs the plain prefill: the same arithmetic per prefix; only the GEMMs' row counts
/// differ, which may reorder a product's sums on some kernels.
const PACKED_VS_PLAIN: Tolerance = Tolerance::CPU_F32_LOGITS;

const VOCAB: usize = 151_643;

fn flat(state: &CandleState) -> Vec<u32> {
    state_values(state).into_iter().map(f32::to_bits).collect()
}

fn floats(state: &CandleState) -> Vec<f32> {
    flat(state).into_iter().map(f32::from_bits).collect()
}

fn qwen35(chunk: usize) -> CandleBackend {
    let dir = TinyQwen35::new(8, Qwen35Layout::TextOnly)
        .ensure()
        .expect("tiny qwen3.5");
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-test").expect("resolve");
    let options = LoadOptions {
        prefill_chunk: chunk,
        ..LoadOptions::default()
    };
    CandleBackend::load(&ckpt, &options).expect("load")
}

/// A wider Qwen2.5 than the default tiny one, so the GEMMs run several tiles per row block.
fn wide_qwen25() -> CandleBackend {
    load(&TinySpec {
        hidden: 64,
        heads: 8,
        kv_heads: 2,
        head_dim: 8,
        intermediate: 256,
        seed: 64,
        ..TinySpec::qwen25()
    })
}

/// Every architecture under test, on CPU f32 with the default prefill chunk.
fn all() -> &'static [(&'static str, CandleBackend)] {
    static ALL: OnceLock<Vec<(&'static str, CandleBackend)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let dense = models()
            .iter()
            .map(|(n, _)| *n)
            .zip(models().iter().map(|(n, _)| match *n {
                "qwen2.5" => load(&TinySpec::qwen25()),
                _ => load(&TinySpec::qwen3()),
            }));
        let mut v: Vec<(&'static str, CandleBackend)> = dense.collect();
        v.push(("qwen2.5-wide", wide_qwen25()));
        v.push(("qwen3.5", qwen35(LoadOptions::default().prefill_chunk)));
        v
    })
}

fn prefixes(seed: u64, lens: &[usize]) -> Vec<Vec<u32>> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| ids(seed + i as u64, n, VOCAB))
        .collect()
}

fn solo(backend: &CandleBackend, p: &[u32]) -> CandleState {
    let mut s = backend.prefill_packed(&[p]).expect("packed alone");
    assert_eq!(s.len(), 1);
    s.pop().expect("one state")
}

#[test]
fn a_packed_prefix_is_bit_identical_whatever_it_is_packed_with() {
    for (name, backend) in all() {
        let ps = prefixes(300, &[37, 5, 20, 1, 37, 64]);
        let refs: Vec<&[u32]> = ps.iter().map(Vec::as_slice).collect();
        let together = backend.prefill_packed(&refs).expect("packed");
        // another packing: reversed, and only every other prefix
        let reversed: Vec<&[u32]> = refs.iter().rev().copied().collect();
        let back = backend.prefill_packed(&reversed).expect("packed reversed");
        let some: Vec<&[u32]> = refs.iter().step_by(2).copied().collect();
        let part = backend.prefill_packed(&some).expect("packed subset");
        for (i, p) in refs.iter().enumerate() {
            let alone = solo(backend, p);
            assert_eq!(together[i].len(), p.len(), "{name} prefix {i} length");
            assert_eq!(
                flat(&together[i]),
                flat(&alone),
                "{name} prefix {i}: packed vs alone"
            );
            assert_eq!(
                flat(&back[refs.len() - 1 - i]),
                flat(&alone),
                "{name} prefix {i}: reversed packing"
            );
            if i % 2 == 0 {
                assert_eq!(
                    flat(&part[i / 2]),
                    flat(&alone),
                    "{name} prefix {i}: subset"
                );
            }
        }
    }
}

#[test]
fn packed_prefill_equals_the_plain_prefill_and_scores_alike() {
    let cands = candidates();
    let suffix = ids(7, 3, VOCAB);
    for (name, backend) in all() {
        let ps = prefixes(500, &[33, 2, 18, 1]);
        let refs: Vec<&[u32]> = ps.iter().map(Vec::as_slice).collect();
        let packed = backend.prefill_packed(&refs).expect("packed");
        for (i, (p, s)) in refs.iter().zip(&packed).enumerate() {
            let plain = backend.prefill(p).expect("prefill");
            assert_eq!(s.len(), plain.len(), "{name} prefix {i} length");
            assert_eq!(s.nbytes(), plain.nbytes(), "{name} prefix {i} bytes");
            PACKED_VS_PLAIN.assert_close(
                &format!("{name} prefix {i} state"),
                &floats(s),
                &floats(&plain),
            );
            let row = [ScoreRow {
                state: 0,
                suffix: &suffix,
            }];
            let lp = backend
                .score_rows(&[s], &row, &cands)
                .expect("score packed");
            let lq = backend
                .score_rows(&[&plain], &row, &cands)
                .expect("score plain");
            PACKED_VS_PLAIN.assert_close(
                &format!("{name} prefix {i} logits"),
                lp.row(0),
                lq.row(0),
            );
        }
    }
}

#[test]
fn the_batch_policy_packs_short_prefixes_and_runs_long_ones_alone() {
    // a chunk of 16 tokens: prefixes of at most 16 are packed, longer ones chunked alone
    let dense = {
        let dir = forkscore_testkit::tiny_model::ensure_tiny_model(&TinySpec::qwen25());
        let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-test").expect("resolve");
        let options = LoadOptions {
            prefill_chunk: 16,
            ..LoadOptions::default()
        };
        CandleBackend::load(&ckpt, &options).expect("load")
    };
    for (name, backend) in [("qwen2.5", dense), ("qwen3.5", qwen35(16))] {
        let ps = prefixes(700, &[9, 40, 16, 3, 17, 7, 12]);
        let refs: Vec<&[u32]> = ps.iter().map(Vec::as_slice).collect();
        let states = backend.prefill_batch(&refs);
        assert_eq!(states.len(), refs.len());
        for (i, (p, s)) in refs.iter().zip(states).enumerate() {
            let s = s.expect("prefill_batch");
            let expected = if p.len() > 16 {
                backend.prefill(p).expect("chunked")
            } else {
                solo(&backend, p)
            };
            assert_eq!(
                flat(&s),
                flat(&expected),
                "{name} prefix {i} ({} tokens)",
                p.len()
            );
        }
    }
}

#[test]
fn packed_prefill_refuses_empty_prefixes_and_bad_ids_and_the_policy_isolates_them() {
    let (_, backend) = &all()[0];
    let a = ids(1, 4, VOCAB);
    assert!(backend.prefill_packed(&[]).is_err());
    assert!(backend.prefill_packed(&[&a, &[]]).is_err());
    let bad = [u32::MAX];
    assert!(backend.prefill_packed(&[&a, &bad]).is_err());
    let results = backend.prefill_batch(&[&a, &[], &a, &bad, &a]);
    assert!(results[1].is_err() && results[3].is_err());
    for i in [0, 2, 4] {
        let s = results[i].as_ref().expect("good prefix prefilled");
        assert_eq!(flat(s), flat(&solo(backend, &a)), "prefix {i}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random sets of prefixes packed in random groupings: each equals its solo packed run.
    #[test]
    fn random_packings_are_batch_invariant(
        lens in proptest::collection::vec(1usize..30, 1..6),
        seed in 0u64..1000,
        model in 0usize..4,
    ) {
        let (name, backend) = &all()[model];
        let ps = prefixes(seed, &lens);
        let refs: Vec<&[u32]> = ps.iter().map(Vec::as_slice).collect();
        let packed = backend.prefill_packed(&refs).expect("packed");
        for (i, p) in refs.iter().enumerate() {
            prop_assert_eq!(flat(&packed[i]), flat(&solo(backend, p)), "{} prefix {}", name, i);
        }
    }
}

/// The scoring pass over several retained states (slots) gives each row exactly the logits of a
/// call scoring its own state's rows alone: each slot is attended on its own, and the row-wise
/// products give a row the same result at any row count.
fn merged_scoring_is_invariant(model: usize, rows_per_state: usize, lens: &[usize], seed: u64) {
    let (name, backend) = &all()[model];
    let ps = prefixes(seed, lens);
    let refs: Vec<&[u32]> = ps.iter().map(Vec::as_slice).collect();
    let states: Vec<CandleState> = backend
        .prefill_batch(&refs)
        .into_iter()
        .map(|s| s.expect("prefill"))
        .collect();
    let state_refs: Vec<&CandleState> = states.iter().collect();
    // the same suffixes for every state (one schema), of lengths 1..=3
    let suffixes: Vec<Vec<u32>> = (0..rows_per_state)
        .map(|r| ids(seed ^ (r as u64 + 91), 1 + r % 5, VOCAB))
        .collect();
    // a candidate union as wide as a 28-field schema's
    let mut cands = candidates();
    cands.extend(ids(seed + 5, 90, VOCAB));
    cands.sort_unstable();
    cands.dedup();
    let rows = rows_over_states(states.len(), &suffixes);
    let merged = backend
        .score_rows(&state_refs, &rows, &cands)
        .expect("merged");
    for (s, state) in states.iter().enumerate() {
        let own: Vec<ScoreRow<'_>> = suffixes
            .iter()
            .map(|x| ScoreRow {
                state: 0,
                suffix: x,
            })
            .collect();
        let alone = backend.score_rows(&[state], &own, &cands).expect("alone");
        for r in 0..rows_per_state {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(merged.row(s * rows_per_state + r)),
                bits(alone.row(r)),
                "{name}: state {s} row {r} of {rows_per_state}, prefixes {lens:?}"
            );
        }
    }
}

#[test]
fn merged_scoring_equals_each_state_alone_bit_for_bit() {
    for model in 0..all().len() {
        for rows in [1, 3, 8, 28] {
            merged_scoring_is_invariant(model, rows, &[30, 7, 19], 40 + rows as u64);
        }
        // prefixes longer than the prefill chunk (chunked alone) beside a short one
        for rows in [8, 28] {
            merged_scoring_is_invariant(model, rows, &[900, 40, 700], 80 + rows as u64);
        }
    }
}
