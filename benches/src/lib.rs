//! forkscore benchmark harness: modes × field counts × context lengths on real-architecture
//! checkpoints (tiny seeded models by default, or `FORKSCORE_BENCH_MODEL=<folder>`), measured
//! side by side in one run and reported as ratios (see benches/benches/modes.rs).

use forkscore_backends::candle::checkpoint::ResolvedCheckpoint;
use forkscore_backends::candle::{CandleBackend, LoadOptions};
use forkscore_backends::Backend;
use forkscore_engine::{CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine, Schema};
use std::path::Path;
use std::time::Instant;

/// Load a checkpoint folder into an engine on `options`' device.
pub fn load_engine(dir: &Path, options: &LoadOptions) -> anyhow::Result<Engine<CandleBackend>> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "bench")?;
    let backend = CandleBackend::load(&ckpt, options)?;
    let tok = ChatTokenizer::for_model(dir, backend.facts().family)?;
    Ok(Engine::new(
        backend,
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )?)
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

/// Median wall time in ms of `f` over `repeats` runs after `warmup` runs.
pub fn median_ms(
    warmup: usize,
    repeats: usize,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
