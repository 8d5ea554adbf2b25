//! The autoregressive baseline: ask the same model to WRITE the answer as JSON, decode it
//! greedily token by token, parse and validate it ([`Engine::generate`]); and the same
//! context decided by forkscore in the same process for comparison ([`Engine::generate_baseline`]).
//!
//! Flow: render the generation prompt ([`prompt`], the scoring prompt's chat template with an
//! instruction to reply with one JSON object) → tokenize it (the context as text, as in
//! scoring) → prefill all prompt tokens but the last → one [`Backend::decode_step`] per token:
//! the last prompt token gives the first generated token, then every generated token is fed
//! back over the cached state (one forward each; the prompt never runs again) → stop at an EOS
//! id, when the JSON object closes ([`json::JsonScan`]: brace depth back to 0 outside strings),
//! or after `max_new_tokens` → validate the text against the schema ([`json::validate`]).
//!
//! Timings: `prefill_ms` is the prefill plus the step over the last prompt token (time to the
//! first generated token, after rendering and tokenizing: `prompt_ms`); `decode_ms` the steps
//! that feed generated tokens back; `total_ms` the whole call. `decode_tokens_per_s` = those
//! steps / `decode_ms`.

pub mod json;
pub mod prompt;

use crate::assemble::Decision;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::options::{Layout, ScoreOptions, DEFAULT_MAX_INPUT_TOKENS};
use crate::prepare::guard::{encode_guarded, special_hits};
use crate::prepare::untrusted::add_schema_hits;
use crate::rows::CompiledSchema;
use crate::schema::Field;
use crate::tokenizer::{read_checkpoint_text, ChatTokenizer, TokenizerError};
use forkscore_seam::{Backend, BackendError};
use indexmap::IndexMap;
use json::{GeneratedField, JsonScan};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use std::time::Instant;

/// Tokens allowed beyond the longest possible answer object by default (a code fence, a
/// trailing newline, spacing the model chooses).
pub const DEFAULT_SLACK_TOKENS: usize = 16;

/// How [`Engine::generate`] decodes, in words (recorded in every generation report).
pub const DECODING: &str =
    "greedy (full-vocabulary argmax, lowest id on ties), one forward per token over the cached state";

/// Largest `max_new_tokens` accepted (a bound on the loop, far above any schema's answer).
pub const MAX_NEW_TOKENS_LIMIT: usize = 65_536;

/// Why generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("tokenizing the generation prompt failed: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("the schema has no fields")]
    NoFields,
    #[error("max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {0}")]
    MaxNewTokens(usize),
    #[error("the generation prompt is {tokens} tokens, over max_input_tokens = {max}; forkscore never truncates — shorten the context or raise --max-input-tokens")]
    PromptTooLong { tokens: usize, max: usize },
    #[error("the generation prompt is {tokens} token(s); at least 2 are needed")]
    PromptTooShort { tokens: usize },
    #[error("prompt ({prompt} tokens) + max_new_tokens ({max_new}) is over the model's context limit (max_position_embeddings = {max}); lower --max-new-tokens or shorten the context")]
    OverModelLimit {
        prompt: usize,
        max_new: usize,
        max: usize,
    },
}

/// Options of [`Engine::generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerateOptions {
    /// Most tokens generated; `None`: [`default_max_new_tokens`] of the schema.
    pub max_new_tokens: Option<usize>,
    /// Longest generation prompt, in tokens (never truncated).
    pub max_input_tokens: usize,
    /// End-of-sequence ids besides the tokenizer's own (e.g. [`eos_ids_from_folder`]).
    pub eos_ids: Vec<u32>,
    /// Keep the rendered prompt text in the result.
    pub include_prompt: bool,
    /// Where the context sits in the prompt (as the scoring prompt of the same layout).
    pub layout: Layout,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: None,
            max_input_tokens: DEFAULT_MAX_INPUT_TOKENS,
            eos_ids: Vec::new(),
            include_prompt: false,
            layout: Layout::ContextFirst,
        }
    }
}

