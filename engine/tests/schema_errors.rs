//! Schema validation: a table of malformed schemas, each with the exact path and rule it breaks;
//! the accepted forms; and a property test that arbitrary JSON never panics the parser.

use forkscore_engine::schema::{Choice, FieldKind, Schema, SchemaErrorKind as K};
use proptest::prelude::*;

fn check(text: &str, path: &str, ok: fn(&K) -> bool) {
    let err = Schema::from_json_str(text).expect_err(&format!("schema should be rejected: {text}"));
    assert_eq!(err.path, path, "wrong path for {text}: {err}");
    assert!(ok(&err.kind), "wrong rule for {text}: {err}");
    // The message names the path.
    assert!(err.to_string().contains(path), "{err}");
}

#[test]
fn malformed_schemas_are_rejected_with_their_path_and_rule() {
    let cases: Vec<(&str, &str, fn(&K) -> bool)> = vec![
        // Not JSON / not an object.
        (r#"{"a": "#, "<root>", |k| matches!(k, K::Json(_))),
        (r#"[1, 2]"#, "<root>", |k| {
            matches!(k, K::NotAnObject { found: "an array" })
        }),
        (r#""text""#, "<root>", |k| {
            matches!(k, K::NotAnObject { .. })
        }),
        (r#"null"#, "<root>", |k| {
            matches!(k, K::NotAnObject { found: "null" })
        }),
        (r#"{}"#, "<root>", |k| matches!(k, K::Empty)),
        // Duplicate keys (serde_json would keep the last one silently).
        (
            r#"{"a": {"type": "boolean"}, "a": {"type": "boolean"}}"#,
            "<root>",
            |k| matches!(k, K::Json(_)),
        ),
        (r#"{"a": {"type": "enum", "type": "boolean"}}"#, "a", |k| {
            matches!(k, K::Json(_))
        }),
        (
            r#"{"type": "object", "properties": {"x": {"type": "boolean"}, "x": {"type": "boolean"}}}"#,
            "properties",
            |k| matches!(k, K::Json(_)),
        ),
        // Flat form: field shape.
        (r#"{"a": 3}"#, "a", |k| {
            matches!(k, K::FieldNotAnObject { found: "a number" })
        }),
        (r#"{"a": ["x"]}"#, "a", |k| {
            matches!(k, K::FieldNotAnObject { found: "an array" })
        }),
        (r#"{"a": {}}"#, "a", |k| matches!(k, K::MissingType)),
        // json scoring is all fields or none
        (
            r#"{"a": {"type": "boolean", "scoring": "json"}, "b": {"type": "boolean"}}"#,
            "b.scoring",
            |k| matches!(k, K::MixedJsonScoring { json_field, scoring: "code" } if json_field == "a"),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean", "scoring": "literal"}, "b": {"type": "boolean", "scoring": "json"}}}"#,
            "properties.a.scoring",
            |k| {
                matches!(
                    k,
                    K::MixedJsonScoring {
                        scoring: "literal",
                        ..
                    }
                )
            },
        ),
        (r#"{"a": {"type": 1}}"#, "a.type", |k| {
            matches!(k, K::TypeNotString { .. })
        }),
        (r#"{"a": {"type": "object"}}"#, "a.type", |k| {
            matches!(k, K::NestedObject)
        }),
        (r#"{"a": {"type": "array"}}"#, "a.type", |k| {
            matches!(k, K::Array)
        }),
        (r#"{"a": {"type": "number"}}"#, "a.type", |k| {
            matches!(k, K::Number { .. })
        }),
        (r#"{"a": {"type": "integer"}}"#, "a.type", |k| {
            matches!(k, K::Number { .. })
        }),
        (r#"{"a": {"type": "string"}}"#, "a.type", |k| {
            matches!(k, K::StringWithoutEnum)
        }),
        (r#"{"a": {"type": "null"}}"#, "a.type", |k| {
            matches!(k, K::Null)
        }),
        (r#"{"a": {"type": "categorical"}}"#, "a.type", |k| {
            matches!(k, K::UnknownType { .. })
        }),
        (r#"{"a": {"type": "enum"}}"#, "a", |k| {
            matches!(k, K::MissingChoices { .. })
        }),
        (
            r#"{"a": {"type": "enum", "choices": "x"}}"#,
            "a.choices",
            |k| matches!(k, K::ChoicesNotArray { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": []}}"#,
            "a.choices",
            |k| matches!(k, K::NoChoices),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x", 2]}}"#,
            "a.choices[1]",
            |k| matches!(k, K::ChoiceNotString { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x", null]}}"#,
            "a.choices[1]",
            |k| matches!(k, K::ChoiceNotString { found: "null" }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": [""]}}"#,
            "a.choices[0]",
            |k| matches!(k, K::EmptyChoice),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x", "  "]}}"#,
            "a.choices[1]",
            |k| matches!(k, K::EmptyChoice),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x", "y", "x"]}}"#,
            "a.choices[2]",
            |k| matches!(k, K::DuplicateChoice { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x"], "enum": ["y"]}}"#,
            "a.enum",
            |k| matches!(k, K::UnknownKey { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x"], "default": "x"}}"#,
            "a.default",
            |k| matches!(k, K::UnknownKey { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x"], "description": 5}}"#,
            "a.description",
            |k| matches!(k, K::DescriptionNotString { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x"], "choice_descriptions": ["d"]}}"#,
            "a.choice_descriptions",
            |k| matches!(k, K::ChoiceDescriptionsNotObject { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x"], "choice_descriptions": {"y": "d"}}}"#,
            "a.choice_descriptions.y",
            |k| matches!(k, K::ChoiceDescriptionUnknown { .. }),
        ),
        (
            r#"{"a": {"type": "enum", "choices": ["x"], "choice_descriptions": {"x": 1}}}"#,
            "a.choice_descriptions.x",
            |k| matches!(k, K::ChoiceDescriptionNotString { .. }),
        ),
        (
            r#"{"a": {"type": "boolean", "choices": [true]}}"#,
            "a.choices",
            |k| matches!(k, K::BadBooleanChoices),
        ),
        (
            r#"{"a": {"type": "boolean", "choices": [true, true]}}"#,
            "a.choices",
            |k| matches!(k, K::DuplicateChoice { .. }),
        ),
        (
            r#"{"a": {"type": "boolean", "choices": ["true", "false"]}}"#,
            "a.choices",
            |k| matches!(k, K::BadBooleanChoices),
        ),
        (
            r#"{"a": {"type": "boolean", "choices": [false, true, false]}}"#,
            "a.choices",
            |k| matches!(k, K::BadBooleanChoices),
        ),
        (
            r#"{"a": {"type": "boolean", "choice_descriptions": {"yes": "d"}}}"#,
            "a.choice_descriptions.yes",
            |k| matches!(k, K::ChoiceDescriptionUnknown { .. }),
        ),
        (
            r#"{"a": {"type": "object", "properties": {}}}"#,
            "a.type",
            |k| matches!(k, K::NestedObject),
        ),
        (r#"{"a": {"type": "array", "items": {}}}"#, "a.type", |k| {
            matches!(k, K::Array)
        }),
        (
            r#"{"a": {"type": "number", "minimum": 0}}"#,
            "a.type",
            |k| matches!(k, K::Number { .. }),
        ),
        // Field names.
        (r#"{"": {"type": "boolean"}}"#, "", |k| {
            matches!(k, K::InvalidFieldName { .. })
        }),
        (r#"{" a": {"type": "boolean"}}"#, " a", |k| {
            matches!(k, K::InvalidFieldName { .. })
        }),
        ("{\"a\\nb\": {\"type\": \"boolean\"}}", "a\nb", |k| {
            matches!(k, K::InvalidFieldName { .. })
        }),
        // JSON Schema form.
        (r#"{"type": "object"}"#, "<root>", |k| matches!(k, K::Empty)),
        (r#"{"type": "object", "properties": {}}"#, "<root>", |k| {
            matches!(k, K::Empty)
        }),
        (
            r#"{"type": "object", "properties": []}"#,
            "properties",
            |k| matches!(k, K::PropertiesNotObject { .. }),
        ),
        (
            r#"{"type": "array", "properties": {"a": {"type": "boolean"}}}"#,
            "type",
            |k| matches!(k, K::BadAnnotation { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean"}}, "patternProperties": {}}"#,
            "patternProperties",
            |k| matches!(k, K::UnknownKey { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["b"]}"#,
            "required[0]",
            |k| matches!(k, K::RequiredUnknown { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": "a"}"#,
            "required",
            |k| matches!(k, K::RequiredNotNames),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": {}}"#,
            "additionalProperties",
            |k| matches!(k, K::BadAnnotation { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}"#,
            "properties.a.type",
            |k| matches!(k, K::NestedObject),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "object"}}}"#,
            "properties.a.type",
            |k| matches!(k, K::NestedObject),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}}"#,
            "properties.a.type",
            |k| matches!(k, K::Array),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "array"}}}"#,
            "properties.a.type",
            |k| matches!(k, K::Array),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "number"}}}"#,
            "properties.a.type",
            |k| matches!(k, K::Number { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "string"}}}"#,
            "properties.a",
            |k| matches!(k, K::StringWithoutEnum),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}"#,
            "properties.a.maxLength",
            |k| matches!(k, K::UnknownKey { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {}}}"#,
            "properties.a",
            |k| matches!(k, K::MissingType),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"enum": [1, 2]}}}"#,
            "properties.a.enum[0]",
            |k| matches!(k, K::ChoiceNotString { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "string", "enum": ["x", "x"]}}}"#,
            "properties.a.enum[1]",
            |k| matches!(k, K::DuplicateChoice { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "string", "enum": []}}}"#,
            "properties.a.enum",
            |k| matches!(k, K::NoChoices),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean", "enum": [true]}}}"#,
            "properties.a.enum",
            |k| matches!(k, K::BadBooleanChoices),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": "boolean", "title": 3}}}"#,
            "properties.a.title",
            |k| matches!(k, K::BadAnnotation { .. }),
        ),
        (
            r#"{"type": "object", "properties": {"a": {"type": ["string", "null"], "enum": ["x"]}}}"#,
            "properties.a.type",
            |k| matches!(k, K::TypeNotString { .. }),
        ),
    ];
    assert!(cases.len() >= 40, "the table must hold at least 40 cases");
    for (text, path, ok) in cases {
        check(text, path, ok);
    }
}

