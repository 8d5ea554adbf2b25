//! `Engine::logprobs`: the per-token log-probabilities of a given text under the model, and
//! the top-K alternatives at every position.
//!
//! In: a text (tokenized as is: no chat template; special-token text is ordinary text unless
//! the engine opted out with `with_context_special_tokens`), K and a token bound. Out:
//! [`TextLogprobs`]: one entry per token; entry `i > 0` holds `log p(token_i | tokens_<i)` and
//! the K most probable tokens at position `i − 1` (exact, ties by lower id first), entry 0 has
//! none (nothing precedes it). The backend runs the text once, in prefill chunks, and
//! summarises the positions in chunks of rows with one f32 logsumexp and an exact top-K per
//! row (`Backend::vocab_rows`).
//!
//! Refused with a clear error: an empty text, a text of one token, a text over
//! `max_input_tokens` (never truncated), K over `MAX_TOP_K` or the vocabulary, and a text over
//! the model's context limit (`ModelFacts::max_positions`, typed `TextOverModelLimit`; the
//! candle backend also refuses such a sequence itself).

use crate::allowed_mass::{token_text, TopToken};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::options::DEFAULT_MAX_INPUT_TOKENS;
use forkscore_seam::{Backend, BackendError, VocabRequest};
use serde::Serialize;
use std::time::Instant;

/// Options of [`Engine::logprobs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobOptions {
    /// Alternatives per position (0: the text's own tokens only).
    pub top_k: usize,
    /// Longest text, in tokens, that is scored (never truncated).
    pub max_input_tokens: usize,
}

impl Default for LogprobOptions {
    fn default() -> Self {
        LogprobOptions {
            top_k: 5,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
        }
    }
}

/// The log-probabilities of one text.
#[derive(Debug, Clone, Serialize)]
pub struct TextLogprobs {
    /// One entry per token of the text, in order.
    pub tokens: Vec<TokenEntry>,
    /// Σ of the entries' log-probabilities (all tokens but the first), in f64.
    pub total_logprob: f64,
    pub top_k: usize,
    pub telemetry: LogprobTelemetry,
}

/// One token of the text.
#[derive(Debug, Clone, Serialize)]
pub struct TokenEntry {
    pub position: usize,
    pub id: u32,
    pub text: Option<String>,
    /// `log p(this token | the tokens before it)`; `None` for the first token.
    pub logprob: Option<f32>,
    /// The most probable tokens where this one was predicted (empty for the first token).
    pub top: Vec<TopToken>,
}

/// Counts and timings of one call.
#[derive(Debug, Clone, Serialize)]
pub struct LogprobTelemetry {
    pub tokens: usize,
    pub tokenize_ms: f64,
    pub score_ms: f64,
    pub total_ms: f64,
}

impl<B: Backend> Engine<B> {
    /// The log-probabilities of `text` (see the module docs).
    pub fn logprobs(&self, text: &str, opts: &LogprobOptions) -> Result<TextLogprobs, EngineError> {
        let start = Instant::now();
        self.check_top_k(opts.top_k)?;
        if opts.max_input_tokens == 0 {
            return Err(EngineError::ZeroMaxInputTokens);
        }
        if text.is_empty() {
            return Err(EngineError::EmptyText);
        }
        let tok = self.tokenizer();
        let ids = if self.context_special_tokens() {
            tok.encode(text)
        } else {
            tok.encode_as_text(text)
        }
        .map_err(|e| BackendError::InvalidRequest {
            reason: format!("cannot tokenize the text: {e}"),
        })?;
        let tokenize_ms = ms(start);
        match ids.len() {
            0 => return Err(EngineError::EmptyText),
            1 => return Err(EngineError::TooFewTokens { tokens: 1 }),
            n if n > opts.max_input_tokens => {
                return Err(EngineError::TextTooLong {
                    tokens: n,
                    max: opts.max_input_tokens,
                })
            }
            n => {
                if let Some(max) = self.backend().facts().max_positions {
                    if n > max {
                        return Err(EngineError::TextOverModelLimit { tokens: n, max });
                    }
                }
            }
        }
        let t = Instant::now();
        let positions = self
            .backend()
            .vocab_rows(&VocabRequest::every_next_token(&ids, opts.top_k)?)?;
        if positions.len() != ids.len() - 1 {
            return Err(BackendError::InvalidRequest {
                reason: format!(
                    "{} position summaries for {} positions",
                    positions.len(),
                    ids.len() - 1
                ),
            }
            .into());
        }
        let score_ms = ms(t);
        let mut tokens = Vec::with_capacity(ids.len());
        tokens.push(TokenEntry {
            position: 0,
            id: ids[0],
            text: token_text(tok, ids[0]),
            logprob: None,
            top: Vec::new(),
        });
        let mut total = 0.0f64;
        for (p, &id) in positions.iter().zip(&ids[1..]) {
            let logprob = match p.next {
                Some(next) if next.id == id => next.logprob,
                _ => {
                    return Err(BackendError::InvalidRequest {
                        reason: format!(
                            "position {} has no log-probability for token {id}",
                            p.position
                        ),
                    }
                    .into())
                }
            };
            total += f64::from(logprob);
            tokens.push(TokenEntry {
                position: p.position + 1,
                id,
                text: token_text(tok, id),
                logprob: Some(logprob),
                top: p
                    .vocab
                    .top
                    .iter()
                    .map(|t| TopToken::new(t.id, t.logprob, tok))
                    .collect(),
            });
        }
        Ok(TextLogprobs {
            tokens,
            total_logprob: total,
            top_k: opts.top_k,
            telemetry: LogprobTelemetry {
                tokens: ids.len(),
                tokenize_ms,
                score_ms,
                total_ms: ms(start),
            },
        })
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
