//! Stage 2, prepare: one context and a compiled schema in; a [`PreparedContext`] out — the
//! prompt rendered ([`render`]) and split exactly into one shared prefix and per-row suffixes
//! ([`split`], through the once-tokenized head of [`anchor`]), within the token bound. The
//! context is untrusted ([`untrusted`]): it must appear verbatim in the rendered prompt, and
//! special-token text inside it is tokenized as text ([`guard`]) unless the engine opts out.
//!
//! Invariants: a [`PreparedContext`] can only be built here, from a compiled schema of the same
//! tokenizer; it remembers that schema (by hash) and the engine refuses to decide it with
//! another; prompts over `max_input_tokens` are errors, never truncated.

pub mod anchor;
pub mod arrange;
pub mod guard;
pub mod render;
pub mod split;
pub mod untrusted;

use crate::error::EngineError;
use crate::options::Layout;
use crate::rows::CompiledSchema;
use crate::tokenizer::ChatTokenizer;
use render::render_prefix;
use split::SplitPrompt;
use std::time::Instant;

/// A context rendered and split for one compiled schema, ready for prefill.
#[derive(Debug, Clone)]
pub struct PreparedContext {
    split: SplitPrompt,
    schema_hash: String,
    layout: Layout,
    render_ms: f64,
    split_ms: f64,
}

impl PreparedContext {
    /// The prompt's shared prefix and per-row suffixes.
    pub fn split(&self) -> &SplitPrompt {
        &self.split
    }
    /// Hash of the schema this context was prepared for.
    pub fn schema_hash(&self) -> &str {
        &self.schema_hash
    }
    /// Where the context sits in its prompt.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// True when this context was prepared for `compiled`.
    pub fn belongs_to(&self, compiled: &CompiledSchema) -> bool {
        self.schema_hash == compiled.schema_hash()
    }
    pub fn render_ms(&self) -> f64 {
        self.render_ms
    }
    pub fn split_ms(&self) -> f64 {
        self.split_ms
    }
}

/// Render the prefix for `context`, split exactly, enforce the token bound.
pub(crate) fn prepare(
    tokenizer: &ChatTokenizer,
    context: &str,
    compiled: &CompiledSchema,
    max_input_tokens: usize,
    context_special_tokens: bool,
    layout: Layout,
) -> Result<PreparedContext, EngineError> {
    if max_input_tokens == 0 {
        return Err(EngineError::ZeroMaxInputTokens);
    }
    if compiled.tokenizer_identity() != tokenizer.identity() {
        return Err(EngineError::ForeignSchema);
    }
    if context.trim().is_empty() {
        return Err(EngineError::EmptyContext);
    }
    if compiled.schema_tokens() > max_input_tokens {
        // the schema alone is over the bound: no context could fit, none is tokenized
        return Err(EngineError::schema_too_long(
            compiled.schema_tokens(),
            max_input_tokens,
        ));
    }
    let t = Instant::now();
    let prefix_text = render_prefix(
        tokenizer.template(),
        context,
        compiled.schema_fields(),
        layout,
    )?;
    let render_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let span = untrusted::context_span(&prefix_text, context, compiled.schema_fields(), layout)?;
    let split = untrusted::split_context(
        tokenizer,
        &prefix_text,
        span,
        context_special_tokens,
        compiled.schema_fields(),
        &compiled.selectors(),
        layout,
    )?;
    let split_ms = t.elapsed().as_secs_f64() * 1e3;
    if split.input_tokens() > max_input_tokens {
        return Err(EngineError::TooManyTokens {
            prefix: split.prefix_ids.len(),
            suffix: split.longest_suffix(),
            total: split.input_tokens(),
            max: max_input_tokens,
            schema_only: false,
        });
    }
    Ok(PreparedContext {
        split,
        schema_hash: compiled.schema_hash().to_string(),
        layout,
        render_ms,
        split_ms,
    })
}
