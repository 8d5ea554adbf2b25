//! A score request checked once ([`ScoreRequest::new`]) and the logits that answer it.
//!
//! Invariants of a [`ScoreRequest`] (every backend relies on them instead of re-checking):
//! at least one row and one candidate id; every row names an existing state and has a
//! non-empty suffix. Token ids are not checked here: their bound is the backend's vocabulary.

use crate::backend::PrefixState;
use crate::error::BackendError;

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
        })
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
        Ok(())
    }
}
