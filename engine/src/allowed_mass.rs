//! The allowed-mass diagnostic of one field (opt-in: `ScoreOptions::allowed_mass`).
//!
//! In: the field's own code logits (from the candidate head) and the row's full-vocabulary
//! summary at the decision position (one f32 logsumexp and the exact top-K, from the backend).
//! Out: [`AllowedMass`]: how much of the model's whole next-token distribution (temperature 1,
//! the raw model) falls on the field's allowed codes, and the K tokens it wanted most there.
//! A low mass says the constrained decision is forced: the model wanted to answer something
//! else. Probabilities are `exp(logit − logsumexp)` in f64.

use crate::tokenizer::ChatTokenizer;
use forkscore_seam::VocabRow;
use serde::Serialize;

/// The full-vocabulary view of one field at its decision position.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllowedMass {
    /// Σ over the field's codes of exp(code logit − logsumexp): the probability, under the
    /// unconstrained model, that the next token is one of the allowed codes. Candidate logits
    /// and the logsumexp come from two projections of the same hidden state, so a mass of
    /// (almost) all the distribution can round a few ulps above 1; it is capped at 1.
    pub mass: f64,
    /// The f32 logsumexp of the position's full-vocabulary logits.
    pub logsumexp: f32,
    /// The most probable tokens at the position, best first (ties: lower id first).
    pub top: Vec<TopToken>,
}

/// One of the most probable tokens at a position.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopToken {
    pub id: u32,
    /// The token's text (`None` for an id the tokenizer has no token for, e.g. padding rows of
    /// the embedding).
    pub text: Option<String>,
    pub logprob: f32,
    pub probability: f64,
}

impl TopToken {
    /// `id` with log-probability `logprob`, its text decoded by `tokenizer`.
    pub fn new(id: u32, logprob: f32, tokenizer: &ChatTokenizer) -> TopToken {
        TopToken {
            id,
            text: token_text(tokenizer, id),
            logprob,
            probability: f64::from(logprob).exp(),
        }
    }
}

/// The text of one token id, or `None` when the tokenizer has no token for it (it decodes to
/// nothing).
pub fn token_text(tokenizer: &ChatTokenizer, id: u32) -> Option<String> {
    tokenizer.decode(&[id]).ok().filter(|t| !t.is_empty())
}

/// The allowed mass of a field whose own code logits are `code_logits`.
pub fn allowed_mass(
    code_logits: &[f32],
    vocab: &VocabRow,
    tokenizer: &ChatTokenizer,
) -> AllowedMass {
    let lse = f64::from(vocab.logsumexp);
    let mass: f64 = code_logits
        .iter()
        .map(|&l| (f64::from(l) - lse).exp())
        .sum();
    AllowedMass {
        mass: mass.min(1.0),
        logsumexp: vocab.logsumexp,
        top: vocab
            .top
            .iter()
            .map(|t| TopToken::new(t.id, t.logprob, tokenizer))
            .collect(),
    }
}
