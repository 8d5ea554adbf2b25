//! Test helpers: the fake-backend engine with the real Qwen2.5 tokenizer, and [`Slow`], a
//! backend whose prefill takes a fixed time (to hold a request in flight deterministically).
#![allow(dead_code)] // each test file uses its own subset

use forkscore_engine::{CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine};
use forkscore_seam::{
    Backend, BackendError, CandidateLogits, ModelFacts, PositionVocab, ScoreRequest, VocabRequest,
};
use forkscore_testkit::fake::FakeBackend;
use forkscore_testkit::tokenizers::{Family, Fixture};
use std::path::Path;
use std::time::Duration;

pub fn engine_on<B: Backend>(backend: B) -> Engine<B> {
    let f = Family::Qwen2;
    let tok = ChatTokenizer::from_parts(
        &f.tokenizer_json().expect("tokenizer fixture"),
        Some(f.tokenizer_config_json()),
        None,
        "qwen2",
        Path::new("fixtures"),
    )
    .expect("fixture tokenizer loads");
    Engine::new(
        backend,
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )
    .expect("engine")
}

/// The fake backend whose every prefill (whole, or continuing a state such as the cached prompt
/// head) first sleeps `delay`: same logits, known slowness.
pub struct Slow {
    pub inner: FakeBackend,
    pub delay: Duration,
}

impl Backend for Slow {
    type State = <FakeBackend as Backend>::State;
    fn facts(&self) -> &ModelFacts {
        self.inner.facts()
    }
    fn prefill(&self, ids: &[u32]) -> Result<Self::State, BackendError> {
        std::thread::sleep(self.delay);
        self.inner.prefill(ids)
    }
    fn extend(&self, state: &Self::State, ids: &[u32]) -> Result<Self::State, BackendError> {
        std::thread::sleep(self.delay);
        self.inner.extend(state, ids)
    }
    fn score(
        &self,
        request: &ScoreRequest<'_, Self::State>,
    ) -> Result<CandidateLogits, BackendError> {
        self.inner.score(request)
    }
    fn forward_full(&self, ids: &[u32], candidates: &[u32]) -> Result<Vec<f32>, BackendError> {
        std::thread::sleep(self.delay);
        self.inner.forward_full(ids, candidates)
    }
    fn vocab_rows(&self, request: &VocabRequest<'_>) -> Result<Vec<PositionVocab>, BackendError> {
        self.inner.vocab_rows(request)
    }
}