/// Why decoding stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum StopReason {
    /// The model produced an end-of-sequence id (counted in `generated_tokens`, not in the text).
    Eos,
    /// The JSON object closed (brace depth back to 0 outside strings).
    ClosingBrace,
    /// `max_new_tokens` tokens were generated.
    MaxNewTokens,
}

/// Wall times of one generation, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GenerateTimings {
    /// Rendering and tokenizing the prompt.
    pub prompt_ms: f64,
    /// Prefill of the prompt and the step over its last token (to the first generated token).
    pub prefill_ms: f64,
    /// Every later step (one forward per generated token fed back).
    pub decode_ms: f64,
    /// Decoding the text and validating it.
    pub validate_ms: f64,
    /// The whole call.
    pub total_ms: f64,
}

/// One greedy generation and its validation.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Generation {
    /// The generated text (an EOS token excluded).
    pub text: String,
    /// See [`json::Validation::valid`].
    pub valid: bool,
    /// The problems found, joined (`null` when valid).
    pub reason: Option<String>,
    pub problems: Vec<String>,
    /// Per field, in schema order: the generated value and whether it is allowed.
    pub fields: IndexMap<String, GeneratedField>,
    pub stop_reason: StopReason,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub max_new_tokens: usize,
    /// The generated ids, in order (an EOS id included).
    pub token_ids: Vec<u32>,
    /// The ids that stop decoding.
    pub eos_ids: Vec<u32>,
    /// Backend calls: one prefill and one decode step per token fed (the last prompt token and
    /// every generated token but the last).
    pub prefill_calls: usize,
    pub decode_steps: usize,
    pub timings_ms: GenerateTimings,
    /// Decode steps after the first generated token per second of `decode_ms` (`null` with none).
    pub decode_tokens_per_s: Option<f64>,
    /// The rendered prompt, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// A field's generated value against forkscore's decision.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldAgreement {
    pub generated: Option<Value>,
    pub forkscore: Value,
    /// True when the generated value is valid and equal to forkscore's.
    pub agree: bool,
}

/// Per-field agreement of the two answers.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Agreement {
    pub fields: IndexMap<String, FieldAgreement>,
    pub agree: usize,
    pub disagree: usize,
}

/// forkscore's side of a comparison.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkscoreSide {
    pub output: IndexMap<String, Value>,
    /// Wall time of `Engine::decide` on the same context and schema.
    pub total_ms: f64,
    pub input_tokens: usize,
    pub prefill_calls: usize,
    pub score_calls: usize,
}

/// [`Engine::generate_baseline`]: the generation, forkscore's decision, their agreement.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Baseline {
    pub generation: Generation,
    pub forkscore: ForkscoreSide,
    pub agreement: Agreement,
    /// `generation.timings_ms.total_ms / forkscore.total_ms`: how many times faster forkscore was.
    pub speedup: f64,
}

/// Compare a generation with forkscore's decision on the same context and schema.
pub fn agreement(generation: &Generation, decision: &Decision) -> Agreement {
    let mut fields = IndexMap::new();
    let (mut agree, mut disagree) = (0, 0);
    for (name, forkscore) in &decision.output {
        let generated = generation.fields.get(name);
        let same = generated.is_some_and(|g| g.valid && g.value.as_ref() == Some(forkscore));
        if same {
            agree += 1;
        } else {
            disagree += 1;
        }
        fields.insert(
            name.clone(),
            FieldAgreement {
                generated: generated.and_then(|g| g.value.clone()),
                forkscore: forkscore.clone(),
                agree: same,
            },
        );
    }
    Agreement {
        fields,
        agree,
        disagree,
    }
}

