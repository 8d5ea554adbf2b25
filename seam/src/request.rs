//! A score request checked once ([`ScoreRequest::new`]) and the logits that answer it.
//!
//! Invariants of a [`ScoreRequest`] (every backend relies on them instead of re-checking):
//! at least one row and one candidate id; every row names an existing state and has a
//! non-empty suffix. Token ids are not checked here: their bound is the backend's vocabulary.
//!
//! Opt-in: [`ScoreRequest::with_vocab`] also asks, per row, for the full-vocabulary summary at
//! the row's decision position ([`VocabRow`]: one f32 logsumexp and the exact top-K); without
//! it a backend projects only the candidate rows and [`CandidateLogits::vocab`] is `None`.

use crate::error::BackendError;
use crate::state::PrefixState;
use crate::vocab::{check_top_k, VocabRow};

/// One row to score: the index (into the request's states) of the prefix state it continues,
/// and its suffix token ids (non-empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreRow<'a> {
    pub state: usize,
    pub suffix: &'a [u32],
}

/// Rows over retained states, with the candidate ids to project; valid by construction.
#[derive(Debug)]
pub struct ScoreRequest<'a, S> {
    states: &'a [&'a S],
    rows: &'a [ScoreRow<'a>],
    candidates: &'a [u32],
    /// `Some(K)`: also a [`VocabRow`] per row with the top K tokens.
    vocab_top_k: Option<usize>,
}

impl<'a, S: PrefixState> ScoreRequest<'a, S> {
    /// Check `rows` against `states` and `candidates` (see the module docs).
    pub fn new(
        states: &'a [&'a S],
        rows: &'a [ScoreRow<'a>],
        candidates: &'a [u32],
    ) -> Result<Self, BackendError> {
        let invalid = |reason: String| Err(BackendError::InvalidRequest { reason });
        if rows.is_empty() {
            return invalid("no rows to score".into());
        }
        if candidates.is_empty() {
            return invalid("no candidate ids".into());
        }
        for (i, r) in rows.iter().enumerate() {
            if r.state >= states.len() {
                return invalid(format!(
                    "row {i} names state {} of {}",
                    r.state,
                    states.len()
                ));
            }
            if r.suffix.is_empty() {
                return invalid(format!("row {i} has an empty suffix"));
            }
        }
        Ok(ScoreRequest {
            states,
            rows,
            candidates,
            vocab_top_k: None,
        })
    }

    /// Also ask for each row's full-vocabulary summary with the top `top_k` tokens
    /// (`top_k` ≤ [`crate::vocab::MAX_TOP_K`]; 0 asks for the logsumexp alone).
    pub fn with_vocab(mut self, top_k: usize) -> Result<Self, BackendError> {
        check_top_k(top_k)?;
        self.vocab_top_k = Some(top_k);
        Ok(self)
    }

    /// `Some(K)` when the caller asked for full-vocabulary summaries.
    pub fn vocab_top_k(&self) -> Option<usize> {
        self.vocab_top_k
    }

    pub fn states(&self) -> &'a [&'a S] {
        self.states
    }
    /// The rows, in the caller's order (logits come back in this order).
    pub fn rows(&self) -> &'a [ScoreRow<'a>] {
        self.rows
    }
    pub fn candidates(&self) -> &'a [u32] {
        self.candidates
    }
    /// The prefix length of the state row `i` continues.
    pub fn past_len(&self, i: usize) -> usize {
        self.states[self.rows[i].state].len()
    }
}

/// f32 logits, row-major `[rows, candidates]`, and (only when the request asked for them) one
/// full-vocabulary summary per row.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateLogits {
    pub rows: usize,
    pub candidates: usize,
    pub data: Vec<f32>,
    /// One [`VocabRow`] per row when the request had [`ScoreRequest::with_vocab`], else `None`.
    pub vocab: Option<Vec<VocabRow>>,
}

impl CandidateLogits {
    /// Logits of row `r`, one per candidate id, in the order of the candidate list.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.candidates..(r + 1) * self.candidates]
    }

    /// Check the shape against what was asked for (`rows` × `candidates`).
    pub fn check_shape(&self, rows: usize, candidates: usize) -> Result<(), BackendError> {
        if self.rows != rows
            || self.candidates != candidates
            || self.data.len() != rows * candidates
        {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "backend returned {}x{} logits ({} values) for {rows}x{candidates} requested",
                    self.rows,
                    self.candidates,
                    self.data.len()
                ),
            });
        }
        if let Some(v) = &self.vocab {
            if v.len() != rows {
                return Err(BackendError::InvalidRequest {
                    reason: format!(
                        "backend returned {} vocabulary summaries for {rows} rows",
                        v.len()
                    ),
                });
            }
        }
        Ok(())
    }
}
