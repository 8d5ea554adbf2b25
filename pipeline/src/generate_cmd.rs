//! `forkscore generate`: the autoregressive baseline. The model is prompted to WRITE the JSON
//! answer for the schema, decoded greedily with a KV cache (one forward per token), and the
//! text is validated against the schema; forkscore decides the same context in the same
//! process, and the JSON report on stdout compares the two (values, agreement, times, speed-up).
//! Same model / schema / context / scoring flags as `forkscore score`.

use crate::load;
use crate::score_cmd::ScoreArgs;
use anyhow::{bail, Context, Result};
use forkscore_engine::generate::eos_ids_from_folder;
use forkscore_engine::GenerateOptions;
use forkscore_frontend::result::{decision_provenance, result_json, Layout};

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub score: ScoreArgs,
    /// Most tokens to generate (default: the tokens of the schema's longest answer object,
    /// pretty-printed, plus 16).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    let s = &args.score;
    let Some(schema) = s.schema.load()? else {
        bail!("give a schema with --schema-file FILE or --schema JSON")
    };
    crate::score_cmd::precheck_score(s)?;
    crate::input_bounds::check_flags(&[("--max-new-tokens", args.max_new_tokens)])?;
    let Some(context) = s.context.read(s.scoring.max_input_tokens)? else {
        bail!("give a context with --context TEXT or --context-file FILE")
    };
    let score_opts = s.scoring.options();
    let loaded = load::open(&s.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(s.scoring.context_special_tokens);
    let compiled = engine.compile_within(&schema, score_opts.max_input_tokens)?;
    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        max_input_tokens: s.scoring.max_input_tokens,
        eos_ids: eos_ids_from_folder(&engine.backend().checkpoint().dir),
        include_prompt: s.scoring.include_prompt,
        layout: score_opts.layout,
    };
    // Warm-up, untimed: the first decision and the first decode steps of a process pay one-time
    // set-up (GPU kernel modules, cuBLAS handles, allocator growth), which would otherwise be
    // charged to whichever side runs first. One decision and a 2-token generation run first.
    engine.decide(&context, &compiled, &score_opts)?;
    let warm = GenerateOptions {
        max_new_tokens: Some(2),
        ..opts.clone()
    };
    engine.generate(&context, compiled.schema_fields(), &warm)?;
    let baseline = engine.generate_baseline(&context, &compiled, &score_opts, &opts)?;
    let decision_temperature = engine.resolve_temperature(&score_opts)?;
    let provenance = decision_provenance(
        &loaded.provenance.object()?,
        &score_opts,
        &decision_temperature,
        compiled.schema_hash(),
    );
    let layout = Layout {
        record: None,
        extra: vec![
            ("decoding", forkscore_engine::generate::DECODING.into()),
            (
                "warmup",
                serde_json::json!(
                    "one untimed decision and one untimed 2-token generation ran before the timed pair"
                ),
            ),
        ],
    };
    let value = result_json(&baseline, layout, provenance);
    let text = serde_json::to_string_pretty(&value)?;
    if let Some(path) = &s.output {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{text}");
    Ok(())
}