/// The default `max_new_tokens` of a schema: the tokens of the longest answer object —
/// pretty-printed (two-space indent), each field with the choice whose JSON text takes the most
/// tokens — plus [`DEFAULT_SLACK_TOKENS`].
pub fn default_max_new_tokens(
    tokenizer: &ChatTokenizer,
    fields: &[Field],
) -> Result<usize, TokenizerError> {
    let mut object = String::from("{\n");
    for (i, f) in fields.iter().enumerate() {
        let mut longest = (0, String::new());
        for c in &f.choices {
            let text = c.to_json().to_string();
            let n = tokenizer.encode(&text)?.len();
            if n > longest.0 {
                longest = (n, text);
            }
        }
        let key = Value::String(f.name.clone()).to_string();
        let sep = if i + 1 < fields.len() { "," } else { "" };
        object.push_str(&format!("  {key}: {}{sep}\n", longest.1));
    }
    object.push('}');
    Ok(tokenizer.encode(&object)?.len() + DEFAULT_SLACK_TOKENS)
}

/// `eos_token_id` (an id or a list of ids) of the checkpoint's `generation_config.json` and
/// `config.json`, in that order, deduplicated; missing or unreadable files give nothing (the
/// tokenizer's own end tokens still apply). Files are read bounded, regular files only.
pub fn eos_ids_from_folder(dir: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for name in ["generation_config.json", "config.json"] {
        let text = read_checkpoint_text(&dir.join(name), forkscore_seam::files::MAX_CONFIG_BYTES)
            .ok()
            .flatten();
        let Some(value) = text.and_then(|t| serde_json::from_str::<Value>(&t).ok()) else {
            continue;
        };
        let ids: Vec<u32> = match value.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().into_iter().collect(),
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_u64).collect(),
            _ => Vec::new(),
        }
        .into_iter()
        .filter_map(|id| u32::try_from(id).ok())
        .collect();
        for id in ids {
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
    out
}

