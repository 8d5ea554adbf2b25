//! Equivalence of the forked scoring path against the plain path, on tiny real-architecture
//! Qwen2.5 and Qwen3 models (CPU f32):
//! score == forward_full per row; parallel rows == one row at a time; the source state is left
//! bit-identical; a row's logits do not depend on its siblings, on right padding, or on being
//! left-padded into a slot beside a longer prefix; chunked prefill == one-shot prefill.

mod common;

use common::{candidates, ids, models};
use forkscore_backends::candle::LayerState;
use forkscore_backends::{Backend, CandleState, PrefixState, ScoreRow};
use forkscore_testkit::tolerance::Tolerance;
use proptest::prelude::*;

/// CPU f32 logits along different code paths (forked vs full forward, batched vs one row,
/// padded vs unpadded, merged slots vs alone, chunked vs one-shot prefill). Only summation order
/// differs, but the tiny models' logits reach |50|, where one f32 ulp is 3.8e-6: the strict 1e-5
/// preset is ~2.6 ulps there and matmul kernels that change with the row count (gemm edge tiles)
/// measure up to ~1.3e-5.
const LOGITS: Tolerance = Tolerance::CPU_F32_LOGITS;
const FORK_VS_FULL: Tolerance = LOGITS;
/// Batched, padded and slot-merged rows vs each row alone, over random mixes.
const BATCH_VS_SINGLE: Tolerance = Tolerance::CPU_F32_BATCHED_LOGITS;
/// Chunked prefill vs one-shot on the retained K/V (magnitudes ~1-10): the strict preset.
const CHUNKED_STATE: Tolerance = Tolerance::CPU_F32_STRICT;
const CHUNKED_VS_ONESHOT: Tolerance = LOGITS;

/// Vocabulary range for random ids (real token ids, specials excluded).
const VOCAB: usize = 151_643;

fn snapshot(state: &CandleState) -> Vec<Vec<f32>> {
    state
        .layers()
        .iter()
        .flat_map(|l| match l {
            LayerState::Attention { k, v } => vec![k.clone(), v.clone()],
            LayerState::Linear { conv, recurrent } => vec![conv.clone(), recurrent.clone()],
        })
        .map(|t| {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("state to host")
        })
        .collect()
}

fn concat(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().chain(b).copied().collect()
}

#[test]
fn logits_are_spread_and_finite() {
    let cands: Vec<u32> = (0..4000u32).map(|i| i * 37).collect();
    for (name, m) in models() {
        let logits = m.forward_full(&ids(1, 24, VOCAB), &cands).expect("forward");
        let max = logits.iter().fold(0f32, |a, x| a.max(x.abs()));
        assert!(logits.iter().all(|x| x.is_finite()), "{name}");
        assert!(
            max > 20.0 && max < 200.0,
            "{name}: max |logit| {max} out of the intended spread"
        );
    }
}

#[test]
fn score_equals_forward_full_per_row() {
    let cands = candidates();
    for (name, m) in models() {
        let prefix = ids(2, 37, VOCAB);
        let state = m.prefill(&prefix).expect("prefill");
        let suffixes: Vec<Vec<u32>> = (0..5)
            .map(|i| ids(10 + i, 1 + i as usize * 2, VOCAB))
            .collect();
        let rows: Vec<ScoreRow> = suffixes
            .iter()
            .map(|s| ScoreRow {
                state: 0,
                suffix: s,
            })
            .collect();
        let got = m.score_rows(&[&state], &rows, &cands).expect("score");
        let mut worst = 0f32;
        for (r, s) in suffixes.iter().enumerate() {
            let full = m.forward_full(&concat(&prefix, s), &cands).expect("full");
            worst = worst.max(Tolerance::max_abs_diff(got.row(r), &full));
            FORK_VS_FULL.assert_close(&format!("{name} row {r}"), got.row(r), &full);
        }
        eprintln!("{name}: score vs forward_full max |diff| = {worst:e}");
    }
}

#[test]
fn scoring_leaves_the_state_bit_identical() {
    for (name, m) in models() {
        let state = m.prefill(&ids(3, 20, VOCAB)).expect("prefill");
        let before = snapshot(&state);
        let (len, nbytes) = (state.len(), state.nbytes());
        let s1 = ids(4, 5, VOCAB);
        let s2 = ids(5, 9, VOCAB);
        let rows = [
            ScoreRow {
                state: 0,
                suffix: &s1,
            },
            ScoreRow {
                state: 0,
                suffix: &s2,
            },
        ];
        let first = m
            .score_rows(&[&state], &rows, &candidates())
            .expect("score");
        assert_eq!(snapshot(&state), before, "{name}: state changed");
        assert_eq!((state.len(), state.nbytes()), (len, nbytes));
        // scoring again from the same state gives the same answer bit for bit
        let again = m
            .score_rows(&[&state], &rows, &candidates())
            .expect("score");
        assert_eq!(first, again, "{name}");
    }
}

