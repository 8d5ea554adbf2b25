//! [`CompileError`]: why stage 1 (row compilation) refuses a schema. Its own module so that
//! `EngineError` can name it without depending on the compilation stage itself.

use crate::literal::compile::LiteralError;
use crate::prepare::split::SplitError;
use crate::template::TemplateError;
use crate::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error("field `{field}`: code {code:?} is {tokens} tokens after the selector {selector:?} with this tokenizer (it must be exactly one token); this tokenizer cannot use code scoring")]
    CodeNotSingleToken {
        field: String,
        code: String,
        selector: String,
        tokens: usize,
    },
    #[error("field `{field}` ({scoring} scoring): {source}")]
    Literal {
        field: String,
        scoring: &'static str,
        #[source]
        source: LiteralError,
    },
    #[error("field `{field}`: the code {code:?} merges with the selector {selector:?} when tokenized, so the prompt would not end where the code begins")]
    CodeMergesWithSelector {
        field: String,
        code: String,
        selector: String,
    },
    /// The schema alone is over the token bound (becomes [`crate::EngineError::TooManyTokens`]).
    #[error("the schema's prompt is at least {tokens} tokens before any context, over max_input_tokens = {max}; forkscore never truncates — shorten the schema (fewer fields, shorter descriptions or choices) or raise --max-input-tokens")]
    TooManyTokens { tokens: usize, max: usize },
}
