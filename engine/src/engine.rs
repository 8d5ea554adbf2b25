//! The staged engine for one backend: compile rows → render + split → prefill → score → assemble.
//!
//! `Engine::score` runs one context; `decide_many` (see `many`) runs many through bounded groups.
//! Every entry point goes through the same stage functions, so modes and groupings differ only
//! in how rows are batched.

use crate::assemble::{assemble_fields, telemetry, Decision, PromptDebug, RowDebug};
use crate::calibration::{CalibrationError, CalibrationRegistry, CheckpointIdentity, Temperature};
use crate::modes::{run_group, Mode};
use crate::render::render_prefix;
use crate::rows::{CompileError, CompiledSchema};
use crate::schema::Schema;
use crate::split::{SplitError, SplitPrompt};
use crate::template::TemplateError;
use crate::tokenizer::ChatTokenizer;
use forkscore_backends::{Backend, BackendError};
use std::time::Instant;

/// Default bound on prefix + longest suffix tokens.
pub const DEFAULT_MAX_INPUT_TOKENS: usize = 4096;

/// Per-request scoring options.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreOptions {
    pub mode: Mode,
    /// Rows per score call in parallel mode (None: all rows in one call).
    pub field_batch_size: Option<usize>,
    /// None: the checkpoint's calibrated default, else 1.
    pub temperature: Option<f64>,
    pub allow_uncalibrated: bool,
    pub max_input_tokens: usize,
    pub include_prompt: bool,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions {
            mode: Mode::Parallel,
            field_batch_size: None,
            temperature: None,
            allow_uncalibrated: false,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
            include_prompt: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    #[error("the context is empty")]
    EmptyContext,
    #[error("prompt is {total} tokens (prefix {prefix} + longest field suffix {suffix}), over max_input_tokens = {max}; forkscore never truncates — shorten the context or raise --max-input-tokens")]
    TooManyTokens {
        prefix: usize,
        suffix: usize,
        total: usize,
        max: usize,
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
    #[error("the chat template dropped or rewrote the user message: the context does not appear in the rendered prompt, so every context would score the same")]
    ContextNotInPrompt,
    #[error("field `{field}`: the model produced a non-finite logit ({value}); the weights or the compute dtype overflow, so no choice can be selected")]
    NonFiniteLogits { field: String, value: String },
}

/// A context rendered and split, ready for prefill.
#[derive(Debug, Clone)]
pub struct PreparedContext {
    pub split: SplitPrompt,
    pub render_ms: f64,
    pub split_ms: f64,
}

/// An engine over one backend and its tokenizer.
pub struct Engine<B: Backend> {
    backend: B,
    tokenizer: ChatTokenizer,
    identity: CheckpointIdentity,
    registry: CalibrationRegistry,
    /// Whether special-token text inside a context is tokenized as control tokens (opt-out of
    /// the default, see [`crate::untrusted`]).
    context_special_tokens: bool,
}

impl<B: Backend> Engine<B> {
    /// Pair a backend with its tokenizer; refuses a tokenizer whose ids exceed the embedding.
    pub fn new(
        backend: B,
        tokenizer: ChatTokenizer,
        identity: CheckpointIdentity,
        registry: CalibrationRegistry,
    ) -> Result<Engine<B>, EngineError> {
        let (tokenizer_ids, embedding_rows) = (tokenizer.id_bound(), backend.facts().vocab_size);
        if tokenizer_ids > embedding_rows {
            return Err(EngineError::TokenizerLargerThanEmbedding {
                tokenizer_ids,
                embedding_rows,
            });
        }
        Ok(Engine {
            backend,
            tokenizer,
            identity,
            registry,
            context_special_tokens: false,
        })
    }

    /// Opt out of tokenizing contexts as text: with `true`, special-token text inside a
    /// context (e.g. `<|im_end|>`) becomes real control tokens, as in a plain tokenizer call.
    /// Only for trusted contexts; the default (`false`) encodes it as ordinary text.
    pub fn with_context_special_tokens(mut self, allow: bool) -> Self {
        self.context_special_tokens = allow;
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }
    pub fn identity(&self) -> &CheckpointIdentity {
        &self.identity
    }

    /// Stage 1: compile rows (once per schema; reuse for every context).
    pub fn compile(&self, schema: &Schema) -> Result<CompiledSchema, EngineError> {
        Ok(CompiledSchema::compile(schema, &self.tokenizer)?)
    }

    /// The temperature a request would use, and where it comes from.
    pub fn resolve_temperature(&self, opts: &ScoreOptions) -> Result<Temperature, EngineError> {
        Ok(self
            .registry
            .resolve(opts.temperature, opts.allow_uncalibrated, &self.identity)?)
    }

    /// Stage 2: render the prefix for `context`, split exactly, enforce the token bound.
    pub fn prepare(
        &self,
        context: &str,
        compiled: &CompiledSchema,
        max_input_tokens: usize,
    ) -> Result<PreparedContext, EngineError> {
        if max_input_tokens == 0 {
            return Err(EngineError::ZeroMaxInputTokens);
        }
        if compiled.tokenizer_identity() != self.tokenizer.identity() {
            return Err(EngineError::ForeignSchema);
        }
        if context.trim().is_empty() {
            return Err(EngineError::EmptyContext);
        }
        let t = Instant::now();
        let prefix_text =
            render_prefix(self.tokenizer.template(), context, compiled.schema_fields())?;
        let render_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let span = crate::untrusted::context_span(&prefix_text, context, compiled.schema_fields())?;
        let split = crate::untrusted::split_context(
            &self.tokenizer,
            &prefix_text,
            span,
            self.context_special_tokens,
            &compiled.selectors(),
        )?;
        let split_ms = t.elapsed().as_secs_f64() * 1e3;
        if split.input_tokens() > max_input_tokens {
            return Err(EngineError::TooManyTokens {
                prefix: split.prefix_ids.len(),
                suffix: split.longest_suffix(),
                total: split.input_tokens(),
                max: max_input_tokens,
            });
        }
        Ok(PreparedContext {
            split,
            render_ms,
            split_ms,
        })
    }

    pub(crate) fn check_options(&self, opts: &ScoreOptions) -> Result<Temperature, EngineError> {
        if opts.field_batch_size == Some(0) {
            return Err(EngineError::ZeroFieldBatch);
        }
        self.resolve_temperature(opts)
    }

    /// Score one context against a compiled schema.
    pub fn score(
        &self,
        context: &str,
        compiled: &CompiledSchema,
        opts: &ScoreOptions,
    ) -> Result<Decision, EngineError> {
        let start = Instant::now();
        let temperature = self.check_options(opts)?;
        let prepared = self.prepare(context, compiled, opts.max_input_tokens)?;
        let (mut logits, stats) = run_group(
            &self.backend,
            &[&prepared.split],
            compiled.candidates(),
            opts.mode,
            opts.field_batch_size,
        )?;
        let rows = logits.pop().unwrap_or_default();
        crate::finite::check_rows(compiled, &rows)?;
        Ok(self.finish(compiled, &prepared, rows, &stats, temperature, opts, start))
    }

    /// Score one prepared context, extending the retained `base` state (of the token prefix
    /// `base_ids`, e.g. a context shared by many schemas) when the context's prefix strictly
    /// extends it; otherwise exactly like [`Engine::score`]. Same tokens, same result.
    pub fn decide_from(
        &self,
        base: Option<(&[u32], &B::State)>,
        compiled: &CompiledSchema,
        prepared: &PreparedContext,
        opts: &ScoreOptions,
        temperature: &Temperature,
    ) -> Result<Decision, EngineError> {
        let start = Instant::now();
        if compiled.tokenizer_identity() != self.tokenizer.identity() {
            return Err(EngineError::ForeignSchema);
        }
        let (mut logits, stats) = crate::modes::run_group_from(
            &self.backend,
            base,
            &[&prepared.split],
            compiled.candidates(),
            opts.mode,
            opts.field_batch_size,
        )?;
        let rows = logits.pop().unwrap_or_default();
        crate::finite::check_rows(compiled, &rows)?;
        Ok(self.finish(
            compiled,
            prepared,
            rows,
            &stats,
            temperature.clone(),
            opts,
            start,
        ))
    }

    /// Stage 6 for one context.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish(
        &self,
        compiled: &CompiledSchema,
        prepared: &PreparedContext,
        rows: Vec<Vec<f32>>,
        stats: &crate::modes::RunStats,
        temperature: Temperature,
        opts: &ScoreOptions,
        start: Instant,
    ) -> Decision {
        let t = Instant::now();
        let (output, fields) = assemble_fields(compiled, &rows, temperature.value);
        let split = &prepared.split;
        let mut tel = telemetry(
            opts.mode,
            opts.field_batch_size,
            (
                split.prefix_ids.len(),
                split.suffix_ids.iter().map(Vec::len).collect(),
            ),
            compiled.candidates().len(),
            stats,
        );
        tel.timings_ms.render = prepared.render_ms;
        tel.timings_ms.split = prepared.split_ms;
        tel.timings_ms.assemble = t.elapsed().as_secs_f64() * 1e3;
        tel.timings_ms.total = start.elapsed().as_secs_f64() * 1e3;
        let prompt = opts.include_prompt.then(|| PromptDebug {
            prefix_text: split.prefix_text.clone(),
            prefix_ids: split.prefix_ids.clone(),
            rows: compiled
                .fields()
                .iter()
                .zip(&split.suffix_ids)
                .map(|(f, s)| RowDebug {
                    field: f.name.clone(),
                    selector: f.selector.clone(),
                    suffix_ids: s.clone(),
                    code_ids: f.code_ids.clone(),
                })
                .collect(),
            candidate_ids: compiled.candidates().to_vec(),
        });
        Decision {
            output,
            fields,
            temperature,
            telemetry: tel,
            prompt,
        }
    }
}