#[test]
fn state_reports_length_and_bytes() {
    for (_, m) in models() {
        let state = m.prefill(&ids(6, 11, VOCAB)).expect("prefill");
        assert_eq!(state.len(), 11);
        let f = m.facts();
        // per layer: K and V of (1, Hkv, 11, hd) f32
        let per_layer = state.nbytes() / f.num_layers;
        assert_eq!(per_layer * f.num_layers, state.nbytes());
        assert!(per_layer > 0 && per_layer % (2 * 11 * 4) == 0);
    }
}

#[test]
fn slot_merged_rows_equal_each_state_alone_and_forward_full() {
    let cands = candidates();
    for (name, m) in models() {
        let prefixes = [ids(7, 5, VOCAB), ids(8, 31, VOCAB), ids(9, 12, VOCAB)];
        let states: Vec<CandleState> = prefixes
            .iter()
            .map(|p| m.prefill(p).expect("prefill"))
            .collect();
        let refs: Vec<&CandleState> = states.iter().collect();
        let suffixes: Vec<Vec<u32>> = (0..7)
            .map(|i| ids(20 + i, 1 + (i as usize * 3) % 6, VOCAB))
            .collect();
        let owner = [2usize, 0, 1, 0, 2, 1, 1];
        let rows: Vec<ScoreRow> = suffixes
            .iter()
            .zip(owner)
            .map(|(s, st)| ScoreRow {
                state: st,
                suffix: s,
            })
            .collect();
        let merged = m.score_rows(&refs, &rows, &cands).expect("merged");
        let mut worst = 0f32;
        for (r, row) in rows.iter().enumerate() {
            let alone = m
                .score_rows(&[refs[row.state]], &[ScoreRow { state: 0, ..*row }], &cands)
                .expect("alone");
            worst = worst.max(Tolerance::max_abs_diff(merged.row(r), alone.row(0)));
            BATCH_VS_SINGLE.assert_close(
                &format!("{name} row {r} merged vs alone"),
                merged.row(r),
                alone.row(0),
            );
            let full = m
                .forward_full(&concat(&prefixes[row.state], row.suffix), &cands)
                .expect("full");
            FORK_VS_FULL.assert_close(
                &format!("{name} row {r} merged vs full"),
                merged.row(r),
                &full,
            );
        }
        eprintln!("{name}: slot-merged vs alone max |diff| = {worst:e}");
        // states named but unused by any row are fine; the shortest-prefix row is unaffected
        let unused = m.score_rows(&refs, &rows[1..2], &cands).expect("subset");
        BATCH_VS_SINGLE.assert_close(&format!("{name} subset"), unused.row(0), merged.row(1));
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    let cands = candidates();
    for (name, m) in models() {
        let prefix = ids(30, 29, VOCAB);
        let one = m.prefill_chunked(&prefix, prefix.len()).expect("one-shot");
        let one_snap = snapshot(&one);
        let suffix = ids(31, 4, VOCAB);
        let rows = [ScoreRow {
            state: 0,
            suffix: &suffix,
        }];
        let one_scores = m.score_rows(&[&one], &rows, &cands).expect("score");
        let (mut worst, mut worst_scores) = (0f32, 0f32);
        for chunk in [1, 2, 5, 8, 28] {
            let st = m.prefill_chunked(&prefix, chunk).expect("chunked");
            assert_eq!(st.len(), prefix.len());
            for (a, b) in snapshot(&st).iter().zip(&one_snap) {
                worst = worst.max(Tolerance::max_abs_diff(a, b));
                CHUNKED_STATE.assert_close(&format!("{name} chunk {chunk} state"), a, b);
            }
            let s = m.score_rows(&[&st], &rows, &cands).expect("score");
            worst_scores = worst_scores.max(Tolerance::max_abs_diff(s.row(0), one_scores.row(0)));
            CHUNKED_VS_ONESHOT.assert_close(
                &format!("{name} chunk {chunk} scores"),
                s.row(0),
                one_scores.row(0),
            );
        }
        eprintln!(
            "{name}: chunked vs one-shot max |diff| state {worst:e}, scores {worst_scores:e}"
        );
    }
}

#[test]
fn invalid_requests_are_typed_errors() {
    use forkscore_backends::BackendError;
    let (_, m) = &models()[0];
    let state = m.prefill(&ids(40, 4, VOCAB)).expect("prefill");
    let suffix = [1u32];
    let too_big = [151_936u32];
    let row = ScoreRow {
        state: 0,
        suffix: &suffix,
    };
    let bad_id = m.score_rows(
        &[&state],
        &[ScoreRow {
            state: 0,
            suffix: &too_big,
        }],
        &[1],
    );
    assert!(matches!(
        bad_id,
        Err(BackendError::TokenOutOfRange {
            id: 151_936,
            vocab_size: 151_936
        })
    ));
    assert!(matches!(
        m.score_rows(&[&state], &[row], &too_big),
        Err(BackendError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        m.prefill(&too_big),
        Err(BackendError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        m.forward_full(&too_big, &[1]),
        Err(BackendError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        m.score_rows(
            &[&state],
            &[ScoreRow {
                state: 1,
                suffix: &suffix
            }],
            &[1]
        ),
        Err(BackendError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.score_rows(
            &[&state],
            &[ScoreRow {
                state: 0,
                suffix: &[]
            }],
            &[1]
        ),
        Err(BackendError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.score_rows(&[&state], &[], &[1]),
        Err(BackendError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.score_rows(&[&state], &[row], &[]),
        Err(BackendError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.prefill(&[]),
        Err(BackendError::InvalidRequest { .. })
    ));
}

fn suffix_strategy() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..VOCAB as u32, 1..7)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Batched == one row at a time (so a row's logits ignore its siblings and the right padding
    /// their lengths force), for any suffix mix, on both architectures.
    #[test]
    fn parallel_rows_equal_serial_rows(
        prefix in prop::collection::vec(0u32..VOCAB as u32, 1..40),
        suffixes in prop::collection::vec(suffix_strategy(), 1..6),
    ) {
        let cands = candidates();
        for (name, m) in models() {
            let state = m.prefill(&prefix).expect("prefill");
            let rows: Vec<ScoreRow> = suffixes.iter().map(|s| ScoreRow { state: 0, suffix: s }).collect();
            let batch = m.score_rows(&[&state], &rows, &cands).expect("batch");
            for (r, row) in rows.iter().enumerate() {
                let one = m.score_rows(&[&state], &[*row], &cands).expect("one");
                let d = Tolerance::max_abs_diff(batch.row(r), one.row(0));
                prop_assert!(d <= BATCH_VS_SINGLE.abs, "{} row {}: {:e}", name, r, d);
            }
        }
    }

    /// A row keeps its logits when a longer sibling forces more right padding, and when it is
    /// left-padded into a slot beside a longer prefix.
    #[test]
    fn padding_does_not_change_a_row(
        short_prefix in prop::collection::vec(0u32..VOCAB as u32, 1..10),
        long_extra in prop::collection::vec(0u32..VOCAB as u32, 1..30),
        suffix in suffix_strategy(),
        long_suffix in prop::collection::vec(0u32..VOCAB as u32, 7..16),
    ) {
        let cands = candidates();
        let long_prefix = concat(&short_prefix, &long_extra);
        for (name, m) in models() {
            let short = m.prefill(&short_prefix).expect("prefill");
            let long = m.prefill(&long_prefix).expect("prefill");
            let row = ScoreRow { state: 0, suffix: &suffix };
            let alone = m.score_rows(&[&short], &[row], &cands).expect("alone");
            let right_padded = m.score_rows(&[&short], &[ScoreRow { state: 0, suffix: &long_suffix }, row], &cands).expect("rp");
            let left_padded = m.score_rows(&[&long, &short], &[ScoreRow { state: 0, suffix: &long_suffix }, ScoreRow { state: 1, suffix: &suffix }], &cands).expect("lp");
            let d1 = Tolerance::max_abs_diff(right_padded.row(1), alone.row(0));
            let d2 = Tolerance::max_abs_diff(left_padded.row(1), alone.row(0));
            prop_assert!(d1 <= BATCH_VS_SINGLE.abs, "{} right padding: {:e}", name, d1);
            prop_assert!(d2 <= BATCH_VS_SINGLE.abs, "{} left padding: {:e}", name, d2);
        }
    }

    /// Rows from several states in any mix (uneven rows per slot, unused states) equal each row
    /// scored alone against its own state.
    #[test]
    fn slot_merging_equals_each_row_alone(
        prefixes in prop::collection::vec(prop::collection::vec(0u32..VOCAB as u32, 1..30), 1..4),
        rows in prop::collection::vec((0usize..4, suffix_strategy()), 1..8),
    ) {
        let cands = candidates();
        for (name, m) in models() {
            let states: Vec<CandleState> = prefixes.iter().map(|p| m.prefill(p).expect("prefill")).collect();
            let refs: Vec<&CandleState> = states.iter().collect();
            let rows: Vec<ScoreRow> = rows.iter().map(|(s, suf)| ScoreRow { state: s % refs.len(), suffix: suf }).collect();
            let merged = m.score_rows(&refs, &rows, &cands).expect("merged");
            for (r, row) in rows.iter().enumerate() {
                let alone = m.score_rows(&[refs[row.state]], &[ScoreRow { state: 0, ..*row }], &cands).expect("alone");
                let d = Tolerance::max_abs_diff(merged.row(r), alone.row(0));
                prop_assert!(d <= BATCH_VS_SINGLE.abs, "{} row {}: {:e}", name, r, d);
            }
        }
    }
}
