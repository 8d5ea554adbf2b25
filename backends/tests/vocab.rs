//! Full-vocabulary summaries on the candle backend (CPU f32, tiny Qwen2.5, Qwen3 and the
//! Qwen3.5 hybrid):
//! `vocab_rows` is bit-equal to the full logits followed by a full log-softmax + sort; chunked
//! prefill does not change it beyond f32 rounding; asking for summaries in a score call never
//! changes the candidate logits, and its summaries match the full prompt's last position.

mod common;

use common::{candidates, ids, load};
use forkscore_backends::candle::{LoadOptions, ResolvedCheckpoint};
use forkscore_backends::{Backend, CandleBackend, ScoreRequest, ScoreRow, VocabRequest};
use forkscore_seam::topk::{log_prob, top_k_reference};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use std::path::PathBuf;
use std::sync::OnceLock;

const LOGITS: Tolerance = Tolerance::CPU_F32_LOGITS;
/// Ids below the smallest vocabulary of the three (Qwen2.5/Qwen3's regular tokens).
const VOCAB: usize = 151_643;

/// The tiny Qwen3.5 hybrid's folder (text-only layout, seed 8).
fn qwen35_dir() -> PathBuf {
    TinyQwen35::new(8, Qwen35Layout::TextOnly)
        .ensure()
        .expect("tiny qwen3.5")
}

fn load_dir(dir: &std::path::Path, options: &LoadOptions) -> CandleBackend {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-test").expect("resolve");
    CandleBackend::load(&ckpt, options).expect("load")
}

