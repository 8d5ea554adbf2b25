//! The library API exactly as docs/cli.md shows it, on a tiny checkpoint (keeps that page true).

use forkscore_backends::candle::{CandleBackend, LoadOptions, ResolvedCheckpoint};
use forkscore_backends::Backend;
use forkscore_engine::group::GroupBudget;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine, Schema, ScoreOptions,
};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};

#[test]
fn readme_library_example_runs() -> anyhow::Result<()> {
    let dir = ensure_tiny_model(&TinySpec::qwen25());
    let ckpt = ResolvedCheckpoint::resolve(dir.to_str().unwrap(), "my-label")?;
    let backend = CandleBackend::load(&ckpt, &LoadOptions::default())?;
    let tokenizer = ChatTokenizer::for_model(&ckpt.dir, backend.facts().family)?;
    let identity = CheckpointIdentity {
        model_id: Some(ckpt.model_id.clone()),
        revision: Some(ckpt.revision.clone()),
        adapter_sha256: None,
    };
    let engine = Engine::new(
        backend,
        tokenizer,
        identity,
        CalibrationRegistry::built_in(),
    )?;
    let path = format!(
        "{}/../fixtures/examples/parallel_schema.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let schema = Schema::from_json_str(&std::fs::read_to_string(path)?)?;
    let compiled = engine.compile(&schema)?;
    let decision = engine.decide(
        "The payment service is down for all customers.",
        &compiled,
        &ScoreOptions::default(),
    )?;
    assert_eq!(decision.output.len(), 3);
    let results = engine.decide_many(
        &["ctx one", "ctx two"],
        &compiled,
        &ScoreOptions::default(),
        &GroupBudget::default(),
    );
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(Result::is_ok));
    Ok(())
}
