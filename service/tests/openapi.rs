//! The generated OpenAPI document against the server itself: real responses of every JSON
//! route (fake backend, real Qwen2.5 tokenizer) validate against the schemas the document gives
//! them, the result type is typed down to each field's per-choice probabilities, and the
//! request schemas name exactly the keys the hand-written parsers accept.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkscore_engine::schema::Scoring;
use forkscore_engine::Mode;
use forkscore_engine::OPTIONS;
use forkscore_service::openapi::types::ScoringName;
use forkscore_service::request::Endpoint;
use forkscore_service::{router, AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use tower::ServiceExt;

mod common;

fn app() -> axum::Router {
    let provenance = json!({"model_id": "fake-org/fake-model", "revision": "test"})
        .as_object()
        .unwrap()
        .clone();
    let (state, _) = AppState::start(
        common::engine_on(FakeBackend::new(1)),
        provenance,
        ServeConfig::default(),
    )
    .expect("model thread");
    router(state)
}

fn doc() -> Value {
    serde_json::from_str(forkscore_service::openapi::document_json()).unwrap()
}

fn schema() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/examples/parallel_schema.json"),
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

async fn call(app: &axum::Router, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{method} {path}: body is not JSON: {bytes:?}"));
    (status, value)
}

/// The schema the document gives `method path`'s answer with `status`, as a validator whose
/// root holds the document's components (so that its `$ref`s resolve).
fn response_validator(doc: &Value, method: &str, path: &str, status: u16) -> jsonschema::Validator {
    let media = &doc["paths"][path][method]["responses"][status.to_string()]["content"]
        ["application/json"]["schema"];
    assert!(
        media.is_object(),
        "{method} {path} {status}: no JSON schema in the document"
    );
    let mut root = media.clone();
    root["components"] = doc["components"].clone();
    jsonschema::draft202012::new(&root).expect("the generated schema compiles")
}

fn assert_valid(doc: &Value, method: &str, path: &str, status: u16, body: &Value) {
    let v = response_validator(doc, method, path, status);
    let errors: Vec<String> = v
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: the response does not match the document:\n{}\n{body:#}",
        errors.join("\n")
    );
}

#[tokio::test]
async fn real_responses_validate_against_the_generated_schemas() {
    let app = app();
    let doc = doc();
    let context = "The payment service is down for every customer.";

    let (status, score) = call(
        &app,
        "POST",
        "/v1/score",
        Some(json!({"context": context, "schema": schema(),
                    "options": {"allowed_mass": true, "top_k": 2, "include_prompt": true}})),
    )
    .await;
    assert_eq!(status, 200, "{score}");
    assert_valid(&doc, "post", "/v1/score", 200, &score);

    // the validation has teeth: a result without per-field probabilities is refused
    let mut broken = score.clone();
    let field = broken["fields"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    broken["fields"][&field]
        .as_object_mut()
        .unwrap()
        .remove("scores");
    assert!(!response_validator(&doc, "post", "/v1/score", 200).is_valid(&broken));
    let mut broken = score.clone();
    broken["fields"][&field]["scores"] = json!({"low": "high"});
    assert!(!response_validator(&doc, "post", "/v1/score", 200).is_valid(&broken));
    let mut broken = score.clone();
    broken.as_object_mut().unwrap().remove("provenance");
    assert!(!response_validator(&doc, "post", "/v1/score", 200).is_valid(&broken));

    let (status, many) = call(
        &app,
        "POST",
        "/v1/decide_many",
        Some(json!({"contexts": [context, "A typo on the pricing page."], "schema": schema()})),
    )
    .await;
    assert_eq!(status, 200, "{many}");
    assert_valid(&doc, "post", "/v1/decide_many", 200, &many);

    let (status, ask) = call(
        &app,
        "POST",
        "/v1/ask",
        Some(json!({"context": context, "question": "Is it urgent?"})),
    )
    .await;
    assert_eq!(status, 200, "{ask}");
    assert_valid(&doc, "post", "/v1/ask", 200, &ask);

    let (status, generated) = call(
        &app,
        "POST",
        "/v1/generate",
        Some(json!({"context": context, "schema": schema(), "max_new_tokens": 4})),
    )
    .await;
    assert_eq!(status, 200, "{generated}");
    assert_valid(&doc, "post", "/v1/generate", 200, &generated);

    let (status, refused) = call(&app, "POST", "/v1/score", Some(json!({"context": "x"}))).await;
    assert_eq!(status, 400, "{refused}");
    assert_valid(&doc, "post", "/v1/score", 400, &refused);

    for (path, status) in [("/health", 200), ("/v1/presets", 200), ("/v1/models", 200)] {
        let (got, body) = call(&app, "GET", path, None).await;
        assert_eq!(got, status, "{path}: {body}");
        assert_valid(&doc, "get", path, status, &body);
    }

    let chat = json!({
        "model": "fake-org/fake-model",
        "messages": [{"role": "user", "content": context}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "incident", "schema": {
            "type": "object",
            "properties": {"urgent": {"type": "boolean"},
                           "scope": {"type": "string", "enum": ["one", "many"]}}}}},
        "logprobs": true,
        "top_logprobs": 2,
    });
    let (status, completion) = call(&app, "POST", "/v1/chat/completions", Some(chat)).await;
    assert_eq!(status, 200, "{completion}");
    assert_valid(&doc, "post", "/v1/chat/completions", 200, &completion);
    let (status, refused) = call(
        &app,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": "fake-org/fake-model", "messages": []})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_valid(&doc, "post", "/v1/chat/completions", 400, &refused);
}

/// The property names of a component schema, following `allOf` (flattened fields).
fn properties(doc: &Value, name: &str) -> BTreeSet<String> {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no component {name}");
    let mut keys: BTreeSet<String> = schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        if let Some(r) = part["$ref"].as_str() {
            keys.extend(properties(
                doc,
                r.trim_start_matches("#/components/schemas/"),
            ));
        }
        if let Some(p) = part["properties"].as_object() {
            keys.extend(p.keys().cloned());
        }
    }
    keys
}

#[test]
fn the_result_type_is_typed_down_to_per_choice_probabilities() {
    let doc = doc();
    let result = properties(&doc, "ScoreResult");
    for key in ["output", "fields", "temperature", "telemetry", "provenance"] {
        assert!(result.contains(key), "ScoreResult lacks {key}: {result:?}");
    }
    let field = &doc["components"]["schemas"]["FieldResult"];
    let required: BTreeSet<&str> = field["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for key in ["value", "type", "choices", "scores", "logits"] {
        assert!(required.contains(key), "FieldResult: {key} not required");
    }
    // scores: a map from choice to a number (the probability)
    let scores = &field["properties"]["scores"];
    assert_eq!(scores["type"], "object", "{scores}");
    assert_eq!(scores["additionalProperties"]["type"], "number", "{scores}");
}

#[test]
fn request_schemas_name_exactly_the_keys_the_parsers_accept() {
    let doc = doc();
    for (endpoint, name) in [
        (Endpoint::Score, "ScoreRequest"),
        (Endpoint::DecideMany, "DecideManyRequest"),
        (Endpoint::Ask, "AskRequest"),
        (Endpoint::Generate, "GenerateRequest"),
    ] {
        let parser: BTreeSet<String> = endpoint.keys().iter().map(|k| k.to_string()).collect();
        assert_eq!(properties(&doc, name), parser, "{name}");
    }
    let options: BTreeSet<String> = OPTIONS.iter().map(|o| o.name.to_string()).collect();
    assert_eq!(properties(&doc, "Options"), options);
    // every scoring name and mode the document offers is one the parser takes
    for s in ScoringName::ALL {
        let name = serde_json::to_value(s).unwrap();
        let name = name.as_str().unwrap();
        assert!(name.parse::<Scoring>().is_ok(), "{name}");
    }
    let modes = doc["components"]["schemas"]["Mode"]["enum"]
        .as_array()
        .expect("Mode is an enum");
    assert!(!modes.is_empty());
    for m in modes {
        let m = m.as_str().unwrap();
        assert!(m.parse::<Mode>().is_ok(), "{m}");
    }
}

#[tokio::test]
async fn an_unknown_route_is_json_the_document_describes() {
    // the 404 body is the service's error shape (the document's ErrorBody)
    let (status, body) = call(&app(), "GET", "/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND.as_u16());
    let mut root = json!({"$ref": "#/components/schemas/ErrorBody"});
    root["components"] = doc()["components"].clone();
    assert!(
        jsonschema::draft202012::new(&root).unwrap().is_valid(&body),
        "{body}"
    );
}

#[test]
fn the_request_schema_and_the_parser_agree_on_sample_bodies() {
    let mut root = json!({"$ref": "#/components/schemas/ScoreRequest"});
    root["components"] = doc()["components"].clone();
    let validator = jsonschema::draft202012::new(&root).unwrap();
    let cfg = ServeConfig::default();
    for (body, ok) in [
        (json!({"context": "x", "schema": schema()}), true),
        (
            json!({"context": "x", "schema": schema(), "options": {
                "mode": "tree", "scoring": "literal-first-token", "allowed_mass": true,
                "top_k": 3, "temperature": 0.5, "max_input_tokens": 512}}),
            true,
        ),
        (
            json!({"context": "x", "schema": schema(), "options": null}),
            false,
        ),
        (
            json!({"context": "x", "schema": schema(), "extra": 1}),
            false,
        ),
        (json!({"schema": schema()}), false),
        (
            json!({"context": "x", "schema": schema(), "options": {"mode": "fast"}}),
            false,
        ),
        (
            json!({"context": "x", "schema": schema(), "options": {"temperature": 0}}),
            false,
        ),
        (
            json!({"context": "x", "schema": schema(), "options": {"top_k": 2000}}),
            false,
        ),
    ] {
        assert_eq!(validator.is_valid(&body), ok, "schema on {body}");
        let parsed =
            forkscore_service::request::parse(Endpoint::Score, body.to_string().as_bytes(), &cfg);
        assert_eq!(parsed.is_ok(), ok, "parser on {body}: {parsed:?}");
    }
}
