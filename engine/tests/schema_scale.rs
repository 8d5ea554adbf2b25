//! Stage 1 at scale and its tail tokenization: compiling a schema is linear in its size, the
//! token bound is checked before any per-field work, oversized schemas are refused by bytes
//! before anything is tokenized, and the short-tail tokenization of selectors, codes and
//! choices gives exactly the ids of tokenizing each whole prompt, on the real Qwen tokenizers.

mod support;

use forkscore_engine::literal::ChoiceTrie;
use forkscore_engine::prepare::render::{code_text, render_prefix, selector};
use forkscore_engine::prepare::split::split_exact;
use forkscore_engine::rows::{CompileError, PROBE_CONTEXT};
use forkscore_engine::schema::{SchemaErrorKind, Scoring, MAX_SCHEMA_BYTES};
use forkscore_engine::{ChatTokenizer, EngineError, Schema};
use forkscore_testkit::tokenizers::Family;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use support::fake_engine;

const FAMILIES: [Family; 3] = [Family::Qwen2, Family::Qwen3, Family::Qwen3_5];

/// A schema of `n` boolean fields (about 30 bytes of JSON each).
fn booleans(n: usize) -> Schema {
    let root: Map<String, Value> = (0..n)
        .map(|i| (format!("field_{i:05}"), json!({"type": "boolean"})))
        .collect();
    Schema::from_value(&Value::Object(root)).unwrap()
}

/// One literal field with `n` choices.
fn literal_field(n: usize) -> Schema {
    let choices: Vec<String> = (0..n).map(|i| format!("category {i}")).collect();
    Schema::from_value(
        &json!({"label": {"type": "enum", "choices": choices, "scoring": "literal"}}),
    )
    .unwrap()
}

/// What each field follows its selector with, computed the reference way: every prompt
/// tokenized whole (`prefix ++ selector ++ code` / `prefix ++ selector ++ " {choice}\n"`; json:
/// `" {value},"`, `" {value}\n}"` after the last field).
#[derive(Debug, PartialEq)]
enum Reference {
    Codes(Vec<u32>),
    Paths(Vec<Vec<u32>>),
    /// The code or a choice merges with the selector, or a code is not one token.
    Refused,
}

fn reference(tok: &ChatTokenizer, schema: &Schema) -> (Vec<Vec<u32>>, Vec<Reference>) {
    let prefix = render_prefix(
        tok.template(),
        PROBE_CONTEXT,
        schema.fields(),
        forkscore_engine::Layout::ContextFirst,
    )
    .unwrap();
    let selectors: Vec<String> = schema.fields().iter().map(selector).collect();
    let split = split_exact(tok, &prefix, &selectors).unwrap();
    let mut out = Vec::new();
    for (i, (f, sel)) in schema.fields().iter().zip(&selectors).enumerate() {
        let full = split.full_ids(i);
        let after = |text: String| -> Option<Vec<u32>> {
            let whole = tok.encode(&format!("{prefix}{sel}{text}")).unwrap();
            (whole.len() > full.len() && whole.starts_with(&full))
                .then(|| whole[full.len()..].to_vec())
        };
        out.push(match f.scoring {
            Scoring::Code => (0..f.choices.len())
                .map(|j| match after(code_text(j)) {
                    Some(rest) if rest.len() == 1 => Some(rest[0]),
                    _ => None,
                })
                .collect::<Option<Vec<u32>>>()
                .map_or(Reference::Refused, Reference::Codes),
            Scoring::Literal(_) => f
                .choices
                .iter()
                .map(|c| after(format!(" {}\n", c.key())))
                .collect::<Option<Vec<_>>>()
                .map_or(Reference::Refused, Reference::Paths),
            Scoring::Json => {
                let end = if i + 1 == schema.fields().len() {
                    "\n}"
                } else {
                    ","
                };
                f.choices
                    .iter()
                    .map(|c| after(format!(" {}{end}", c.to_json())))
                    .collect::<Option<Vec<_>>>()
                    .map_or(Reference::Refused, Reference::Paths)
            }
        });
    }
    (split.suffix_ids, out)
}

fn arb_text() -> impl Strategy<Value = String> {
    // letters, digits, punctuation that BPE merges across (`:`, `-`, `.`), spaces inside,
    // quotes, brackets, and non-ASCII letters
    proptest::string::string_regex(
        r"[A-Za-z0-9_][A-Za-z0-9_ .:\-/()'é中ß]{0,11}[A-Za-z0-9_.:)é中]?",
    )
    .unwrap()
}

