//! Literal-choice scoring through the engine on the fake backend (real Qwen tokenizers,
//! deterministic logits, so equalities are exact): compile (paths, catalogue without codes,
//! typed errors), every mode gives the same result, every method's probabilities sum to one,
//! the 255-choice example scores, code fields next to literal ones keep working.

mod support;

use forkscore_engine::literal::compile::LiteralError;
use forkscore_engine::literal::TrieError;
use forkscore_engine::rows::CompileError;
use forkscore_engine::{Decision, EngineError, Mode, Schema, ScoreOptions};
use forkscore_testkit::tokenizers::Family;
use serde_json::json;

const CONTEXT: &str = "Our production payment service is completely down for every customer.";
const METHODS: [&str; 4] = [
    "literal",
    "literal-first-token",
    "literal-sum-loglik",
    "literal-mean-loglik",
];

/// A field whose choices share prefixes (one choice a word-prefix of another) next to a code
/// field and a literal boolean.
fn mixed_schema(method: &str) -> Schema {
    let v = json!({
        "risk": {"type": "enum", "choices": ["high", "high risk", "low", "medium", "medium-high"],
                 "scoring": method, "description": "Operational risk."},
        "team": {"type": "enum", "choices": ["payments", "search"]},
        "urgent": {"type": "boolean", "scoring": method}
    });
    Schema::from_json_str(&v.to_string()).unwrap()
}

fn decide(family: Family, schema: &Schema, opts: &ScoreOptions) -> Decision {
    let engine = support::fake_engine(family);
    let compiled = engine.compile(schema).unwrap();
    engine.decide(CONTEXT, &compiled, opts).unwrap()
}

fn assert_normalised(d: &Decision) {
    for (name, f) in &d.fields {
        let sum: f64 = f.scores.values().sum();
        assert!((sum - 1.0).abs() < 1e-9, "{name}: Σp = {sum}");
        assert!(f.choices.contains(&f.value), "{name}: {}", f.value);
    }
}

#[test]
fn every_mode_gives_the_same_literal_decision() {
    for family in [Family::Qwen2, Family::Qwen3, Family::Qwen3_5] {
        for method in METHODS {
            let schema = mixed_schema(method);
            let with = |mode| ScoreOptions {
                mode,
                ..ScoreOptions::default()
            };
            let parallel = decide(family, &schema, &with(Mode::Parallel));
            assert_normalised(&parallel);
            let want = serde_json::to_value(&parallel.fields).unwrap();
            for mode in [Mode::CachedSerial, Mode::Independent] {
                let d = decide(family, &schema, &with(mode));
                assert_eq!(
                    serde_json::to_value(&d.fields).unwrap(),
                    want,
                    "{family:?} {method} {mode:?}"
                );
            }
            let risk = &parallel.fields["risk"];
            assert_eq!(risk.scoring, Some(method));
            assert!(risk.codes.is_empty());
            assert_eq!(parallel.fields["team"].codes, ["A", "B"]);
            assert_eq!(parallel.telemetry.tree_calls, 1);
        }
    }
}

#[test]
fn the_catalogue_lists_literal_choices_by_text_and_codes_by_letter() {
    let d = decide(
        Family::Qwen2,
        &mixed_schema("literal"),
        &ScoreOptions {
            include_prompt: true,
            ..ScoreOptions::default()
        },
    );
    let prompt = d.prompt.as_ref().unwrap();
    let text = &prompt.prefix_text;
    assert!(text.contains("risk: Operational risk.\n  - high\n  - high risk\n  - low\n"));
    assert!(text.contains("team\n  A = payments\n  B = search\n"));
    assert!(text.contains("urgent\n  - false\n  - true\n"));
    assert!(text.contains("`field_name: ANSWER`"));
    let risk = &prompt.rows[0];
    assert_eq!(risk.choice_ids.len(), 5);
    assert!(risk.code_ids.is_empty());
    // each path, decoded, is the choice text followed by its newline
    let tok = support::fake_engine(Family::Qwen2).tokenizer();
    for (ids, choice) in risk.choice_ids.iter().zip(["high", "high risk", "low"]) {
        assert_eq!(tok.decode(ids).unwrap(), format!(" {choice}\n"));
    }
}

