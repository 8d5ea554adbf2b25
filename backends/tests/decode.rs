//! Greedy decoding with the cache (`Backend::decode_step`, one forward per token over the
//! retained state) equals greedy decoding by re-running `forward_full` over the whole growing
//! sequence (every vocabulary id a candidate, argmax with the lowest id on ties), on the tiny
//! Qwen2.5, Qwen3 and Qwen3.5 (hybrid) models, CPU f32. The step's state equals `extend`'s.

mod common;

use common::{ids, load};
use forkscore_backends::candle::{LoadOptions, ResolvedCheckpoint};
use forkscore_backends::{Backend, CandleBackend, PrefixState, ScoreRow};
use forkscore_testkit::tiny_model::TinySpec;
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;

const STEPS: usize = 6;

fn qwen35() -> CandleBackend {
    let dir = TinyQwen35::new(8, Qwen35Layout::TextOnly)
        .ensure()
        .expect("tiny qwen3.5");
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-test").expect("resolve");
    CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load")
}

/// Argmax, lowest index on ties.
fn argmax(row: &[f32]) -> (u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &x) in row.iter().enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    (best.0 as u32, best.1)
}

fn check(name: &str, backend: &CandleBackend, prompt: &[u32]) {
    let vocab: Vec<u32> = (0..backend.facts().vocab_size as u32).collect();
    // with the cache: prefill all but the last prompt token, then one step per token
    let n = prompt.len();
    let state = backend.prefill(&prompt[..n - 1]).unwrap();
    let mut step = backend.decode_step(&state, prompt[n - 1]).unwrap();
    let mut cached = Vec::new();
    for i in 0..STEPS {
        cached.push(step.next);
        assert_eq!(step.state.len(), n + i, "{name}: state length");
        if i + 1 < STEPS {
            step = backend.decode_step(&step.state, step.next).unwrap();
        }
    }
    // by re-running the whole sequence each step
    let mut seq = prompt.to_vec();
    let mut exact = 0;
    for i in 0..STEPS {
        let logits = backend.forward_full(&seq, &vocab).unwrap();
        let (best, top) = argmax(&logits);
        // the cached path's token must be the reference's, unless both are within f32
        // rounding of the maximum (a near-tie the two summation orders may break differently)
        let mine = logits[cached[i] as usize];
        assert!(
            cached[i] == best || Tolerance::CPU_F32_LOGITS.accepts(&[mine], &[top]),
            "{name}: step {i}: cached {} ({mine}) vs full {best} ({top})",
            cached[i]
        );
        exact += usize::from(cached[i] == best);
        seq.push(cached[i]);
    }
    assert!(exact > 0, "{name}: no step agreed exactly");
}

#[test]
fn cached_greedy_equals_rerunning_the_sequence() {
    let models = [
        ("qwen2.5", load(&TinySpec::qwen25())),
        ("qwen3", load(&TinySpec::qwen3())),
        ("qwen3.5", qwen35()),
    ];
    for (name, backend) in &models {
        for seed in [1u64, 2] {
            check(name, backend, &ids(seed, 23, 151_643));
        }
    }
}

#[test]
fn decode_step_state_equals_extend_and_leaves_the_input_untouched() {
    let backend = qwen35();
    let prompt = ids(5, 17, 151_643);
    let state = backend.prefill(&prompt).unwrap();
    let before = state.len();
    let step = backend.decode_step(&state, 42).unwrap();
    assert_eq!(state.len(), before);
    let extended = backend.extend(&state, &[42]).unwrap();
    // the two states continue identically
    let cands = [7u32, 42, 1000, 151_000];
    let suffix = [9u32, 10];
    let a = backend
        .score_rows(
            &[&step.state],
            &[ScoreRow {
                state: 0,
                suffix: &suffix,
            }],
            &cands,
        )
        .unwrap();
    let b = backend
        .score_rows(
            &[&extended],
            &[ScoreRow {
                state: 0,
                suffix: &suffix,
            }],
            &cands,
        )
        .unwrap();
    Tolerance::CPU_F32_LOGITS.assert_close("decode_step state vs extend", &a.data, &b.data);
}

#[test]
fn decode_step_refuses_bad_input() {
    let backend = load(&TinySpec::qwen25());
    let state = backend.prefill(&[1, 2, 3]).unwrap();
    let vocab = backend.facts().vocab_size as u32;
    let err = backend.decode_step(&state, vocab).unwrap_err();
    assert!(err.to_string().contains(&vocab.to_string()), "{err}");
}
