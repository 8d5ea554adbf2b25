//! The [`Backend`] trait and its retained [`PrefixState`].
//!
//! Flow per context group: `prefill(prefix ids) -> State` (once per prefix, retained and never
//! mutated afterwards) then `score(request) -> CandidateLogits` (one call for many rows, each
//! row naming the state it continues from). `forward_full` is the independent reference path:
//! the complete prompt from scratch, no state reuse.
//!
//! Invariants every implementation keeps:
//! - `score` never mutates a state; a row's logits depend only on its own state's prefix and its
//!   own suffix (not on siblings, padding, slot order or how rows are batched);
//! - `score` and `forward_full` return logits for exactly the candidate ids, in their order,
//!   computed in f32 (only the candidate rows of the output head are projected);
//! - `prefill(a ++ b)` then scoring `c` equals `forward_full(a ++ b ++ c)` (within the backend's
//!   numeric tolerance);
//! - `decode_step(state, t)` equals `extend(state, &[t])` plus the argmax of the full
//!   vocabulary at `t` (lowest id on ties);
//! - full-vocabulary summaries (`ScoreRequest::with_vocab`, `vocab_rows`) are opt-in: without
//!   them nothing beyond the candidate rows of the head is projected.

use crate::error::BackendError;
use crate::facts::ModelFacts;
use crate::request::{CandidateLogits, ScoreRequest, ScoreRow};
use crate::tree::TreeRequest;
use crate::vocab::{PositionVocab, VocabRequest};

