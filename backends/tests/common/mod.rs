//! Shared helpers for the candle backend tests: tiny models loaded once per test binary.
#![allow(dead_code)]

use std::sync::OnceLock;

use forkscore_backends::{Backend, CandleBackend, LoadOptions, ResolvedCheckpoint, ScoreRow};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};

/// The two dense architectures under test, loaded on CPU f32 (Qwen2.5 tied, Qwen3 untied).
pub fn models() -> &'static [(&'static str, CandleBackend)] {
    static MODELS: OnceLock<Vec<(&'static str, CandleBackend)>> = OnceLock::new();
    MODELS.get_or_init(|| {
        vec![
            ("qwen2.5", load(&TinySpec::qwen25())),
            ("qwen3", load(&TinySpec::qwen3())),
        ]
    })
}

pub fn load(spec: &TinySpec) -> CandleBackend {
    let dir = ensure_tiny_model(spec);
    let ckpt = ResolvedCheckpoint::from_folder(&dir, "tiny-test").expect("resolve tiny model");
    CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load tiny model")
}

/// Deterministic pseudo-random token ids below `vocab` (xorshift; tests only).
pub fn ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// A fixed candidate list spanning the vocabulary (small and large ids, special tokens).
pub fn candidates() -> Vec<u32> {
    vec![32, 33, 34, 35, 362, 425, 6896, 151643, 151645, 151935]
}

/// Load the checkpoint folder `dir` on CPU f32.
pub fn load_dir(dir: &std::path::Path) -> CandleBackend {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-test").expect("resolve model");
    CandleBackend::load(&ckpt, &LoadOptions::default()).expect("load model")
}

/// Every layer state's tensors (K, V or conv, recurrent) flattened to f32, layer order.
pub fn state_values(state: &forkscore_backends::CandleState) -> Vec<f32> {
    use forkscore_backends::candle::LayerState;
    state
        .layers()
        .iter()
        .flat_map(|l| match l {
            LayerState::Attention { k, v } => vec![k.clone(), v.clone()],
            LayerState::Linear { conv, recurrent } => vec![conv.clone(), recurrent.clone()],
        })
        .flat_map(|t| {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("state to host")
        })
        .collect()
}

/// Every suffix over every one of `states` states, state-major: the rows of a merged scoring
/// call (row `s * suffixes.len() + j` continues state `s` with suffix `j`).
pub fn rows_over_states(states: usize, suffixes: &[Vec<u32>]) -> Vec<ScoreRow<'_>> {
    (0..states)
        .flat_map(|s| {
            suffixes.iter().map(move |x| ScoreRow {
                state: s,
                suffix: x,
            })
        })
        .collect()
}

/// Logits of a full forward and of prefill + fork for the same prompt.
pub fn full_and_fork(m: &CandleBackend, vocab: usize) -> (Vec<f32>, Vec<f32>) {
    let ids = ids(91, 36, vocab);
    let cands: Vec<u32> = candidates()
        .into_iter()
        .filter(|&c| (c as usize) < vocab)
        .collect();
    let full = m.forward_full(&ids, &cands).expect("forward_full");
    let st = m.prefill(&ids[..30]).expect("prefill");
    let fork = m
        .score_rows(
            &[&st],
            &[ScoreRow {
                state: 0,
                suffix: &ids[30..],
            }],
            &cands,
        )
        .expect("score")
        .data;
    (full, fork)
}
