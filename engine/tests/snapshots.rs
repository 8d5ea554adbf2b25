//! insta snapshots of whole results for the example schemas on the fake backend (timings
//! redacted; probabilities and logits exactly as computed — the fake backend is deterministic).

mod support;

use forkscore_engine::{Schema, ScoreOptions};
use forkscore_testkit::tokenizers::Family;

const CONTEXT: &str = "Our production payment service is completely down for every customer, and no one can complete a purchase.";

fn snapshot(schema_file: &str, family: Family, include_prompt: bool) -> serde_json::Value {
    snapshot_with(
        schema_file,
        family,
        ScoreOptions {
            include_prompt,
            ..ScoreOptions::default()
        },
    )
}

fn snapshot_with(schema_file: &str, family: Family, opts: ScoreOptions) -> serde_json::Value {
    let engine = support::fake_engine(family);
    let schema = Schema::from_json_str(&support::example(schema_file)).unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let d = engine.decide(CONTEXT, &compiled, &opts).unwrap();
    forkscore_testkit::snapshot::round_floats(&serde_json::to_value(&d).unwrap())
}

macro_rules! result_snapshot {
    ($name:ident, $file:expr, $family:expr, $prompt:expr) => {
        #[test]
        fn $name() {
            let v = snapshot($file, $family, $prompt);
            insta::assert_json_snapshot!(stringify!($name), v, { ".telemetry.timings_ms" => "[timings]" });
        }
    };
}

result_snapshot!(
    parallel_schema_qwen25,
    "parallel_schema.json",
    Family::Qwen2,
    true
);
result_snapshot!(
    parallel_schema_qwen35,
    "parallel_schema.json",
    Family::Qwen3_5,
    true
);
result_snapshot!(
    priority_defined_qwen3,
    "priority_defined_schema.json",
    Family::Qwen3,
    false
);
result_snapshot!(
    fintech_fraud_qwen25,
    "fintech_fraud.json",
    Family::Qwen2,
    false
);
result_snapshot!(
    code_security_qwen25,
    "code_security.json",
    Family::Qwen2,
    false
);
result_snapshot!(
    support_triage_qwen35,
    "support_triage.json",
    Family::Qwen3_5,
    false
);

/// `allowed_mass` on: every field carries its full-vocabulary mass and top tokens.
#[test]
fn parallel_schema_qwen25_allowed_mass() {
    let v = snapshot_with(
        "parallel_schema.json",
        Family::Qwen2,
        ScoreOptions {
            allowed_mass: Some(3),
            ..ScoreOptions::default()
        },
    );
    insta::assert_json_snapshot!("parallel_schema_qwen25_allowed_mass", v, { ".telemetry.timings_ms" => "[timings]" });
}
