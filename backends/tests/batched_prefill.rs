//! Batched prefill (several prefixes right-padded into one forward pass) == one prefill per
//! prefix, on every architecture: the retained states agree, and scoring from them gives the
//! same logits. The padded pass is kept as an alternative to the packed pass that `prefill_batch`
//! runs (see `packed_prefill.rs`).

mod common;

use common::{candidates, ids, models, state_values};
use forkscore_backends::{
    Backend, CandleBackend, CandleState, LoadOptions, PrefixState, ResolvedCheckpoint, ScoreRow,
};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;

/// Batched vs single prefill on the retained states and the logits scored from them: only
/// summation order differs (GEMMs over more rows), as between batched and single-row scoring.
const BATCH_VS_SINGLE: Tolerance = Tolerance::CPU_F32_LOGITS;

const VOCAB: usize = 151_643;

fn flat(state: &CandleState) -> Vec<f32> {
    state_values(state)
}

fn qwen35() -> CandleBackend {
    let dir = TinyQwen35::new(8, Qwen35Layout::TextOnly)
        .ensure()
        .expect("tiny qwen3.5");
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-test").expect("resolve");
    CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load")
}

fn check(name: &str, backend: &CandleBackend) {
    let lens = [37usize, 5, 20, 1, 37];
    let prefixes: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| ids(100 + i as u64, n, VOCAB))
        .collect();
    let refs: Vec<&[u32]> = prefixes.iter().map(Vec::as_slice).collect();
    let batched = backend.prefill_padded(&refs).expect("batched prefill");
    let single: Vec<CandleState> = refs
        .iter()
        .map(|p| backend.prefill(p).expect("prefill"))
        .collect();
    let cands = candidates();
    let suffix = ids(7, 3, VOCAB);
    for (i, (b, s)) in batched.iter().zip(&single).enumerate() {
        assert_eq!(b.len(), s.len(), "{name} prefix {i} length");
        assert_eq!(b.nbytes(), s.nbytes(), "{name} prefix {i} bytes");
        BATCH_VS_SINGLE.assert_close(&format!("{name} prefix {i} state"), &flat(b), &flat(s));
        let row = [ScoreRow {
            state: 0,
            suffix: &suffix,
        }];
        let lb = backend
            .score_rows(&[b], &row, &cands)
            .expect("score batched");
        let ls = backend
            .score_rows(&[s], &row, &cands)
            .expect("score single");
        BATCH_VS_SINGLE.assert_close(&format!("{name} prefix {i} logits"), lb.row(0), ls.row(0));
    }
    // The policy packs these short prefixes into one pass: equal to the plain prefill within
    // f32 rounding, input order kept.
    let policy = backend.prefill_batch(&refs);
    for (i, (p, s)) in policy.into_iter().zip(&single).enumerate() {
        let p = p.expect("prefill_batch");
        BATCH_VS_SINGLE.assert_close(
            &format!("{name} prefill_batch prefix {i}"),
            &flat(&p),
            &flat(s),
        );
    }
}

#[test]
fn batched_prefill_equals_one_prefill_per_prefix() {
    for (name, backend) in models() {
        check(name, backend);
    }
    check("qwen3.5", &qwen35());
}

#[test]
fn batched_prefill_refuses_an_empty_prefix_and_bad_ids() {
    let (_, backend) = &models()[0];
    let a = ids(1, 4, VOCAB);
    assert!(backend.prefill_padded(&[&a, &[]]).is_err());
    let bad = [u32::MAX];
    assert!(backend.prefill_padded(&[&a, &bad]).is_err());
    // The per-prefix policy reports each prefix's own error and still prefills the others.
    let results = backend.prefill_batch(&[&a, &[], &a]);
    assert!(results[0].is_ok() && results[1].is_err() && results[2].is_ok());
}
