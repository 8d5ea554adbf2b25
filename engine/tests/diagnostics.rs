//! The full-vocabulary diagnostics through the engine, on the fake backend (deterministic, so
//! equalities are exact): allowed mass is the same in every mode and grouping and never changes
//! a decision; `Engine::logprobs` is consistent with itself and refuses bad input clearly.
//! Whole outputs are pinned by snapshots (here and in `snapshots.rs`).

mod support;

use forkscore_engine::{
    Decision, EngineError, GroupBudget, LogprobOptions, Mode, Schema, ScoreOptions,
};
use forkscore_testkit::tokenizers::Family;

const CONTEXT: &str = "Our production payment service is completely down for every customer.";

fn decide(opts: &ScoreOptions) -> Decision {
    let engine = support::fake_engine(Family::Qwen2);
    let schema = Schema::from_json_str(&support::example("parallel_schema.json")).unwrap();
    let compiled = engine.compile(&schema).unwrap();
    engine.decide(CONTEXT, &compiled, opts).unwrap()
}

/// Fields without telemetry: what must not depend on how rows were batched.
fn fields_json(d: &Decision) -> serde_json::Value {
    serde_json::to_value(&d.fields).unwrap()
}

#[test]
fn allowed_mass_is_the_same_in_every_mode_and_grouping() {
    let with = |mode, field_batch_size| ScoreOptions {
        mode,
        field_batch_size,
        allowed_mass: Some(4),
        ..ScoreOptions::default()
    };
    let reference = fields_json(&decide(&with(Mode::Independent, None)));
    for (mode, fbs) in [
        (Mode::Parallel, None),
        (Mode::Parallel, Some(1)),
        (Mode::Parallel, Some(2)),
        (Mode::CachedSerial, None),
    ] {
        assert_eq!(
            fields_json(&decide(&with(mode, fbs))),
            reference,
            "{mode:?} {fbs:?}"
        );
    }
    // many contexts in one slot-merged group == each alone
    let engine = support::fake_engine(Family::Qwen2);
    let schema = Schema::from_json_str(&support::example("parallel_schema.json")).unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let contexts = [CONTEXT, "A typo on the pricing page.", CONTEXT];
    let many = engine.decide_many(
        &contexts,
        &compiled,
        &with(Mode::Parallel, None),
        &GroupBudget::default(),
    );
    for (c, d) in contexts.iter().zip(many) {
        let alone = engine
            .decide(c, &compiled, &with(Mode::Independent, None))
            .unwrap();
        assert_eq!(fields_json(&d.unwrap()), fields_json(&alone));
    }
}

#[test]
fn allowed_mass_never_changes_a_decision_and_is_consistent() {
    let plain = decide(&ScoreOptions::default());
    let with = decide(&ScoreOptions {
        allowed_mass: Some(1024),
        ..ScoreOptions::default()
    });
    assert_eq!(plain.output, with.output);
    for ((name, p), w) in plain.fields.iter().zip(with.fields.values()) {
        assert!(p.allowed_mass.is_none());
        assert_eq!((&p.scores, &p.logits), (&w.scores, &w.logits), "{name}");
        let a = w.allowed_mass.as_ref().expect("asked for");
        assert!(a.mass > 0.0 && a.mass <= 1.0, "{name}: {}", a.mass);
        assert_eq!(a.top.len(), 1024);
        // best first, and each code in the top list has logprob = code logit − logsumexp
        assert!(a.top.windows(2).all(|t| t[0].logprob >= t[1].logprob));
        let own: f64 = w
            .logits
            .values()
            .map(|&l| (f64::from(l) - f64::from(a.logsumexp)).exp())
            .sum();
        assert_eq!(a.mass, own.min(1.0));
    }
    // K = 0: the mass alone
    let zero = decide(&ScoreOptions {
        allowed_mass: Some(0),
        ..ScoreOptions::default()
    });
    assert!(zero
        .fields
        .values()
        .all(|f| f.allowed_mass.as_ref().is_some_and(|a| a.top.is_empty())));
}

