//! Mode equivalence on the fake backend with real Qwen tokenizers: parallel == cached-serial ==
//! tree == independent exactly, for generated schemas and contexts; the split always reconstructs the
//! full prompt; every field_batch_size gives the same result.

mod support;

use forkscore_engine::prepare::render::{render_prefix, selector};
use forkscore_engine::{Decision, EngineError, Mode, Schema, ScoreOptions};
use forkscore_testkit::tokenizers::Family;
use proptest::prelude::*;
use support::{example, fake_engine};

fn logits_of(d: &Decision) -> Vec<Vec<f32>> {
    d.fields
        .values()
        .map(|f| f.logits.values().copied().collect())
        .collect()
}

fn arb_schema() -> impl Strategy<Value = String> {
    let name = "[a-z][a-z_0-9]{0,10}";
    let choice = "[A-Za-z][A-Za-z0-9 _-]{0,12}";
    let field = prop_oneof![
        (
            prop::collection::vec(choice, 1..8),
            proptest::option::of("[A-Za-z ,.]{0,30}")
        )
            .prop_map(|(choices, d)| {
                let mut uniq: Vec<String> = Vec::new();
                for c in choices {
                    let c = c.trim().to_string();
                    if !c.is_empty() && !uniq.contains(&c) {
                        uniq.push(c);
                    }
                }
                if uniq.is_empty() {
                    uniq.push("only".into());
                }
                let mut spec = serde_json::json!({"type": "enum", "choices": uniq});
                if let Some(d) = d {
                    spec["description"] = d.into();
                }
                spec
            }),
        any::<bool>().prop_map(|rev| {
            if rev {
                serde_json::json!({"type": "boolean", "choices": [true, false]})
            } else {
                serde_json::json!({"type": "boolean", "description": "Is it so?"})
            }
        }),
    ];
    prop::collection::vec((name, field), 1..7).prop_map(|fields| {
        let mut map = serde_json::Map::new();
        for (n, f) in fields {
            map.entry(n).or_insert(f);
        }
        serde_json::Value::Object(map).to_string()
    })
}

fn arb_context() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ,.!?'\\n]{1,200}",
        "\\PC{1,80}",
        Just("  Leading and trailing spaces  ".to_string()),
        Just("Ends with a newline\n".to_string()),
        Just("数据库宕机了，所有客户都无法付款。".to_string()),
    ]
    .prop_filter("non-empty", |s| !s.trim().is_empty())
}