pub use crate::state::PrefixState;

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

    /// Continue one retained state with several suffixes (each non-empty): result `i` is
    /// `extend(state, suffixes[i])` (equal within f32 rounding), in input order, one result per
    /// suffix. Lets a prompt head shared by many contexts (instructions, catalogue) be
    /// prefilled once and each context's own tokens run together. Backends that can run the
    /// suffixes in one pass (a GPU) override this; the default extends one by one.
    fn extend_many(
        &self,
        state: &Self::State,
        suffixes: &[&[u32]],
    ) -> Vec<Result<Self::State, BackendError>> {
        suffixes.iter().map(|ids| self.extend(state, ids)).collect()
    }

    /// Score a validated request in one call. Row `i` continues `request.states()[row.state]`
    /// with its suffix; the result holds, per row, the logits at the row's last suffix token for
    /// each candidate id. States are never mutated; branch state is discarded.
    fn score(
        &self,
        request: &ScoreRequest<'_, Self::State>,
    ) -> Result<CandidateLogits, BackendError>;

    /// [`ScoreRequest::new`] then [`Backend::score`]: for callers holding raw slices.
    fn score_rows(
        &self,
        states: &[&Self::State],
        rows: &[ScoreRow<'_>],
        candidates: &[u32],
    ) -> Result<CandidateLogits, BackendError> {
        self.score(&ScoreRequest::new(states, rows, candidates)?)
    }

    /// Score a token tree: the result holds, per projected node (in
    /// [`crate::TokenTree::projected`] order), the logits after `prefix ++ path(node)` for each
    /// candidate id. The default scores one flat row per projected node (its root-to-node path)
    /// in one [`Backend::score`] call, which is the reference every faster packing is tested
    /// against; backends that can share the tree's common tokens override it. With
    /// [`TreeRequest::with_vocab`], each projected node also gets its full-vocabulary summary.
    fn score_tree(
        &self,
        request: &TreeRequest<'_, Self::State>,
    ) -> Result<CandidateLogits, BackendError> {
        score_tree_by_rows(self, request)
    }

    /// Whether several contexts must never share a call: the engine then prefills and scores
    /// each context of a group in calls of its own, so a context's result is bit for bit what
    /// it is alone whatever the device's libraries pick for larger shapes (`--deterministic`
    /// on a GPU, where cuBLAS chooses its kernel and split from the whole problem shape).
    /// Default false: merged calls.
    fn contexts_alone(&self) -> bool {
        false
    }

    /// How [`Backend::score_tree`] evaluates a tree on this model, for telemetry.
    fn tree_packing(&self) -> TreePacking {
        TreePacking::RowPerNode
    }

    /// One greedy decoding step: continue `state` with `token` and return the new state (equal
    /// to `extend(state, &[token])`; `state` is left untouched) and the full-vocabulary argmax
    /// at the new last position (ties broken by the lowest token id; a non-finite logit is an
    /// error). This is what an autoregressive baseline calls once per generated token.
    ///
    /// The default is correct but runs the token twice (`extend`, then a one-row `score` with
    /// [`ScoreRequest::with_vocab`]`(1)`, whose top-1 is exact and ties by ascending id);
    /// backends override it with one forward that keeps the new state and projects the full
    /// head at that one position.
    fn decode_step(
        &self,
        state: &Self::State,
        token: u32,
    ) -> Result<DecodeStep<Self::State>, BackendError> {
        let next_state = self.extend(state, &[token])?;
        let suffix = [token];
        let rows = [ScoreRow {
            state: 0,
            suffix: &suffix,
        }];
        let states = [state];
        let request = ScoreRequest::new(&states, &rows, &[0])?.with_vocab(1)?;
        let logits = self.score(&request)?;
        let next = logits
            .vocab
            .as_ref()
            .and_then(|v| v.first())
            .and_then(|row| row.top.first())
            .map(|t| t.id)
            .ok_or_else(|| BackendError::InvalidRequest {
                reason: "the backend returned no full-vocabulary summary for a decode step".into(),
            })?;
        Ok(DecodeStep {
            state: next_state,
            next,
        })
    }

    /// The independent reference path: run the complete prompt `ids` from scratch and return
    /// the logits at its last position for each id of `candidates`.
    fn forward_full(&self, ids: &[u32], candidates: &[u32]) -> Result<Vec<f32>, BackendError>;

    /// Run `request.ids()` from scratch and summarise the full vocabulary at each position of
    /// `request.positions()`, in order: one f32 logsumexp and the exact top-K
    /// ([`crate::topk::top_k`]), plus the log-probability of the next token where there is one.
    /// Token ids and K are checked against the vocabulary here.
    fn vocab_rows(&self, request: &VocabRequest<'_>) -> Result<Vec<PositionVocab>, BackendError>;
}

/// The default of [`Backend::score_tree`], callable on its own: one flat row per projected node
/// (its root-to-node path) in one [`Backend::score`] call. The reference every packing is tested
/// against, and the path of backends (or models) that cannot pack.
pub fn score_tree_by_rows<B: Backend + ?Sized>(
    backend: &B,
    request: &TreeRequest<'_, B::State>,
) -> Result<CandidateLogits, BackendError> {
    let tree = request.tree();
    let paths: Vec<Vec<u32>> = tree.projected().iter().map(|&i| tree.path(i)).collect();
    let rows: Vec<ScoreRow<'_>> = tree
        .projected()
        .iter()
        .zip(&paths)
        .map(|(&i, p)| ScoreRow {
            state: tree.nodes()[i].state,
            suffix: p,
        })
        .collect();
    let mut flat = ScoreRequest::new(request.states(), &rows, request.candidates())?;
    if let Some(k) = request.vocab_top_k() {
        flat = flat.with_vocab(k)?;
    }
    backend.score(&flat)
}

/// The result of [`Backend::decode_step`].
#[derive(Debug)]
pub struct DecodeStep<S> {
    /// The state after the step's token.
    pub state: S,
    /// The greedy next token: the full-vocabulary argmax after the step's token (lowest id on ties).
    pub next: u32,
}

/// How a backend evaluates a [`crate::TokenTree`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreePacking {
    /// One flat row per projected node (the default of [`Backend::score_tree`]).
    RowPerNode,
    /// One batched row per root-to-leaf path, projected at every marked position along it
    /// (models whose layers carry a recurrent state, which cannot take a tree mask).
    RowPerLeaf,
    /// All nodes of one state packed into one sequence under a tree attention mask, positions
    /// `prefix_len + depth` (attention-only models).
    Packed,
}

impl TreePacking {
    /// A short name for telemetry.
    pub fn name(self) -> &'static str {
        match self {
            TreePacking::RowPerNode => "row-per-node",
            TreePacking::RowPerLeaf => "row-per-leaf",
            TreePacking::Packed => "packed",
        }
    }
}