#[test]
fn too_large_a_top_k_is_refused_before_scoring() {
    let engine = support::fake_engine(Family::Qwen2);
    let schema = Schema::from_json_str(&support::example("parallel_schema.json")).unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let opts = ScoreOptions {
        allowed_mass: Some(1025),
        ..ScoreOptions::default()
    };
    let e = engine.decide(CONTEXT, &compiled, &opts).unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::TopKTooLarge {
                top_k: 1025,
                max: 1024
            }
        ),
        "{e}"
    );
    let e = engine
        .logprobs(
            "two words",
            &LogprobOptions {
                top_k: 5000,
                ..LogprobOptions::default()
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("top-K of 5000"), "{e}");
}

#[test]
fn logprobs_cover_every_token_after_the_first() {
    let engine = support::fake_engine(Family::Qwen2);
    let r = engine
        .logprobs(
            CONTEXT,
            &LogprobOptions {
                top_k: 3,
                ..LogprobOptions::default()
            },
        )
        .unwrap();
    let ids = engine.tokenizer().encode_as_text(CONTEXT).unwrap();
    assert_eq!(r.tokens.len(), ids.len());
    assert_eq!(r.tokens.iter().map(|t| t.id).collect::<Vec<_>>(), ids);
    assert!(r.tokens[0].logprob.is_none() && r.tokens[0].top.is_empty());
    let mut total = 0.0;
    for (i, t) in r.tokens.iter().enumerate().skip(1) {
        let lp = t.logprob.expect("every token after the first");
        assert!(lp <= 0.0);
        assert_eq!(t.position, i);
        assert_eq!(t.top.len(), 3);
        // a token inside the top list has exactly its listed log-probability
        if let Some(same) = t.top.iter().find(|a| a.id == t.id) {
            assert_eq!(same.logprob, lp);
        } else {
            assert!(lp <= t.top[2].logprob);
        }
        total += f64::from(lp);
    }
    assert_eq!(r.total_logprob, total);
}

#[test]
fn logprobs_refuse_bad_texts_with_clear_errors() {
    let engine = support::fake_engine(Family::Qwen2);
    let opts = LogprobOptions::default();
    let err = |text: &str, opts: &LogprobOptions| engine.logprobs(text, opts).unwrap_err();
    assert!(matches!(err("", &opts), EngineError::EmptyText));
    assert!(matches!(
        err("Hello", &opts),
        EngineError::TooFewTokens { tokens: 1 }
    ));
    let short = LogprobOptions {
        max_input_tokens: 4,
        ..opts
    };
    let e = err(CONTEXT, &short);
    assert!(matches!(e, EngineError::TextTooLong { max: 4, .. }), "{e}");
    assert!(e.to_string().contains("never truncates"));
}

/// A text longer than the model's own context limit (`max_position_embeddings`) is refused
/// with a typed error naming the limit, even when `max_input_tokens` would allow it — never
/// truncated, never scored, never a panic. A text at the limit is scored.
#[test]
fn logprobs_refuse_a_text_over_the_model_context_limit() {
    use forkscore_engine::{CalibrationRegistry, CheckpointIdentity, Engine};
    use forkscore_testkit::fake::FakeBackend;
    let engine = Engine::new(
        FakeBackend::new(1).with_max_positions(8),
        support::chat_tokenizer(Family::Qwen2),
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )
    .unwrap();
    let opts = LogprobOptions::default();
    let e = engine.logprobs(CONTEXT, &opts).unwrap_err();
    let tokens = match e {
        EngineError::TextOverModelLimit { tokens, max: 8 } => tokens,
        ref other => panic!("expected TextOverModelLimit, got {other:?}"),
    };
    assert!(tokens > 8);
    let msg = e.to_string();
    assert!(
        msg.contains("max_position_embeddings = 8") && msg.contains("never truncates"),
        "{msg}"
    );
    // the limit itself is allowed: 8 tokens exactly
    let eight = " a".repeat(8);
    let r = engine.logprobs(&eight, &opts).unwrap();
    assert_eq!(r.tokens.len(), 8);
}

#[test]
fn logprobs_snapshot() {
    let engine = support::fake_engine(Family::Qwen2);
    let r = engine
        .logprobs(
            "The payment service is down.",
            &LogprobOptions {
                top_k: 2,
                ..LogprobOptions::default()
            },
        )
        .unwrap();
    let v = forkscore_testkit::snapshot::round_floats(&serde_json::to_value(&r).unwrap());
    insta::assert_json_snapshot!("logprobs_fake_qwen25", v, { ".telemetry" => "[telemetry]" });
}
