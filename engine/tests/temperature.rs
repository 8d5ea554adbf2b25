//! Temperature policy, one test per case of the policy in `engine::calibration` (unspecified,
//! calibrated default, explicit values, refusals), through the engine so the value used and its
//! source land in the result.

mod support;

use forkscore_engine::calibration::CalibrationError;
use forkscore_engine::{
    CalibrationRegistry, CheckpointIdentity, EngineError, Schema, ScoreOptions, TemperatureSource,
};
use forkscore_testkit::tokenizers::Family;

const V1: &str = "bespokelabs/Bespoke-Nimble-9B";
const V1_REV: &str = "93ec5d6ff1a9cd31d6cc0e0c58d312465d36de7c";
const V2: &str = "bespokelabs/Bespoke-Nimble-9B-v2";

fn id(model: &str, rev: &str) -> CheckpointIdentity {
    CheckpointIdentity {
        model_id: Some(model.into()),
        revision: Some(rev.into()),
        adapter_sha256: None,
    }
}

fn registry() -> CalibrationRegistry {
    CalibrationRegistry::built_in()
}

#[test]
fn full_hash_of_v1_uses_its_fitted_temperature() {
    let t = registry().resolve(None, false, &id(V1, V1_REV)).unwrap();
    assert_eq!(t.value, 2.179);
    assert!(matches!(t.source, TemperatureSource::Calibrated { .. }));
}

#[test]
fn short_hash_never_matches() {
    let t = registry().resolve(None, false, &id(V1, "93ec5d6")).unwrap();
    assert_eq!((t.value, t.source), (1.0, TemperatureSource::Default));
    // An explicit 1.0 is then allowed: there is no calibrated default to bypass.
    assert_eq!(
        registry()
            .resolve(Some(1.0), false, &id(V1, "93ec5d6"))
            .unwrap()
            .value,
        1.0
    );
    // Another full revision of v1 is not calibrated either.
    let other = registry()
        .resolve(None, false, &id(V1, &"0".repeat(40)))
        .unwrap();
    assert_eq!(other.value, 1.0);
}

#[test]
fn v2_by_id_uses_its_default_at_any_revision() {
    for rev in [
        "main",
        "abc1234",
        "1111111111111111111111111111111111111111",
    ] {
        let t = registry().resolve(None, false, &id(V2, rev)).unwrap();
        assert_eq!(t.value, 2.179078721266035, "revision {rev}");
    }
}

#[test]
fn v2_adapter_digest_from_ready_json_selects_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let digest = "ab".repeat(32);
    let cal = dir.path().join("cal.json");
    std::fs::write(
        &cal,
        serde_json::json!({"entries": [{"model_id": V2, "revision": null, "adapter_sha256": [digest], "temperature": 2.179078721266035}]}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("READY.json"),
        serde_json::json!({"adapter_sha256": digest}).to_string(),
    )
    .unwrap();
    let mut reg = registry();
    reg.extend_from_file(&cal).unwrap();
    let adapter = forkscore_engine::calibration::adapter_sha256_from_ready(dir.path());
    assert_eq!(adapter.as_deref(), Some(digest.as_str()));
    let local = CheckpointIdentity {
        model_id: Some("/models/merged".into()),
        revision: Some("local".into()),
        adapter_sha256: adapter,
    };
    assert_eq!(
        reg.resolve(None, false, &local).unwrap().value,
        2.179078721266035
    );
}

#[test]
fn explicit_one_on_a_calibrated_checkpoint_needs_allow_uncalibrated() {
    let err = registry()
        .resolve(Some(1.0), false, &id(V2, "x"))
        .unwrap_err();
    assert!(matches!(err, CalibrationError::UncalibratedRefused { .. }));
    assert!(err.to_string().contains("--allow-uncalibrated"), "{err}");
    let t = registry().resolve(Some(1.0), true, &id(V2, "x")).unwrap();
    assert_eq!((t.value, t.source), (1.0, TemperatureSource::Explicit));
    let err = registry()
        .resolve(Some(1.0), false, &id(V1, V1_REV))
        .unwrap_err();
    assert!(matches!(err, CalibrationError::UncalibratedRefused { .. }));
    // Other explicit values are fine; non-positive ones are not.
    assert_eq!(
        registry()
            .resolve(Some(0.5), false, &id(V2, "x"))
            .unwrap()
            .value,
        0.5
    );
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            registry().resolve(Some(bad), false, &id(V2, "x")),
            Err(CalibrationError::NotPositive { .. })
        ));
    }
}

#[test]
fn temperature_scales_probabilities_but_never_logits_or_selection() {
    let schema = Schema::from_json_str(&support::example("parallel_schema.json")).unwrap();
    let calibrated = support::fake_engine_with(Family::Qwen2, id(V2, "any"), 3);
    let plain = support::fake_engine_with(Family::Qwen2, CheckpointIdentity::default(), 3);
    let compiled = calibrated.compile(&schema).unwrap();
    let ctx = "The payment service is down for all customers.";
    let hot = calibrated
        .decide(ctx, &compiled, &ScoreOptions::default())
        .unwrap();
    let raw = plain
        .decide(ctx, &compiled, &ScoreOptions::default())
        .unwrap();
    assert_eq!(hot.temperature.value, 2.179078721266035);
    assert_eq!(raw.temperature.source, TemperatureSource::Default);
    assert_eq!(hot.output, raw.output);
    for (h, r) in hot.fields.values().zip(raw.fields.values()) {
        assert_eq!(h.logits, r.logits);
        let scaled = forkscore_engine::assemble::softmax_scaled(
            &r.logits.values().copied().collect::<Vec<_>>(),
            2.179078721266035,
        );
        assert_eq!(h.scores.values().copied().collect::<Vec<_>>(), scaled);
    }
    let refused = calibrated.decide(
        ctx,
        &compiled,
        &ScoreOptions {
            temperature: Some(1.0),
            ..ScoreOptions::default()
        },
    );
    assert!(matches!(
        refused,
        Err(EngineError::Calibration(
            CalibrationError::UncalibratedRefused { .. }
        ))
    ));
}

#[test]
fn bad_calibration_files_are_rejected_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.json");
    for (text, needle) in [
        ("{", "EOF"),
        (
            r#"{"entries": [{"model_id": "m", "revision": "abc", "temperature": 2}]}"#,
            "40 hex",
        ),
        (
            r#"{"entries": [{"model_id": "m", "temperature": -2}]}"#,
            "temperature",
        ),
        (
            r#"{"entries": [{"model_id": "m", "adapter_sha256": ["xyz"], "temperature": 2}]}"#,
            "64 hex",
        ),
    ] {
        std::fs::write(&p, text).unwrap();
        let err = registry().extend_from_file(&p).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
}
