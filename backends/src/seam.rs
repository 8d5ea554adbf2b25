//! The backend seam: the only interface between the staged engine and a model.
//!
//! Flow per context group: `prefill(prefix ids) -> State` (once per prefix, retained and never
//! mutated afterwards) then `score(&[&State], rows, candidates) -> CandidateLogits` (one call for
//! many rows, each row naming the state it continues from). `forward_full` is the independent
//! reference path: the complete prompt from scratch, no state reuse.
//!
//! Invariants every implementation keeps:
//! - `score` never mutates a state; a row's logits depend only on its own state's prefix and its
//!   own suffix (not on siblings, padding, slot order or how rows are batched);
//! - `score` and `forward_full` return logits for exactly the `candidates` ids, in that order,
//!   computed in f32 (only the candidate rows of the output head are projected);
//! - `prefill(a ++ b)` then scoring `c` equals `forward_full(a ++ b ++ c)` (within the backend's
//!   numeric tolerance).

use crate::BackendError;

/// Facts about the loaded model the engine and the provenance record need.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelFacts {
    /// `config.json` architecture name, e.g. `Qwen2ForCausalLM`, or `fake` for test backends.
    pub architecture: String,
    /// Model family, e.g. `qwen2`, `qwen3`, `qwen3_5`, `fake`.
    pub family: String,
    /// Number of rows of the embedding / output head (may exceed the tokenizer's vocabulary).
    pub vocab_size: usize,
    pub num_layers: usize,
    pub hidden_size: usize,
    /// Bytes of state one sequence holds whatever its length: the f32 conv + recurrent states of
    /// linear-attention (Gated DeltaNet) layers; 0 for attention-only models. A scoring call
    /// holds this per row (each row's branch state), so memory budgets must count it.
    pub fixed_state_bytes: usize,
    /// Compute dtype of the backbone, e.g. `f32`, `bf16`.
    pub dtype: String,
    /// Device, e.g. `cpu`, `cuda:0`, `metal:0`.
    pub device: String,
}

/// A retained prefix state (attention K/V, and conv + recurrent state for linear-attention
/// layers). Produced by [`Backend::prefill`]; read-only afterwards.
pub trait PrefixState: Send + Sync {
    /// Number of prefix tokens this state covers.
    fn len(&self) -> usize;
    /// True when the state covers no token.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes held by the state (for memory budgets and telemetry).
    fn nbytes(&self) -> usize;
}

/// One row to score: the index (into the `states` slice passed to [`Backend::score`]) of the
/// prefix state it continues, and its suffix token ids (non-empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreRow<'a> {
    pub state: usize,
    pub suffix: &'a [u32],
}

/// f32 logits, row-major `[rows, candidates]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateLogits {
    pub rows: usize,
    pub candidates: usize,
    pub data: Vec<f32>,
}

impl CandidateLogits {
    /// Logits of row `r`, one per candidate id, in the order of the candidate list.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.candidates..(r + 1) * self.candidates]
    }
}

/// The seam. One implementation per family of devices/runtimes (candle covers CPU/CUDA/Metal);
/// a deterministic fake lives in `forkscore-testkit` for engine tests.
pub trait Backend: Send + Sync {
    /// The retained prefix state.
    type State: PrefixState;

    /// Facts about the loaded model.
    fn facts(&self) -> &ModelFacts;

    /// Run the backbone over `ids` (non-empty) and retain its state. No vocabulary projection.
    fn prefill(&self, ids: &[u32]) -> Result<Self::State, BackendError>;

    /// Prefill several prefixes (each non-empty): result `i` is `prefill(prefixes[i])` (equal
    /// within f32 rounding), in input order, one result per prefix. Backends that can run them
    /// together (one padded batch on a GPU) override this; the default prefills one by one.
    fn prefill_many(&self, prefixes: &[&[u32]]) -> Vec<Result<Self::State, BackendError>> {
        prefixes.iter().map(|ids| self.prefill(ids)).collect()
    }

    /// Continue a retained state with more tokens (`ids` non-empty): the result equals
    /// `prefill(prefix ++ ids)` and `state` is left untouched. Lets one context prefix be
    /// prefilled once and extended per schema.
    fn extend(&self, state: &Self::State, ids: &[u32]) -> Result<Self::State, BackendError>;

    /// Score `rows` in one call. Row `i` continues `states[rows[i].state]` with its suffix; the
    /// result holds, per row, the logits at the row's last suffix token for each id of
    /// `candidates`. States are never mutated; branch state is discarded.
    fn score(
        &self,
        states: &[&Self::State],
        rows: &[ScoreRow<'_>],
        candidates: &[u32],
    ) -> Result<CandidateLogits, BackendError>;

    /// The independent reference path: run the complete prompt `ids` from scratch and return
    /// the logits at its last position for each id of `candidates`.
    fn forward_full(&self, ids: &[u32], candidates: &[u32]) -> Result<Vec<f32>, BackendError>;
}