/// The tokenizer's own end ids: the template's `eos_token` and `<|im_end|>` (the end of turn of
/// the chat templates forkscore renders), where the tokenizer has them.
pub fn tokenizer_eos_ids(tokenizer: &ChatTokenizer) -> Vec<u32> {
    let mut out = Vec::new();
    for t in [tokenizer.template().eos_token(), Some("<|im_end|>")]
        .into_iter()
        .flatten()
    {
        if let Some(id) = tokenizer.token_id(t) {
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
    out
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl<B: Backend> Engine<B> {
    /// Generate the answer for `context` greedily and validate it (see the module docs).
    pub fn generate(
        &self,
        context: &str,
        fields: &[Field],
        opts: &GenerateOptions,
    ) -> Result<Generation, GenerateError> {
        let start = Instant::now();
        if fields.is_empty() {
            return Err(GenerateError::NoFields);
        }
        if opts.max_input_tokens == 0 {
            return Err(EngineError::ZeroMaxInputTokens.into());
        }
        if context.trim().is_empty() {
            return Err(EngineError::EmptyContext.into());
        }
        let tok = self.tokenizer();
        let max_new = match opts.max_new_tokens {
            Some(n) => n,
            None => default_max_new_tokens(tok, fields)?,
        };
        if max_new == 0 || max_new > MAX_NEW_TOKENS_LIMIT {
            return Err(GenerateError::MaxNewTokens(max_new));
        }
        // prompt: render, find the context, tokenize it as text (as scoring does)
        let text = prompt::render(tok.template(), context, fields, opts.layout)
            .map_err(EngineError::from)?;
        let (message, offset) = prompt::user_message_in(context, fields, opts.layout);
        let span = match text.find(&message) {
            Some(at) => at + offset,
            None => text.find(context).ok_or(EngineError::ContextNotInPrompt)?,
        };
        let span = span..span + context.len();
        let mut hits = if self.context_special_tokens() {
            Vec::new()
        } else {
            special_hits(tok, &text, &span)
        };
        // the schema's text is tokenized as text too, always (as in scoring)
        let schema = prompt::schema_text(fields, opts.layout);
        add_schema_hits(tok, &text, &span, opts.layout, &schema, &mut hits)
            .map_err(EngineError::from)?;
        let ids = encode_guarded(tok, &text, &hits)?;
        let n = ids.len();
        if n > opts.max_input_tokens {
            return Err(GenerateError::PromptTooLong {
                tokens: n,
                max: opts.max_input_tokens,
            });
        }
        if n < 2 {
            return Err(GenerateError::PromptTooShort { tokens: n });
        }
        if let Some(max) = self.backend().facts().max_positions {
            if n + max_new > max {
                return Err(GenerateError::OverModelLimit {
                    prompt: n,
                    max_new,
                    max,
                });
            }
        }
        let mut eos_ids = tokenizer_eos_ids(tok);
        for &id in &opts.eos_ids {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let prompt_ms = ms(start);

        // prefill all prompt tokens but the last; the step over the last gives token 1
        let t = Instant::now();
        let backend = self.backend();
        let state = backend.prefill(&ids[..n - 1])?;
        let mut step = backend.decode_step(&state, ids[n - 1])?;
        drop(state);
        let prefill_ms = ms(t);
        let mut decode_steps = 1;

        let t = Instant::now();
        let mut generated: Vec<u32> = Vec::new();
        let mut scan = JsonScan::default();
        let stop = loop {
            let token = step.next;
            generated.push(token);
            if eos_ids.contains(&token) {
                break StopReason::Eos;
            }
            if scan.feed(&tok.decode(&[token])?) {
                break StopReason::ClosingBrace;
            }
            if generated.len() >= max_new {
                break StopReason::MaxNewTokens;
            }
            step = backend.decode_step(&step.state, token)?;
            decode_steps += 1;
        };
        let decode_ms = ms(t);

        let t = Instant::now();
        let text_ids = match stop {
            StopReason::Eos => &generated[..generated.len() - 1],
            _ => &generated[..],
        };
        let generated_text = tok.decode(text_ids)?;
        let validation = json::validate(&generated_text, fields);
        let validate_ms = ms(t);
        let later_steps = decode_steps - 1;
        Ok(Generation {
            text: generated_text,
            valid: validation.valid,
            reason: (!validation.valid).then(|| validation.problems.join("; ")),
            problems: validation.problems,
            fields: validation.fields,
            stop_reason: stop,
            prompt_tokens: n,
            generated_tokens: generated.len(),
            max_new_tokens: max_new,
            token_ids: generated,
            eos_ids,
            prefill_calls: 1,
            decode_steps,
            decode_tokens_per_s: (later_steps > 0 && decode_ms > 0.0)
                .then(|| later_steps as f64 / (decode_ms / 1e3)),
            timings_ms: GenerateTimings {
                prompt_ms,
                prefill_ms,
                decode_ms,
                validate_ms,
                total_ms: ms(start),
            },
            prompt: opts.include_prompt.then_some(text),
        })
    }

    /// Decide `context` with forkscore (`Engine::decide`, timed), then generate the answer
    /// ([`Engine::generate`]) in the same process, and compare them. forkscore runs first, so
    /// any one-time warm-up cost of the process falls on it, not on the baseline.
    pub fn generate_baseline(
        &self,
        context: &str,
        compiled: &CompiledSchema,
        score: &ScoreOptions,
        opts: &GenerateOptions,
    ) -> Result<Baseline, GenerateError> {
        let t = Instant::now();
        let decision = self.decide(context, compiled, score)?;
        let forkscore_ms = ms(t);
        let generation = self.generate(context, compiled.schema_fields(), opts)?;
        let agreement = agreement(&generation, &decision);
        let tel = &decision.telemetry;
        Ok(Baseline {
            speedup: generation.timings_ms.total_ms / forkscore_ms,
            forkscore: ForkscoreSide {
                output: decision.output.clone(),
                total_ms: forkscore_ms,
                input_tokens: tel.input_tokens,
                prefill_calls: tel.prefill_calls,
                score_calls: tel.score_calls,
            },
            generation,
            agreement,
        })
    }
}
