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

/// softmax(x / t − shift) in f64.
fn calibrated(logits: &[f32], t: f64, shift: &[f64]) -> Vec<f64> {
    let z: Vec<f64> = logits
        .iter()
        .zip(shift)
        .map(|(&l, b)| f64::from(l) / t - b)
        .collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

#[test]
fn per_field_calibrations_apply_to_their_fields_and_are_named_in_provenance() {
    use forkscore_engine::Engine;
    let schema = Schema::from_json_str(&support::example("parallel_schema.json")).unwrap();
    let plain = support::fake_engine_with(Family::Qwen2, CheckpointIdentity::default(), 3);
    let compiled = plain.compile(&schema).unwrap();
    let ctx = "The payment service is down for all customers.";
    let raw = plain
        .decide(ctx, &compiled, &ScoreOptions::default())
        .unwrap();
    let review_keys: Vec<String> = raw.fields["requires_review"]
        .scores
        .keys()
        .cloned()
        .collect();
    // a content-free bias strong enough to move the argmax of requires_review
    let raw_review: Vec<f32> = raw.fields["requires_review"]
        .logits
        .values()
        .copied()
        .collect();
    let raw_best = if raw_review[0] >= raw_review[1] { 0 } else { 1 };
    let mut cf = [0.5, 0.5];
    cf[raw_best] = 0.999_999;
    cf[1 - raw_best] = 0.000_001;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cal.json");
    let text = serde_json::json!({"entries": [{
        "model_id": "/models/local", "revision": null, "temperature": 0.5,
        "fields": {
            "risk_level": {"temperature": 3.0},
            "requires_review": {"temperature": 1.0, "content_free": {
                review_keys[0].clone(): cf[0], review_keys[1].clone(): cf[1]}}
        }
    }]})
    .to_string();
    std::fs::write(&file, &text).unwrap();
    let mut reg = CalibrationRegistry::built_in();
    reg.extend_from_file(&file).unwrap();
    let local = CheckpointIdentity {
        model_id: Some("/models/local".into()),
        revision: Some("label".into()),
        adapter_sha256: None,
    };
    let engine = Engine::new(
        forkscore_testkit::fake::FakeBackend::new(3),
        support::chat_tokenizer(Family::Qwen2),
        local,
        reg,
    )
    .unwrap();
    let d = engine
        .decide(
            ctx,
            &compiled_for(&engine, &schema),
            &ScoreOptions::default(),
        )
        .unwrap();
    let probs = |name: &str| {
        d.fields[name]
            .scores
            .values()
            .copied()
            .collect::<Vec<f64>>()
    };
    let logits = |name: &str| {
        raw.fields[name]
            .logits
            .values()
            .copied()
            .collect::<Vec<f32>>()
    };
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    let zero3 = vec![0.0; logits("risk_level").len()];
    assert!(close(
        &probs("risk_level"),
        &calibrated(&logits("risk_level"), 3.0, &zero3)
    ));
    let shift: Vec<f64> = cf.iter().map(|p: &f64| p.ln()).collect();
    let want = calibrated(&raw_review, 1.0, &shift);
    assert!(
        close(&probs("requires_review"), &want),
        "{:?} vs {want:?}",
        probs("requires_review")
    );
    // the bias moved the value: it is the argmax of the calibrated probabilities
    let best = if want[0] >= want[1] { 0 } else { 1 };
    assert_ne!(best, raw_best);
    assert_eq!(
        d.fields["requires_review"].value,
        d.fields["requires_review"].choices[best]
    );
    // a field without its own calibration uses the entry's temperature
    let zero_i = vec![0.0; logits("impact_scope").len()];
    assert!(close(
        &probs("impact_scope"),
        &calibrated(&logits("impact_scope"), 0.5, &zero_i)
    ));
    // logits never change
    assert_eq!(
        d.fields["risk_level"].logits,
        raw.fields["risk_level"].logits
    );
    match &d.temperature.source {
        TemperatureSource::Calibrated { file, fields, .. } => {
            let origin = file.as_ref().expect("the file is named");
            use sha2::Digest;
            assert_eq!(
                origin.sha256,
                hex::encode(sha2::Sha256::digest(text.as_bytes()))
            );
            assert_eq!(fields, &["risk_level", "requires_review"]);
        }
        other => panic!("{other:?}"),
    }
    // an explicit temperature replaces the whole calibration
    let explicit = engine
        .decide(
            ctx,
            &compiled_for(&engine, &schema),
            &ScoreOptions {
                temperature: Some(2.0),
                ..ScoreOptions::default()
            },
        )
        .unwrap();
    assert!(explicit.temperature.fields.is_empty());
    assert!(close(
        &explicit.fields["risk_level"]
            .scores
            .values()
            .copied()
            .collect::<Vec<_>>(),
        &calibrated(&logits("risk_level"), 2.0, &zero3)
    ));
}

fn compiled_for<B: forkscore_seam::Backend>(
    e: &forkscore_engine::Engine<B>,
    s: &Schema,
) -> forkscore_engine::CompiledSchema {
    e.compile(s).unwrap()
}

#[test]
fn bad_per_field_calibrations_are_refused_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    for (fields, needle) in [
        (
            serde_json::json!({"topic": {"temperature": 0.0}}),
            "field \"topic\" has temperature 0",
        ),
        (
            serde_json::json!({"topic": {"temperature": 1.0, "content_free": {"a": 0.0}}}),
            "content-free probability 0",
        ),
        (
            serde_json::json!({"topic": {"temperature": 1.0, "bias": 1}}),
            "unknown field",
        ),
    ] {
        let file = dir.path().join("bad.json");
        std::fs::write(
            &file,
            serde_json::json!({"entries": [{"model_id": "m", "temperature": 1.0, "fields": fields}]}).to_string(),
        )
        .unwrap();
        let err = CalibrationRegistry::built_in()
            .extend_from_file(&file)
            .unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
}