fn families() -> impl Strategy<Value = Family> {
    prop_oneof![
        Just(Family::Qwen2),
        Just(Family::Qwen3),
        Just(Family::Qwen3_5)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn modes_agree_exactly_and_split_reconstructs(schema in arb_schema(), context in arb_context(), fam in families(), fbs in 1usize..8) {
        let engine = fake_engine(fam);
        let schema = Schema::from_json_str(&schema).unwrap();
        let compiled = engine.compile(&schema).unwrap();
        let run = |mode, field_batch_size| {
            engine.decide(&context, &compiled, &ScoreOptions { mode, field_batch_size, include_prompt: true, ..ScoreOptions::default() }).unwrap()
        };
        let parallel = run(Mode::Parallel, None);
        let serial = run(Mode::CachedSerial, None);
        let independent = run(Mode::Independent, None);
        let batched = run(Mode::Parallel, Some(fbs));
        let tree = run(Mode::Tree, None);
        prop_assert_eq!(logits_of(&parallel), logits_of(&independent));
        prop_assert_eq!(logits_of(&tree), logits_of(&independent));
        prop_assert_eq!(&tree.output, &independent.output);
        prop_assert_eq!((tree.telemetry.tree_calls, tree.telemetry.score_calls), (1, 0));
        prop_assert_eq!(tree.telemetry.tree_packing, Some("row-per-node"));
        prop_assert_eq!(logits_of(&serial), logits_of(&independent));
        prop_assert_eq!(logits_of(&batched), logits_of(&independent));
        prop_assert_eq!(&parallel.output, &independent.output);
        prop_assert_eq!(parallel.telemetry.score_calls, 1);
        prop_assert_eq!(batched.telemetry.score_calls, schema.fields().len().div_ceil(fbs));
        prop_assert_eq!(serial.telemetry.score_calls, schema.fields().len());
        prop_assert_eq!(independent.telemetry.forward_calls, schema.fields().len());

        // prefix ++ suffix == tokenize(prefix text ++ selector), row by row.
        let prompt = parallel.prompt.as_ref().unwrap();
        let prefix_text = render_prefix(engine.tokenizer().template(), &context, schema.fields(), forkscore_engine::Layout::ContextFirst).unwrap();
        prop_assert_eq!(&prompt.prefix_text, &prefix_text);
        for (f, row) in schema.fields().iter().zip(&prompt.rows) {
            let full = engine.tokenizer().encode(&format!("{prefix_text}{}", selector(f))).unwrap();
            let mut joined = prompt.prefix_ids.clone();
            joined.extend(&row.suffix_ids);
            prop_assert_eq!(joined, full);
            prop_assert!(!row.suffix_ids.is_empty());
        }
        // Probabilities are a distribution per field; the selection is the argmax choice.
        for f in parallel.fields.values() {
            let sum: f64 = f.scores.values().sum();
            prop_assert!((sum - 1.0).abs() < 1e-9);
        }
    }
}

#[test]
fn suffixes_do_not_depend_on_the_context() {
    for fam in Family::ALL {
        let engine = fake_engine(fam);
        let schema = Schema::from_json_str(&example("support_triage.json")).unwrap();
        let compiled = engine.compile(&schema).unwrap();
        for context in [
            "short",
            "A much longer context.\nWith lines.\n\n",
            "ends in colon:",
        ] {
            let prep = engine.prepare(context, &compiled, 4096).unwrap();
            for (f, s) in compiled.fields().iter().zip(&prep.split().suffix_ids) {
                assert_eq!(&f.suffix_ids, s, "{fam:?} field {}", f.name);
            }
        }
    }
}

#[test]
fn over_long_prompts_are_rejected_with_counts_never_truncated() {
    let engine = fake_engine(Family::Qwen2);
    let schema = Schema::from_json_str(&example("parallel_schema.json")).unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let ok = engine
        .decide(
            "The payment service is down.",
            &compiled,
            &ScoreOptions::default(),
        )
        .unwrap();
    let total = ok.telemetry.input_tokens;
    let opts = ScoreOptions {
        max_input_tokens: total - 1,
        ..ScoreOptions::default()
    };
    match engine.decide("The payment service is down.", &compiled, &opts) {
        Err(EngineError::TooManyTokens {
            prefix,
            suffix,
            total: t,
            max,
            schema_only: false,
        }) => {
            assert_eq!((prefix + suffix, t, max), (total, total, total - 1));
        }
        other => panic!("expected TooManyTokens, got {other:?}"),
    }
    let exact = ScoreOptions {
        max_input_tokens: total,
        ..ScoreOptions::default()
    };
    assert!(engine
        .decide("The payment service is down.", &compiled, &exact)
        .is_ok());
    assert!(matches!(
        engine.decide("  \n ", &compiled, &ScoreOptions::default()),
        Err(EngineError::EmptyContext)
    ));
    let zero = ScoreOptions {
        field_batch_size: Some(0),
        ..ScoreOptions::default()
    };
    assert!(matches!(
        engine.decide("x", &compiled, &zero),
        Err(EngineError::ZeroFieldBatch)
    ));
}

#[test]
fn booleans_stay_json_booleans_with_string_score_keys() {
    let engine = fake_engine(Family::Qwen3);
    let schema =
        Schema::from_json_str(r#"{"flag": {"type": "boolean", "choices": [true, false]}}"#)
            .unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let d = engine
        .decide("Is the sky blue?", &compiled, &ScoreOptions::default())
        .unwrap();
    assert!(d.output["flag"].is_boolean());
    let keys: Vec<&String> = d.fields["flag"].scores.keys().collect();
    assert_eq!(keys, ["true", "false"]);
    assert_eq!(d.fields["flag"].codes, ["A", "B"]);
}

fn arb_context_with_specials() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z0-9 ,.!?'\\n]{1,40}",
        Just("<|im_start|>".to_string()),
        Just("<|im_end|>\n".to_string()),
        Just("<think>".to_string()),
        Just("</think>\n\n".to_string()),
        Just("<|endoftext|>".to_string()),
        Just("\u{65}\u{301}".to_string()),
        Just("  \n\n ".to_string()),
    ];
    prop::collection::vec(piece, 1..8)
        .prop_map(|v| v.concat())
        .prop_filter("non-empty", |s| !s.trim().is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The anchored split (head tokenized once) equals tokenizing every full prompt whole,
    /// also when the context itself contains special-token text.
    #[test]
    fn anchored_split_equals_exact_split(schema in arb_schema(), context in arb_context_with_specials(), fam in families()) {
        use forkscore_engine::prepare::anchor::split_anchored;
        use forkscore_engine::prepare::split::split_exact;
        let engine = fake_engine(fam);
        let schema = Schema::from_json_str(&schema).unwrap();
        let compiled = engine.compile(&schema).unwrap();
        let prefix_text = render_prefix(engine.tokenizer().template(), &context, schema.fields(), forkscore_engine::Layout::ContextFirst).unwrap();
        let selectors = compiled.selectors();
        let exact = split_exact(engine.tokenizer(), &prefix_text, &selectors).unwrap();
        let anchored = split_anchored(engine.tokenizer(), &prefix_text, &selectors).unwrap();
        prop_assert_eq!(exact, anchored);
    }
}
