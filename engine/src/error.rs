//! [`EngineError`]: every way a decision can fail, one variant per stage error.
//!
//! Each stage's error type lives in a module of its own (`rows::error`, `assemble::error`, …)
//! that depends on no stage, so the stages can return `EngineError` without an import circle.

use crate::assemble::error::AssembleError;
use crate::calibration::CalibrationError;
use crate::prepare::split::SplitError;
use crate::rows::error::CompileError;
use crate::template::TemplateError;
use forkscore_seam::BackendError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Compile(CompileError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    #[error("the context is empty")]
    EmptyContext,
    /// A prompt over the token bound: a context's (`schema_only: false`), or the schema's own
    /// part, refused at compile before any context (`schema_only: true`; `prefix` = `total` =
    /// the schema's tokens, `suffix` = 0).
    #[error("{}", too_many_tokens(*prefix, *suffix, *total, *max, *schema_only))]
    TooManyTokens {
        prefix: usize,
        suffix: usize,
        total: usize,
        max: usize,
        schema_only: bool,
    },
    #[error("field_batch_size must be at least 1")]
    ZeroFieldBatch,
    #[error("max_input_tokens must be at least 1")]
    ZeroMaxInputTokens,
    #[error("the tokenizer can produce ids up to {tokenizer_ids} but the model's embedding has only {embedding_rows} rows")]
    TokenizerLargerThanEmbedding {
        tokenizer_ids: usize,
        embedding_rows: usize,
    },
    #[error("compiled schema belongs to another tokenizer/template (compiled rows must come from this engine)")]
    ForeignSchema,
    #[error("prepared context belongs to another compiled schema or prompt layout (prepare it with the schema and the layout it is decided with)")]
    ForeignPrepared,
    #[error("group member {index} has no prepared context")]
    MissingMember { index: usize },
    #[error("the chat template dropped or rewrote the user message: the context does not appear in the rendered prompt, so every context would score the same")]
    ContextNotInPrompt,
    #[error("field `{field}`: the model produced a non-finite logit ({value}); the weights or the compute dtype overflow, so no choice can be selected")]
    NonFiniteLogits { field: String, value: String },
    #[error("top-K of {top_k} asked; at most {max} (the smaller of {max_top_k} and the model's vocabulary)", max_top_k = forkscore_seam::MAX_TOP_K)]
    TopKTooLarge { top_k: usize, max: usize },
    #[error("the text is empty: there are no tokens to score")]
    EmptyText,
    #[error("the text is {tokens} token(s); log-probabilities need at least 2 (the first token has no preceding position)")]
    TooFewTokens { tokens: usize },
    #[error("the text is {tokens} tokens, over max_input_tokens = {max}; forkscore never truncates — shorten the text or raise --max-input-tokens")]
    TextTooLong { tokens: usize, max: usize },
    /// A text longer than the model's own context limit (`max_position_embeddings`).
    #[error("the text is {tokens} tokens, over the model's context limit (max_position_embeddings = {max}); forkscore never truncates — shorten the text")]
    TextOverModelLimit { tokens: usize, max: usize },
}

fn too_many_tokens(prefix: usize, suffix: usize, total: usize, max: usize, schema: bool) -> String {
    if schema {
        CompileError::TooManyTokens { tokens: total, max }.to_string()
    } else {
        format!("prompt is {total} tokens (prefix {prefix} + longest field suffix {suffix}), over max_input_tokens = {max}; forkscore never truncates — shorten the context or raise --max-input-tokens")
    }
}

impl EngineError {
    /// The schema's own part of the prompt, `tokens` long, is over the bound `max`.
    pub fn schema_too_long(tokens: usize, max: usize) -> EngineError {
        EngineError::TooManyTokens {
            prefix: tokens,
            suffix: 0,
            total: tokens,
            max,
            schema_only: true,
        }
    }
}

impl From<CompileError> for EngineError {
    /// A schema over the token bound is the same failure as a prompt over it (one error kind,
    /// `too_many_tokens`, on every surface); every other compile failure stays a compile error.
    fn from(e: CompileError) -> EngineError {
        match e {
            CompileError::TooManyTokens { tokens, max } => {
                EngineError::schema_too_long(tokens, max)
            }
            e => EngineError::Compile(e),
        }
    }
}
