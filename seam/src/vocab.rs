//! Full-vocabulary diagnostics through the seam: what a caller may ask about the whole output
//! distribution at a position (its logsumexp and the exact top-K tokens), and the answers.
//!
//! Two ways in, both opt-in so the default scoring path projects only candidate rows:
//! - [`crate::ScoreRequest::with_vocab`]: at each scored row's decision position (the allowed
//!   mass of a field needs the row's logsumexp; the top-K shows what the model wanted instead);
//! - [`VocabRequest`] + [`crate::Backend::vocab_rows`]: at a range of positions of one token
//!   sequence (log-probabilities of a given text, and the independent reference path).
//!
//! Every [`VocabRow`] is computed once per position, with [`crate::topk::top_k`] (one f32
//! logsumexp, exact top-K), equal bit for bit to a full log-softmax followed by a full sort.

use crate::error::BackendError;
use std::ops::Range;

/// Largest K a request may ask for (bounds the answer's size, not the work).
pub const MAX_TOP_K: usize = 1024;

/// One token and its log-probability (natural log, f32).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// The full-vocabulary summary of one position: the f32 logsumexp of its logits and the K most
/// probable tokens, best first (ties by ascending id).
#[derive(Debug, Clone, PartialEq)]
pub struct VocabRow {
    pub logsumexp: f32,
    pub top: Vec<TokenLogprob>,
}

/// One position of a [`VocabRequest`]: its summary and, when the sequence continues, the
/// log-probability of the token that actually follows.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionVocab {
    pub position: usize,
    pub vocab: VocabRow,
    pub next: Option<TokenLogprob>,
}

/// Check a K against [`MAX_TOP_K`] (the vocabulary bound is the backend's).
pub fn check_top_k(top_k: usize) -> Result<(), BackendError> {
    if top_k > MAX_TOP_K {
        return Err(BackendError::InvalidRequest {
            reason: format!("top-K of {top_k} asked; at most {MAX_TOP_K}"),
        });
    }
    Ok(())
}

/// Full-vocabulary summaries at `positions` of one token sequence run from scratch; valid by
/// construction: non-empty ids, a non-empty range inside them, K ≤ [`MAX_TOP_K`].
#[derive(Debug, Clone)]
pub struct VocabRequest<'a> {
    ids: &'a [u32],
    positions: Range<usize>,
    top_k: usize,
}

impl<'a> VocabRequest<'a> {
    pub fn new(
        ids: &'a [u32],
        positions: Range<usize>,
        top_k: usize,
    ) -> Result<Self, BackendError> {
        check_top_k(top_k)?;
        if positions.is_empty() || positions.end > ids.len() {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "positions {}..{} are empty or outside a sequence of {} tokens",
                    positions.start,
                    positions.end,
                    ids.len()
                ),
            });
        }
        Ok(VocabRequest {
            ids,
            positions,
            top_k,
        })
    }

    /// Every position predicting a next token: `0..len − 1` (the log-probabilities of a text;
    /// needs at least two tokens).
    pub fn every_next_token(ids: &'a [u32], top_k: usize) -> Result<Self, BackendError> {
        if ids.len() < 2 {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "log-probabilities need at least 2 tokens (the first has no preceding position); got {}",
                    ids.len()
                ),
            });
        }
        Self::new(ids, 0..ids.len() - 1, top_k)
    }

    /// Only the last position (what the independent path needs for a decision row).
    pub fn last_position(ids: &'a [u32], top_k: usize) -> Result<Self, BackendError> {
        Self::new(ids, ids.len().saturating_sub(1)..ids.len(), top_k)
    }

    pub fn ids(&self) -> &'a [u32] {
        self.ids
    }
    pub fn positions(&self) -> Range<usize> {
        self.positions.clone()
    }
    pub fn top_k(&self) -> usize {
        self.top_k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_once() {
        let ids = [1, 2, 3];
        assert!(VocabRequest::new(&ids, 0..3, 5).is_ok());
        assert!(VocabRequest::new(&ids, 1..1, 5).is_err());
        assert!(VocabRequest::new(&ids, 2..4, 5).is_err());
        assert!(VocabRequest::new(&ids, 0..1, MAX_TOP_K + 1).is_err());
        assert_eq!(
            VocabRequest::every_next_token(&ids, 0).unwrap().positions(),
            0..2
        );
        assert!(VocabRequest::every_next_token(&ids[..1], 1).is_err());
        assert!(VocabRequest::last_position(&[], 1).is_err());
        assert_eq!(
            VocabRequest::last_position(&ids, 1).unwrap().positions(),
            2..3
        );
    }
}