fn arb_schema() -> impl Strategy<Value = String> {
    let field = (
        arb_text(),
        prop::bool::ANY,
        prop::collection::btree_set(arb_text(), 1..6),
    );
    // a quarter of the schemas score every field as its JSON value (the generation prompt)
    let json = prop::bool::weighted(0.25);
    (prop::collection::vec(field, 1..5), json).prop_map(|(fields, json)| {
        let mut root = Map::new();
        if json {
            root.insert("scoring".into(), json!("json"));
        }
        for (name, literal, choices) in fields {
            let name = name.trim().to_string();
            if name.is_empty() || name == "scoring" || root.contains_key(&name) {
                continue;
            }
            let choices: Vec<String> = choices.into_iter().collect();
            let spec = if literal && !json {
                json!({"type": "enum", "choices": choices, "scoring": "literal"})
            } else if choices.len() == 1 {
                json!({"type": "boolean"})
            } else {
                json!({"type": "enum", "choices": choices})
            };
            root.insert(name, spec);
        }
        if root.len() == usize::from(json) {
            root.insert("f".into(), json!({"type": "boolean"}));
        }
        Value::Object(root).to_string()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The tail tokenization of compile equals tokenizing every whole prompt: the same suffix
    /// ids, the same code ids, the same choice paths — and a schema is refused exactly where
    /// the whole tokenizations show a merge with the selector, a multi-token code or a choice
    /// ending inside another. BPE merges can cross the selector boundary (names ending in
    /// `:` or `.`, choices starting with punctuation), which is what the random text exercises.
    #[test]
    fn tail_tokenization_equals_whole_prompt_tokenization(schema in arb_schema(), fam in 0usize..3) {
        let engine = fake_engine(FAMILIES[fam]);
        let tok = engine.tokenizer();
        let schema = Schema::from_json_str(&schema).unwrap();
        let (suffixes, expected) = reference(tok, &schema);
        match engine.compile(&schema) {
            Ok(compiled) => {
                for ((f, suffix), want) in compiled.fields().iter().zip(&suffixes).zip(&expected) {
                    prop_assert_eq!(&f.suffix_ids, suffix, "field {}", f.name);
                    match (&f.literal, want) {
                        (None, Reference::Codes(ids)) => prop_assert_eq!(&f.code_ids, ids),
                        (Some(l), Reference::Paths(paths)) => prop_assert_eq!(&l.paths, paths),
                        (got, want) => prop_assert!(false, "field {}: {:?} vs {:?}", f.name, got, want),
                    }
                }
            }
            Err(EngineError::Compile(e)) => {
                let field = match &e {
                    CompileError::CodeMergesWithSelector { field, .. }
                    | CompileError::CodeNotSingleToken { field, .. }
                    | CompileError::Literal { field, .. } => field.clone(),
                    other => return Err(TestCaseError::fail(format!("unexpected {other}"))),
                };
                let i = schema.fields().iter().position(|f| f.name == field).unwrap();
                let refused = match &expected[i] {
                    Reference::Refused => true,
                    // every path tokenized, but two choices share a path or one ends inside another
                    Reference::Paths(paths) => {
                        let names: Vec<String> = schema.fields()[i].choices.iter().map(|c| c.key()).collect();
                        ChoiceTrie::new(&names, paths).is_err()
                    }
                    Reference::Codes(_) => false,
                };
                prop_assert!(refused, "{e} but the whole tokenizations accept field {field}");
            }
            Err(other) => prop_assert!(false, "unexpected {other}"),
        }
    }
}

/// 10,000 boolean fields (0.3 MB of schema) are refused for the default token bound right after
/// the probe prompt's one tokenization, on every family, well inside the bound (generous for
/// a loaded CI machine; the refusal takes a fraction of a second).
#[test]
fn ten_thousand_fields_are_refused_at_once() {
    let schema = booleans(10_000);
    for fam in FAMILIES {
        let engine = fake_engine(fam);
        let t = Instant::now();
        match engine.compile_within(&schema, 4096) {
            Err(
                e @ EngineError::TooManyTokens {
                    schema_only: true,
                    max: 4096,
                    ..
                },
            ) => {
                let msg = e.to_string();
                assert!(msg.contains("schema") && msg.contains("4096"), "{msg}");
            }
            other => panic!("{fam:?}: expected the schema to be refused, got {other:?}"),
        }
        eprintln!("{fam:?}: 10,000 fields refused in {:?}", t.elapsed());
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{fam:?}: {:?}",
            t.elapsed()
        );
    }
}

/// Without a bound at compile (the unbounded `compile`), a large schema still compiles in time
/// linear in its size, and stage 2 refuses every context for it before tokenizing the context.
#[test]
fn a_large_schema_compiles_linearly_and_prepare_refuses_it_first() {
    let engine = fake_engine(Family::Qwen3);
    let schema = booleans(2_000);
    let t = Instant::now();
    let compiled = engine.compile(&schema).expect("compile");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(compiled.fields().len(), 2_000);
    assert!(
        compiled.schema_tokens() > 4096,
        "{}",
        compiled.schema_tokens()
    );
    match engine.prepare("A context.", &compiled, 4096) {
        Err(EngineError::TooManyTokens {
            schema_only: true, ..
        }) => {}
        other => panic!("expected the schema to be refused, got {other:?}"),
    }
    // a bound the schema fits: every row is there, split exactly as the reference does
    let fits = compiled.schema_tokens() + 4096;
    let prepared = engine
        .prepare("A context.", &compiled, fits)
        .expect("prepare");
    assert_eq!(prepared.split().suffix_ids.len(), 2_000);
}

/// The compile-time floor never refuses a schema some context fits: a schema whose real prompt
/// is exactly the bound compiles under that bound, on every family, and is decided.
#[test]
fn the_schema_floor_is_below_every_real_prompt() {
    for fam in FAMILIES {
        let engine = fake_engine(fam);
        for schema in [booleans(3), literal_field(5), booleans(40)] {
            let compiled = engine.compile(&schema).unwrap();
            for context in ["x", "A", ".", "é", "The payment service is down."] {
                let prepared = engine.prepare(context, &compiled, usize::MAX >> 1).unwrap();
                let tokens = prepared.split().input_tokens();
                assert!(
                    compiled.schema_tokens() < tokens,
                    "{fam:?} {context:?}: floor {} vs prompt {tokens}",
                    compiled.schema_tokens()
                );
                engine.compile_within(&schema, tokens).expect("fits");
                engine
                    .prepare(context, &compiled, tokens)
                    .expect("fits exactly");
            }
        }
    }
}

/// The documented maximum of 4,096 literal choices compiles in bounded time (one short
/// tokenization per choice), and its paths are those of the whole prompts (sampled).
#[test]
fn four_thousand_literal_choices_compile_linearly() {
    let schema = literal_field(4096);
    for fam in FAMILIES {
        let engine = fake_engine(fam);
        let t = Instant::now();
        let compiled = engine.compile(&schema).expect("compile");
        eprintln!(
            "{fam:?}: 4,096 literal choices compiled in {:?}",
            t.elapsed()
        );
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{fam:?}: {:?}",
            t.elapsed()
        );
        let tok = engine.tokenizer();
        let prefix = render_prefix(
            tok.template(),
            PROBE_CONTEXT,
            schema.fields(),
            forkscore_engine::Layout::ContextFirst,
        )
        .unwrap();
        let full = split_exact(tok, &prefix, &["label:".to_string()])
            .unwrap()
            .full_ids(0);
        let paths = &compiled.fields()[0].literal.as_ref().unwrap().paths;
        assert_eq!(paths.len(), 4096);
        for i in [0, 1, 9, 10, 99, 100, 1234, 4095] {
            let whole = tok
                .encode(&format!("{prefix}label: category {i}\n"))
                .unwrap();
            assert_eq!(whole[..full.len()], full[..], "{fam:?} choice {i}");
            assert_eq!(whole[full.len()..], paths[i][..], "{fam:?} choice {i}");
        }
    }
}