/// All three architectures on CPU f32: Qwen2.5 (tied head), Qwen3 (untied), Qwen3.5 (hybrid,
/// 248,320-row vocabulary).
fn models() -> &'static [(&'static str, CandleBackend)] {
    static MODELS: OnceLock<Vec<(&'static str, CandleBackend)>> = OnceLock::new();
    MODELS.get_or_init(|| {
        vec![
            ("qwen2.5", load(&TinySpec::qwen25())),
            ("qwen3", load(&TinySpec::qwen3())),
            ("qwen3.5", load_dir(&qwen35_dir(), &LoadOptions::default())),
        ]
    })
}

#[test]
fn all_three_architectures_are_covered() {
    let families: Vec<_> = models().iter().map(|(_, b)| b.facts().family).collect();
    use forkscore_backends::Family;
    assert_eq!(
        families,
        vec![
            Some(Family::Qwen2),
            Some(Family::Qwen3),
            Some(Family::Qwen3_5)
        ]
    );
    assert_eq!(models()[2].1.facts().vocab_size, 248_320);
}

#[test]
fn vocab_rows_equal_full_log_softmax_and_sort_bit_for_bit() {
    for (name, b) in models() {
        let ids = ids(3, 37, VOCAB);
        let full = b.full_logits(&ids).unwrap();
        for k in [0, 1, 128] {
            let rows = b
                .vocab_rows(&VocabRequest::every_next_token(&ids, k).unwrap())
                .unwrap();
            assert_eq!(rows.len(), ids.len() - 1);
            for (p, row) in rows.iter().enumerate() {
                let want = top_k_reference(&full[p], k).unwrap();
                assert_eq!(row.position, p);
                assert_eq!(
                    row.vocab.logsumexp.to_bits(),
                    want.logsumexp.to_bits(),
                    "{name} {p}"
                );
                let bits = |t: &[forkscore_backends::TokenLogprob]| {
                    t.iter()
                        .map(|t| (t.id, t.logprob.to_bits()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(&row.vocab.top), bits(&want.top), "{name} {p} k={k}");
                let next = row.next.expect("every position predicts a next token");
                assert_eq!(next.id, ids[p + 1]);
                assert_eq!(
                    next.logprob.to_bits(),
                    log_prob(full[p][ids[p + 1] as usize], want.logsumexp).to_bits()
                );
            }
        }
    }
}

#[test]
fn chunked_prefill_gives_the_same_summaries() {
    let chunked = LoadOptions {
        prefill_chunk: 7,
        ..LoadOptions::default()
    };
    let pairs = [
        ("qwen2.5", ensure_tiny_model(&TinySpec::qwen25())),
        ("qwen3.5", qwen35_dir()),
    ];
    for (name, dir) in pairs {
        let chunked = load_dir(&dir, &chunked);
        let whole = load_dir(&dir, &LoadOptions::default());
        let ids = ids(5, 30, VOCAB);
        let req = VocabRequest::new(&ids, 4..30, 8).unwrap();
        let (a, b) = (
            chunked.vocab_rows(&req).unwrap(),
            whole.vocab_rows(&req).unwrap(),
        );
        assert_eq!(a.len(), 26, "{name}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.position, y.position);
            LOGITS.assert_close(
                &format!("{name} logsumexp"),
                &[x.vocab.logsumexp],
                &[y.vocab.logsumexp],
            );
            let lp = |r: &forkscore_backends::PositionVocab| -> Vec<f32> {
                r.vocab.top.iter().map(|t| t.logprob).collect()
            };
            LOGITS.assert_close(&format!("{name} top logprobs"), &lp(x), &lp(y));
        }
        assert!(
            a.last().unwrap().next.is_none(),
            "the last token has no next"
        );
    }
}

#[test]
fn summaries_in_a_score_call_leave_the_candidate_logits_alone() {
    for (name, b) in models() {
        let prefix = ids(7, 20, VOCAB);
        let state = b.prefill(&prefix).unwrap();
        let suffixes = [ids(8, 3, VOCAB), ids(9, 5, VOCAB)];
        let rows: Vec<ScoreRow> = suffixes
            .iter()
            .map(|s| ScoreRow {
                state: 0,
                suffix: s,
            })
            .collect();
        let cands = candidates();
        let states = [&state];
        let plain = b
            .score(&ScoreRequest::new(&states, &rows, &cands).unwrap())
            .unwrap();
        let with = b
            .score(
                &ScoreRequest::new(&states, &rows, &cands)
                    .unwrap()
                    .with_vocab(4)
                    .unwrap(),
            )
            .unwrap();
        assert!(plain.vocab.is_none());
        assert_eq!(plain.data, with.data, "{name}: candidate logits changed");
        let vocab = with.vocab.expect("asked for");
        for (r, s) in suffixes.iter().enumerate() {
            let full: Vec<u32> = prefix.iter().chain(s).copied().collect();
            let last = b
                .vocab_rows(&VocabRequest::last_position(&full, 4).unwrap())
                .unwrap();
            LOGITS.assert_close(
                "logsumexp",
                &[vocab[r].logsumexp],
                &[last[0].vocab.logsumexp],
            );
            assert_eq!(
                vocab[r].top.iter().map(|t| t.id).collect::<Vec<_>>(),
                last[0].vocab.top.iter().map(|t| t.id).collect::<Vec<_>>(),
                "{name} row {r}"
            );
        }
    }
}

#[test]
fn bad_requests_are_errors() {
    let (_, b) = &models()[0];
    let ids = ids(1, 4, VOCAB);
    // the Qwen vocabulary is larger than MAX_TOP_K, so the seam's bound is the one hit
    assert!(b.facts().vocab_size > forkscore_backends::MAX_TOP_K);
    assert!(VocabRequest::every_next_token(&ids, forkscore_backends::MAX_TOP_K + 1).is_err());
    assert!(VocabRequest::every_next_token(&ids[..1], 1).is_err());
    let outside = [1u32, b.facts().vocab_size as u32];
    let e = b
        .vocab_rows(&VocabRequest::every_next_token(&outside, 1).unwrap())
        .unwrap_err();
    assert!(
        e.to_string().contains("outside the model's embedding"),
        "{e}"
    );
}
