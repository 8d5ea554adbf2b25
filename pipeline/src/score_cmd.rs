//! `forkscore score`: one context + one schema → one decision as JSON on stdout.

use crate::input_bounds::{check_flags, check_float_flag, check_output_dir};
use crate::load::{self, ModelArgs};
use anyhow::{bail, Context, Result};
use forkscore_engine::schema::Scoring;
use forkscore_engine::{
    Layout, LiteralValue, Mode, Schema, ScoreOptions, DEFAULT_MAX_INPUT_TOKENS,
};
use forkscore_frontend::result::decision_json;
use std::path::PathBuf;

/// Schema source: a file or inline JSON.
#[derive(Debug, Clone, clap::Args)]
pub struct SchemaArgs {
    /// Schema JSON file (flat form or JSON Schema form).
    #[arg(long, conflicts_with = "schema")]
    pub schema_file: Option<PathBuf>,
    /// Inline schema JSON.
    #[arg(long)]
    pub schema: Option<String>,
    /// How the fields of this schema that name no `scoring` (and whose schema root names
    /// none) are scored: code (default), literal, literal-first-token, literal-sum-loglik,
    /// literal-mean-loglik or json (the generation baseline's prompt, every field's JSON value
    /// scored as written). Applies to --schema / --schema-file, not to batch lines' own schemas.
    #[arg(long, default_value = "code")]
    pub scoring: Scoring,
}

impl SchemaArgs {
    /// Read and validate the schema (duplicate keys rejected).
    pub fn load(&self) -> Result<Option<Schema>> {
        let (text, origin) = match (&self.schema_file, &self.schema) {
            (Some(path), _) => (
                crate::input_bounds::read_schema_file(path)?,
                path.display().to_string(),
            ),
            (None, Some(inline)) => (inline.clone(), "--schema".to_string()),
            (None, None) => return Ok(None),
        };
        Schema::from_json_str_with(&text, self.scoring)
            .map(Some)
            .with_context(|| format!("invalid schema ({origin})"))
    }
}

/// Context source: inline text or a file (`-` = standard input).
#[derive(Debug, Clone, clap::Args)]
pub struct ContextArgs {
    /// The context to classify.
    #[arg(long, conflicts_with = "context_file")]
    pub context: Option<String>,
    /// Read the context from a file (UTF-8); `-` reads standard input.
    #[arg(long)]
    pub context_file: Option<PathBuf>,
}

impl ContextArgs {
    /// The context text, if one was given: refused by byte length (the bound of
    /// `max_input_tokens`) before anything tokenizes it; a file or stdin is read only up to it.
    pub fn read(&self, max_input_tokens: usize) -> Result<Option<String>> {
        use crate::input_bounds::{check_context_len, read_context_file};
        Ok(match (&self.context, &self.context_file) {
            (Some(c), _) => {
                check_context_len(c, max_input_tokens)?;
                Some(c.clone())
            }
            (None, Some(path)) => Some(read_context_file(path, max_input_tokens)?),
            (None, None) => None,
        })
    }
}

/// Request-side options shared by `score` and `batch`.
#[derive(Debug, Clone, clap::Args)]
pub struct ScoringArgs {
    /// parallel (default), cached-serial, independent (the reference path) or tree (every code
    /// row in one token-tree call, packed under a tree mask on attention-only models).
    #[arg(long, default_value = "parallel")]
    pub mode: Mode,
    /// In parallel mode, score at most this many rows per call (still one prefill).
    #[arg(long)]
    pub field_batch_size: Option<usize>,
    /// Probability temperature; unspecified = the checkpoint's calibrated default, else 1.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Allow an explicit --temperature 1 on a checkpoint that has a calibrated default.
    #[arg(long)]
    pub allow_uncalibrated: bool,
    /// Reject prompts longer than this (prefix + longest field suffix); never truncates.
    #[arg(long, default_value_t = DEFAULT_MAX_INPUT_TOKENS)]
    pub max_input_tokens: usize,
    /// Add the rendered prompt, prefix ids, each row's suffix ids and the candidate ids.
    #[arg(long)]
    pub include_prompt: bool,
    /// Trust the contexts: special-token text in them (e.g. `<|im_end|>`) becomes real control
    /// tokens. By default it is tokenized as ordinary text, so a context cannot forge chat turns.
    #[arg(long)]
    pub context_special_tokens: bool,
    /// Per field, also the full-vocabulary probability mass on its allowed codes at its
    /// decision position and the top-K unconstrained tokens there (`fields.<name>.allowed_mass`).
    #[arg(long)]
    pub allowed_mass: bool,
    /// With --allowed-mass: how many unconstrained tokens to list per field (0 to 1024).
    #[arg(long, default_value_t = 5, requires = "allowed_mass")]
    pub top_k: usize,
    /// How a literal-scored field's value is selected: argmax (default: the choice with the
    /// largest reported probability) or greedy (the constrained greedy decoder's choice, for
    /// `literal` and `literal-first-token`).
    #[arg(long, default_value = "argmax")]
    pub literal_value: LiteralValue,
    /// Where the context sits in the prompt: context-first (default: the context, then the
    /// catalogue of fields) or fields-first (the catalogue first, so that grouped decisions —
    /// batch jobs, `serve` — prefill the instructions and the whole catalogue once and each
    /// context only its own tokens; a different prompt, so decisions differ — measure accuracy
    /// with `forkscore eval` first: on a small real model it cost much of it).
    #[arg(long, default_value = "context-first")]
    pub layout: Layout,
}

impl ScoringArgs {
    pub fn options(&self) -> ScoreOptions {
        ScoreOptions {
            mode: self.mode,
            field_batch_size: self.field_batch_size,
            temperature: self.temperature,
            allow_uncalibrated: self.allow_uncalibrated,
            max_input_tokens: self.max_input_tokens,
            include_prompt: self.include_prompt,
            allowed_mass: self.allowed_mass.then_some(self.top_k),
            literal_value: self.literal_value,
            layout: self.layout,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub schema: SchemaArgs,
    #[command(flatten)]
    pub context: ContextArgs,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    /// Also write the result JSON to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Checks of `forkscore score` arguments that need no model.
pub fn precheck_score(args: &ScoreArgs) -> Result<()> {
    check_flags(&[
        ("--max-input-tokens", Some(args.scoring.max_input_tokens)),
        ("--field-batch-size", args.scoring.field_batch_size),
        ("--prefill-chunk", args.model.prefill_chunk),
        ("--top-k", Some(args.scoring.top_k)),
    ])?;
    check_float_flag("--temperature", args.scoring.temperature, 1e6)?;
    if let Some(out) = &args.output {
        check_output_dir("--output", out)?;
    }
    Ok(())
}

pub fn run(args: &ScoreArgs) -> Result<()> {
    let Some(schema) = args.schema.load()? else {
        bail!("give a schema with --schema-file FILE or --schema JSON")
    };
    precheck_score(args)?;
    let Some(context) = args.context.read(args.scoring.max_input_tokens)? else {
        bail!("give a context with --context TEXT or --context-file FILE")
    };
    let opts = args.scoring.options();
    let loaded = load::open(&args.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(args.scoring.context_special_tokens);
    let compiled = engine.compile_within(&schema, opts.max_input_tokens)?;
    let decision = engine.decide(&context, &compiled, &opts)?;
    let value = decision_json(&decision, &compiled, &opts, &loaded.provenance.object()?);
    let text = serde_json::to_string_pretty(&value)?;
    if let Some(path) = &args.output {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{text}");
    Ok(())
}
