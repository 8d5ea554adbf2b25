//! forkscore benchmark harness: modes × field counts × context lengths on real-architecture
//! checkpoints (tiny seeded models by default, or `FORKSCORE_BENCH_MODEL=<folder>`), measured
//! side by side in one run and reported as ratios (see benches/benches/modes.rs).

use forkscore_backends::candle::checkpoint::ResolvedCheckpoint;
use forkscore_backends::candle::{CandleBackend, LoadOptions};
use forkscore_backends::Backend;
use forkscore_engine::assemble::{argmax_first, StageTimings};
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, CompiledSchema, Decision, Engine,
    Schema,
};
use std::path::Path;

/// Load a checkpoint folder into an engine on `options`' device.
pub fn load_engine(dir: &Path, options: &LoadOptions) -> anyhow::Result<Engine<CandleBackend>> {
    load_engine_with(dir, options, |t| t)
}

/// [`load_engine`] with the tokenizer passed through `tokenizer` first (e.g. to pick its encoder).
pub fn load_engine_with(
    dir: &Path,
    options: &LoadOptions,
    tokenizer: impl FnOnce(ChatTokenizer) -> ChatTokenizer,
) -> anyhow::Result<Engine<CandleBackend>> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "bench")?;
    let backend = CandleBackend::load(&ckpt, options)?;
    let tok = tokenizer(
        ChatTokenizer::for_model(dir, backend.facts().family)?.with_fast_encoder(
            !forkscore_backends::switches::is("FORKSCORE_TOKENIZER", "reference"),
        ),
    );
    Ok(Engine::new(
        backend,
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )?
    .with_shared_head(!forkscore_backends::switches::is(
        "FORKSCORE_SHARED_HEAD",
        "off",
    )))
}

/// The first `n` fields of the 28-field support-triage preset, as a schema.
pub fn triage_subset(n: usize) -> anyhow::Result<Schema> {
    let text = include_str!("../../fixtures/examples/support_triage.json");
    let all: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)?;
    let sub: serde_json::Map<String, serde_json::Value> = all.into_iter().take(n).collect();
    Ok(Schema::from_value(&serde_json::Value::Object(sub))?)
}

/// A support-ticket context of roughly `words` words.
pub fn context_of(words: usize) -> String {
    let base = "Customer reports that the checkout API returns 502 errors for every enterprise account since the last deploy; \
                they cannot bill their own customers and threaten to cancel the contract unless it is fixed today. ";
    let mut out = String::new();
    while out.split_whitespace().count() < words {
        out.push_str(base);
    }
    out
}

/// Per stage, the median over `runs` (JSON object: render, split, prefill, score, assemble, total).
pub fn median_stages(runs: &[StageTimings]) -> serde_json::Value {
    let median = |get: fn(&StageTimings) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(get).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    serde_json::json!({
        "render": median(|t| t.render), "split": median(|t| t.split),
        "prefill": median(|t| t.prefill), "score": median(|t| t.score),
        "assemble": median(|t| t.assemble), "total": median(|t| t.total),
    })
}

/// What the model was fed for one case and what it answered, for a peer to score the same ids:
/// `prefix_ids`, `candidate_ids`, and per row `field`, `suffix_ids`, `code_ids` (choice order),
/// `logits` (the raw candidate logits at the row's code ids) and `argmax_code_id`.
/// `decision` must come from a score call with `include_prompt`.
pub fn case_dump(
    compiled: &CompiledSchema,
    decision: &Decision,
) -> anyhow::Result<serde_json::Value> {
    let prompt = decision
        .prompt
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("case_dump needs a decision scored with include_prompt"))?;
    let rows: Vec<serde_json::Value> = compiled
        .fields()
        .iter()
        .zip(&prompt.rows)
        .map(|(f, row)| {
            let logits: Vec<f32> = decision.fields[&f.name].logits.values().copied().collect();
            serde_json::json!({
                "field": f.name, "suffix_ids": row.suffix_ids, "code_ids": row.code_ids,
                "logits": logits, "argmax_code_id": f.code_ids[argmax_first(&logits)],
            })
        })
        .collect();
    Ok(serde_json::json!({
        "prefix_tokens": prompt.prefix_ids.len(), "prefix_ids": prompt.prefix_ids,
        "candidate_ids": prompt.candidate_ids, "rows": rows,
    }))
}

/// The environment variable `name`, or `default` when unset.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The median of `v` (the upper one of an even count; NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Write `doc` as pretty JSON to `FORKSCORE_BENCH_OUT`, else to `default`, creating its folder;
/// prints where it went.
pub fn write_report(default: &str, doc: &serde_json::Value) -> anyhow::Result<()> {
    use anyhow::Context;
    let out = std::env::var("FORKSCORE_BENCH_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::PathBuf::from(default));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(doc)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}