/// A schema over the byte maximum is refused before parsing (text) or before anything reads
/// its fields (a parsed value), naming where: the root for the text, the string that passes
/// the limit for a value.
#[test]
fn oversized_schemas_are_refused_by_bytes_naming_the_path() {
    let big = "risk ".repeat(800_000); // 4 MB
    let text = json!({"risk": {"type": "boolean", "description": big}}).to_string();
    let t = Instant::now();
    let e = Schema::from_json_str(&text).unwrap_err();
    assert_eq!(e.path, "<root>");
    assert!(
        matches!(e.kind, SchemaErrorKind::TooLarge { max, .. } if max == MAX_SCHEMA_BYTES),
        "{e}"
    );
    let value: Value = serde_json::from_str(&text).unwrap();
    let e = Schema::from_value(&value).unwrap_err();
    assert_eq!(e.path, "risk.description", "{e}");
    assert!(
        matches!(e.kind, SchemaErrorKind::TextTooLarge { .. }),
        "{e}"
    );
    // a choice and a field name past the limit are named too (a long key by its start only)
    let choices = vec![
        "c".repeat(MAX_SCHEMA_BYTES / 2),
        "d".repeat(MAX_SCHEMA_BYTES / 2),
    ];
    let e = Schema::from_value(&json!({"f": {"type": "enum", "choices": choices}})).unwrap_err();
    assert_eq!(e.path, "f.choices[1]", "{e}");
    let key = "k".repeat(MAX_SCHEMA_BYTES + 1);
    let e = Schema::from_value(&json!({ key: {"type": "boolean"} })).unwrap_err();
    assert!(
        e.path.len() < 200 && e.path.starts_with("kkk"),
        "{}",
        e.path
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // just under the limit is a schema like any other
    let fine = json!({"risk": {"type": "boolean", "description": "r".repeat(1000)}});
    assert!(Schema::from_value(&fine).is_ok());
}