#[test]
fn the_255_choice_example_scores_with_every_literal_method() {
    let text = support::example("high_cardinality_255.json");
    for method in METHODS {
        let schema = Schema::from_json_str_with(&text, method.parse().unwrap()).unwrap();
        let d = decide(Family::Qwen2, &schema, &ScoreOptions::default());
        assert_normalised(&d);
        let f = d.fields.values().next().unwrap();
        assert_eq!(f.scores.len(), 255, "{method}");
        assert!(d.telemetry.tree_projected > 1);
    }
    // 255 choices cannot be code-scored at all
    assert!(Schema::from_json_str(&text).is_err());
}

#[test]
fn temperature_changes_literal_probabilities_but_not_the_value() {
    for method in METHODS {
        let schema = mixed_schema(method);
        let at = |t: f64| {
            decide(
                Family::Qwen2,
                &schema,
                &ScoreOptions {
                    temperature: Some(t),
                    allow_uncalibrated: true,
                    ..ScoreOptions::default()
                },
            )
        };
        let (cold, hot) = (at(0.5), at(3.0));
        assert_eq!(cold.output, hot.output, "{method}");
        assert_ne!(cold.fields["risk"].scores, hot.fields["risk"].scores);
        assert_eq!(cold.fields["risk"].logits, hot.fields["risk"].logits);
    }
}

#[test]
fn allowed_mass_covers_the_code_fields_of_a_mixed_schema() {
    let schema = mixed_schema("literal");
    let plain = decide(Family::Qwen2, &schema, &ScoreOptions::default());
    let with = decide(
        Family::Qwen2,
        &schema,
        &ScoreOptions {
            allowed_mass: Some(2),
            ..ScoreOptions::default()
        },
    );
    assert_eq!(plain.output, with.output);
    assert!(with.fields["team"].allowed_mass.is_some());
    assert!(with.fields["risk"].allowed_mass.is_none());
}

#[test]
fn decide_many_equals_separate_decisions_with_literal_fields() {
    let engine = support::fake_engine(Family::Qwen3);
    let schema = mixed_schema("literal-sum-loglik");
    let compiled = engine.compile(&schema).unwrap();
    let contexts = [
        "The search index is stale.",
        CONTEXT,
        "A typo on the help page.",
    ];
    let opts = ScoreOptions::default();
    let many = engine.decide_many(
        &contexts,
        &compiled,
        &opts,
        &forkscore_engine::GroupBudget::default(),
    );
    for (ctx, d) in contexts.iter().zip(many) {
        let one = engine.decide(ctx, &compiled, &opts).unwrap();
        assert_eq!(
            serde_json::to_value(&d.unwrap().fields).unwrap(),
            serde_json::to_value(&one.fields).unwrap()
        );
    }
}

