//! Several suffixes continuing one retained state (a prompt head shared by many contexts) on
//! every architecture: the padded pass (`extend_padded`, the GPU form) equals extending each
//! suffix alone within f32 rounding and scores alike; `extend_batch` on the CPU is each suffix
//! alone, bit for bit; extending equals prefilling the whole prompt within f32 rounding; bad
//! suffixes are refused and never fail the others.

mod common;

use common::{candidates, ids, load, models, state_values};
use forkscore_backends::{
    Backend, CandleBackend, CandleState, LoadOptions, PrefixState, ResolvedCheckpoint, ScoreRow,
};
use forkscore_testkit::tiny_model::TinySpec;
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use std::sync::OnceLock;

/// Padded rows vs one suffix at a time, and a continued head vs the whole prefill: the same
/// arithmetic per token; the GEMMs' row counts and the chunks' boundaries differ, which may
/// reorder sums.
const SHARED_VS_ALONE: Tolerance = Tolerance::CPU_F32_LOGITS;

const VOCAB: usize = 151_643;

fn bits(state: &CandleState) -> Vec<u32> {
    state_values(state).into_iter().map(f32::to_bits).collect()
}

/// Every architecture under test, on CPU f32; the Qwen3.5 one with a 16-token prefill chunk
/// so that long suffixes run the chunked delta rule over several chunks.
fn all() -> &'static [(&'static str, CandleBackend)] {
    static ALL: OnceLock<Vec<(&'static str, CandleBackend)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut v: Vec<(&'static str, CandleBackend)> = models()
            .iter()
            .map(|(n, _)| match *n {
                "qwen2.5" => (*n, load(&TinySpec::qwen25())),
                _ => (*n, load(&TinySpec::qwen3())),
            })
            .collect();
        let dir = TinyQwen35::new(8, Qwen35Layout::TextOnly)
            .ensure()
            .expect("tiny qwen3.5");
        let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-test").expect("resolve");
        let options = LoadOptions {
            prefill_chunk: 16,
            ..LoadOptions::default()
        };
        v.push((
            "qwen3.5",
            CandleBackend::load(&ckpt, &options).expect("load"),
        ));
        v
    })
}

fn suffixes(seed: u64, lens: &[usize]) -> Vec<Vec<u32>> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| ids(seed + i as u64, n, VOCAB))
        .collect()
}

fn score(backend: &CandleBackend, state: &CandleState, suffix: &[u32]) -> Vec<f32> {
    let row = [ScoreRow { state: 0, suffix }];
    backend
        .score_rows(&[state], &row, &candidates())
        .expect("score")
        .row(0)
        .to_vec()
}

#[test]
fn padded_suffixes_over_one_past_equal_each_suffix_alone_and_score_alike() {
    let probe = ids(9, 3, VOCAB);
    for (name, backend) in all() {
        let head = backend.prefill(&ids(40, 29, VOCAB)).expect("head");
        let ss = suffixes(700, &[33, 2, 18, 1, 40]);
        let refs: Vec<&[u32]> = ss.iter().map(Vec::as_slice).collect();
        let padded = backend.extend_padded(&head, &refs).expect("padded");
        assert_eq!(padded.len(), refs.len(), "{name}: one state per suffix");
        for (i, (s, p)) in refs.iter().zip(&padded).enumerate() {
            let alone = backend.extend(&head, s).expect("extend");
            assert_eq!(p.len(), head.len() + s.len(), "{name} suffix {i} length");
            assert_eq!(p.nbytes(), alone.nbytes(), "{name} suffix {i} bytes");
            SHARED_VS_ALONE.assert_close(
                &format!("{name} suffix {i} state"),
                &state_values(p),
                &state_values(&alone),
            );
            SHARED_VS_ALONE.assert_close(
                &format!("{name} suffix {i} logits"),
                &score(backend, p, &probe),
                &score(backend, &alone, &probe),
            );
        }
        // the head is read, never written
        let again = backend.prefill(&ids(40, 29, VOCAB)).expect("head again");
        assert_eq!(bits(&head), bits(&again), "{name}: head untouched");
    }
}

#[test]
fn extend_many_on_the_cpu_is_each_suffix_alone_bit_for_bit() {
    for (name, backend) in all() {
        let head = backend.prefill(&ids(41, 20, VOCAB)).expect("head");
        let ss = suffixes(800, &[5, 37, 1, 12]);
        let refs: Vec<&[u32]> = ss.iter().map(Vec::as_slice).collect();
        let many = backend.extend_many(&head, &refs);
        // in another company: reversed
        let rev: Vec<&[u32]> = refs.iter().rev().copied().collect();
        let back = backend.extend_many(&head, &rev);
        for (i, s) in refs.iter().enumerate() {
            let alone = backend.extend(&head, s).expect("extend");
            let got = many[i].as_ref().expect("extend_many");
            assert_eq!(bits(got), bits(&alone), "{name} suffix {i}");
            let got = back[refs.len() - 1 - i].as_ref().expect("reversed");
            assert_eq!(bits(got), bits(&alone), "{name} suffix {i} reversed");
        }
    }
}

#[test]
fn continuing_a_head_equals_prefilling_the_whole_prompt() {
    let probe = ids(10, 2, VOCAB);
    for (name, backend) in all() {
        let head_ids = ids(42, 23, VOCAB);
        let head = backend.prefill(&head_ids).expect("head");
        for (i, s) in suffixes(900, &[1, 17, 45]).iter().enumerate() {
            let continued = backend.extend_many(&head, &[s]).pop().expect("one");
            let continued = continued.expect("continued");
            let whole = backend
                .prefill(&[head_ids.as_slice(), s].concat())
                .expect("whole");
            assert_eq!(continued.len(), whole.len(), "{name} prompt {i} length");
            SHARED_VS_ALONE.assert_close(
                &format!("{name} prompt {i} state"),
                &state_values(&continued),
                &state_values(&whole),
            );
            SHARED_VS_ALONE.assert_close(
                &format!("{name} prompt {i} logits"),
                &score(backend, &continued, &probe),
                &score(backend, &whole, &probe),
            );
        }
    }
}

#[test]
fn bad_suffixes_are_refused_and_never_fail_the_others() {
    let (name, backend) = &all()[0];
    let head = backend.prefill(&ids(43, 8, VOCAB)).expect("head");
    let good = ids(44, 6, VOCAB);
    let empty: Vec<u32> = Vec::new();
    let out_of_range = vec![u32::MAX];
    for bad in [&empty, &out_of_range] {
        assert!(
            backend.extend_padded(&head, &[&good, bad]).is_err(),
            "{name}: padded pass with a bad suffix {bad:?}"
        );
        let many = backend.extend_many(&head, &[&good, bad, &good]);
        assert_eq!(many.len(), 3);
        assert!(
            many[0].is_ok() && many[2].is_ok(),
            "{name}: good suffixes kept"
        );
        assert!(many[1].is_err(), "{name}: bad suffix {bad:?} refused");
    }
    assert!(
        backend.extend_padded(&head, &[]).is_err(),
        "{name}: no suffix"
    );
}
