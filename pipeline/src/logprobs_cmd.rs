//! `forkscore logprobs`: the per-token log-probabilities of a text under a model, with the
//! top-K alternatives at every position, as JSON on stdout (see `Engine::logprobs`).

use crate::input_bounds::{check_flags, check_text_len, read_text_file};
use crate::load::{self, ModelArgs};
use anyhow::{bail, Context, Result};
use forkscore_engine::{LogprobOptions, DEFAULT_MAX_INPUT_TOKENS};
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct LogprobsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (tokenized as is, without a chat template).
    #[arg(long, conflicts_with = "text_file")]
    pub text: Option<String>,
    /// Read the text from a file (UTF-8); `-` reads standard input.
    #[arg(long)]
    pub text_file: Option<PathBuf>,
    /// Alternatives listed per position (0 to 1024).
    #[arg(long, default_value_t = 5)]
    pub top_k: usize,
    /// Refuse texts longer than this many tokens; never truncates.
    #[arg(long, default_value_t = DEFAULT_MAX_INPUT_TOKENS)]
    pub max_input_tokens: usize,
    /// Trust the text: special-token text in it (e.g. `<|im_end|>`) becomes real control
    /// tokens. By default it is tokenized as ordinary text.
    #[arg(long)]
    pub special_tokens: bool,
    /// Also write the result JSON to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

pub fn run(args: &LogprobsArgs) -> Result<()> {
    check_flags(&[
        ("--max-input-tokens", Some(args.max_input_tokens)),
        ("--prefill-chunk", args.model.prefill_chunk),
        ("--top-k", Some(args.top_k)),
    ])?;
    if let Some(out) = &args.output {
        crate::input_bounds::check_output_dir("--output", out)?;
    }
    let text = match (&args.text, &args.text_file) {
        (Some(t), _) => {
            check_text_len(t, "text", args.max_input_tokens)?;
            t.clone()
        }
        (None, Some(path)) => read_text_file(path, "text", args.max_input_tokens)?,
        (None, None) => bail!("give a text with --text TEXT or --text-file FILE"),
    };
    if text.is_empty() {
        bail!("the text is empty: there are no tokens to score");
    }
    let loaded = load::open(&args.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(args.special_tokens);
    let result = engine.logprobs(
        &text,
        &LogprobOptions {
            top_k: args.top_k,
            max_input_tokens: args.max_input_tokens,
        },
    )?;
    let mut value = serde_json::to_value(&result)?;
    value["provenance"] = json!({
        "model": loaded.provenance,
        "special_tokens_as_text": !args.special_tokens,
    });
    let text = serde_json::to_string_pretty(&value)?;
    if let Some(path) = &args.output {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{text}");
    Ok(())
}