fn compile_error(family: Family, choices: serde_json::Value) -> CompileError {
    let schema = json!({"f": {"type": "enum", "choices": choices, "scoring": "literal"}});
    let schema = Schema::from_json_str(&schema.to_string()).unwrap();
    match support::fake_engine(family).compile(&schema) {
        Err(EngineError::Compile(e)) => e,
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn choices_the_tokenizer_cannot_tell_apart_are_a_typed_error() {
    // NFC normalisation makes the decomposed é the same tokens as the precomposed one
    let e = compile_error(Family::Qwen2, json!(["caf\u{e9}", "cafe\u{301}"]));
    match &e {
        CompileError::Literal {
            field,
            scoring: "literal",
            source: LiteralError::Trie(TrieError::Duplicate { first, second }),
        } => {
            assert_eq!(field, "f");
            assert_eq!(
                (first.as_str(), second.as_str()),
                ("caf\u{e9}", "cafe\u{301}")
            );
        }
        other => panic!("expected a duplicate, got {other:?}"),
    }
    assert!(
        e.to_string().contains("same tokens after the selector"),
        "{e}"
    );
}

#[test]
fn a_choice_that_ends_inside_another_is_a_typed_error() {
    // " high\n" is a prefix of " high\nrisk\n": a decoder that stops after the newline can
    // never emit the longer one's tokens as a separate answer, and vice versa
    let e = compile_error(Family::Qwen2, json!(["high", "high\nrisk"]));
    assert!(
        matches!(
            &e,
            CompileError::Literal {
                source: LiteralError::Trie(TrieError::Unreachable { .. }),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("ends inside choice"), "{e}");
}

#[test]
fn an_empty_choice_is_refused_by_the_schema() {
    let schema = json!({"f": {"type": "enum", "choices": ["", "a"], "scoring": "literal"}});
    assert!(Schema::from_json_str(&schema.to_string()).is_err());
}

#[test]
fn the_new_method_names_parse_and_round_trip() {
    for method in METHODS {
        let s: forkscore_engine::schema::Scoring = method.parse().unwrap();
        assert_eq!(s.name(), method);
    }
    let bad = json!({"f": {"type": "enum", "choices": ["a"], "scoring": "literal-loglik"}});
    let e = Schema::from_json_str(&bad.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("literal-mean-loglik"), "{e}");
}

/// A whole mixed decision (literal, code and literal boolean fields) on the fake backend, every
/// method: deterministic, so pinned exactly.
#[test]
fn literal_decisions_snapshot() {
    for method in METHODS {
        let d = decide(
            Family::Qwen2,
            &mixed_schema(method),
            &ScoreOptions::default(),
        );
        let v = forkscore_testkit::snapshot::round_floats(&serde_json::to_value(&d).unwrap());
        insta::assert_json_snapshot!(format!("literal_mixed_fake_qwen25_{method}"), v, {
            ".telemetry.timings_ms" => "[timings]",
        });
    }
}

/// The value of a literal field is the argmax of its reported probabilities by default; with
/// `LiteralValue::Greedy` it is the constrained greedy choice, which on the fake backend's
/// logits differs from the argmax for at least one of these contexts (the test looks for one
/// and fails if none exists, so it cannot pass vacuously).
#[test]
fn the_value_is_the_argmax_of_the_scores_unless_greedy_is_asked() {
    use forkscore_engine::LiteralValue;
    let schema = Schema::from_json_str(
        &json!({"risk": {"type": "enum", "scoring": "literal",
            "choices": ["alpha one", "alpha two", "alpha three", "alpha four", "alpha five",
                "alpha six", "beta one", "beta two", "beta three", "beta four", "gamma"]}})
        .to_string(),
    )
    .unwrap();
    let engine = support::fake_engine(Family::Qwen2);
    let compiled = engine.compile(&schema).unwrap();
    let greedy_opts = ScoreOptions {
        literal_value: LiteralValue::Greedy,
        ..ScoreOptions::default()
    };
    let mut differ = 0;
    for i in 0..40 {
        let context = format!("Incident report number {i}: the service degraded for some users.");
        let d = engine
            .decide(&context, &compiled, &ScoreOptions::default())
            .unwrap();
        let g = engine.decide(&context, &compiled, &greedy_opts).unwrap();
        let (f, fg) = (&d.fields["risk"], &g.fields["risk"]);
        assert_eq!(f.scores, fg.scores, "the rule never changes probabilities");
        let best = f.scores.values().copied().fold(f64::NEG_INFINITY, f64::max);
        let first_best = f.scores.iter().find(|(_, &p)| p == best).unwrap().0;
        assert_eq!(f.value.as_str(), Some(first_best.as_str()), "context {i}");
        if fg.value != f.value {
            differ += 1;
            assert!(f.scores[fg.value.as_str().unwrap()] < best);
        }
    }
    assert!(differ > 0, "no context where greedy and argmax differ");
}