#[test]
fn a_flat_field_named_properties_or_type_is_a_field() {
    let s = Schema::from_json_str(r#"{"properties": {"type": "enum", "choices": ["a", "b"]}}"#)
        .unwrap();
    assert_eq!(s.fields()[0].name, "properties");
    let s = Schema::from_json_str(r#"{"type": {"type": "boolean"}, "x": {"type": "boolean"}}"#)
        .unwrap();
    assert_eq!(s.fields()[0].name, "type");
    // A JSON Schema whose only property is named `type` is still a JSON Schema.
    let s = Schema::from_json_str(r#"{"properties": {"type": {"enum": ["a"]}}}"#).unwrap();
    assert_eq!(s.fields()[0].name, "type");
}

#[test]
fn more_than_26_choices_point_to_literal_scoring() {
    let choices: Vec<String> = (0..27).map(|i| format!("c{i}")).collect();
    let text = serde_json::json!({"a": {"type": "enum", "choices": choices}}).to_string();
    let err = Schema::from_json_str(&text).unwrap_err();
    assert_eq!(err.kind, K::TooManyChoices { count: 27 });
    assert!(err.to_string().contains("literal-choice scoring"), "{err}");
    let example = include_str!("../../fixtures/examples/high_cardinality_255.json");
    let err = Schema::from_json_str(example).unwrap_err();
    assert_eq!(err.kind, K::TooManyChoices { count: 255 });
}

#[test]
fn literal_scoring_lifts_the_26_choice_limit_from_the_field_the_root_or_the_request() {
    use forkscore_engine::schema::{LiteralMethod, Scoring};
    let example = include_str!("../../fixtures/examples/high_cardinality_255.json");
    let literal = Scoring::Literal(LiteralMethod::Exact);
    let s = Schema::from_json_str_with(example, literal).unwrap();
    assert_eq!(s.fields()[0].choices.len(), 255);
    assert_eq!(s.fields()[0].scoring, literal);
    let choices: Vec<String> = (0..27).map(|i| format!("c{i}")).collect();
    let field = serde_json::json!({"a": {"type": "enum", "choices": choices, "scoring": "literal-first-token"}});
    let s = Schema::from_json_str(&field.to_string()).unwrap();
    assert_eq!(
        s.fields()[0].scoring,
        Scoring::Literal(LiteralMethod::FirstToken)
    );
    let root = serde_json::json!({"scoring": "literal", "a": {"type": "enum", "choices": choices}});
    let s = Schema::from_json_str(&root.to_string()).unwrap();
    assert_eq!((s.fields().len(), s.fields()[0].scoring), (1, literal));
    // A field's own scoring wins over the root's; code scoring keeps its limit.
    let mixed = serde_json::json!({"scoring": "literal", "a": {"type": "enum", "choices": choices, "scoring": "code"}});
    let err = Schema::from_json_str(&mixed.to_string()).unwrap_err();
    assert_eq!(err.kind, K::TooManyChoices { count: 27 });
    let bad = serde_json::json!({"a": {"type": "boolean", "scoring": "literally"}});
    let err = Schema::from_json_str(&bad.to_string()).unwrap_err();
    assert_eq!(err.path, "a.scoring");
    assert!(err.to_string().contains("\"literal\""), "{err}");
    // Code-scored schemas hash as before; literal scoring is part of the hash.
    let plain = Schema::from_json_str(r#"{"a": {"type": "boolean"}}"#).unwrap();
    let lit = Schema::from_json_str(r#"{"a": {"type": "boolean", "scoring": "literal"}}"#).unwrap();
    assert_ne!(plain.hash(), lit.hash());
}

#[test]
fn flat_and_json_schema_forms_agree() {
    let flat = Schema::from_json_str(
        r#"{"risk": {"type": "enum", "choices": ["low", "high"], "description": "Risk.",
                     "choice_descriptions": {"high": "bad"}},
            "review": {"type": "boolean", "choices": [true, false]}}"#,
    )
    .unwrap();
    let js = Schema::from_json_str(
        r#"{"type": "object", "required": ["risk"], "additionalProperties": false,
            "properties": {"risk": {"type": "string", "enum": ["low", "high"], "description": "Risk.",
                                    "choice_descriptions": {"high": "bad"}},
                           "review": {"type": "boolean", "enum": [true, false]}}}"#,
    )
    .unwrap();
    assert_eq!(flat, js);
    assert_eq!(flat.hash(), js.hash());
    let f = &flat.fields()[1];
    assert_eq!(f.kind, FieldKind::Boolean);
    assert_eq!(f.choices, vec![Choice::Bool(true), Choice::Bool(false)]);
    assert_eq!(
        flat.fields()[0].choice_descriptions,
        vec![None, Some("bad".to_string())]
    );
}

#[test]
fn booleans_default_to_false_true_and_field_order_is_kept() {
    let s = Schema::from_json_str(
        r#"{"z": {"type": "boolean"}, "a": {"enum": ["x"], "type": "enum", "choices": ["x"]}}"#,
    );
    assert!(s.is_err(), "flat fields reject `enum`");
    let s = Schema::from_json_str(
        r#"{"z": {"type": "boolean"}, "a": {"type": "enum", "choices": ["x"]}}"#,
    )
    .unwrap();
    assert_eq!(s.fields()[0].name, "z");
    assert_eq!(
        s.fields()[0].choices,
        vec![Choice::Bool(false), Choice::Bool(true)]
    );
    let s = Schema::from_json_str(
        r#"{"type":"object","properties":{"b":{"enum":["p","q"]},"a":{"type":"boolean"}}}"#,
    )
    .unwrap();
    assert_eq!(
        s.fields()
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["b", "a"]
    );
}

#[test]
fn every_example_schema_within_the_code_limit_parses() {
    for text in [
        include_str!("../../fixtures/examples/parallel_schema.json"),
        include_str!("../../fixtures/examples/priority_defined_schema.json"),
        include_str!("../../fixtures/examples/fintech_fraud.json"),
        include_str!("../../fixtures/examples/code_security.json"),
        include_str!("../../fixtures/examples/support_triage.json"),
    ] {
        Schema::from_json_str(text).unwrap();
    }
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i32>().prop_map(|i| serde_json::json!(i)),
        prop_oneof![
            Just("enum"),
            Just("boolean"),
            Just("object"),
            Just("string"),
            Just(""),
            Just("x")
        ]
        .prop_map(|s| serde_json::Value::String(s.to_string())),
        "[a-z ]{0,6}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        let key = prop_oneof![
            Just("type".to_string()),
            Just("choices".to_string()),
            Just("enum".to_string()),
            Just("properties".to_string()),
            Just("description".to_string()),
            Just("choice_descriptions".to_string()),
            Just("required".to_string()),
            "[a-z]{1,4}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec((key, inner), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_json_never_panics_the_parser(v in arb_json()) {
        let text = v.to_string();
        let _ = Schema::from_json_str(&text);
        let _ = Schema::from_value(&v);
    }

    #[test]
    fn arbitrary_text_never_panics_the_parser(text in "\\PC{0,64}") {
        let _ = Schema::from_json_str(&text);
    }
}
