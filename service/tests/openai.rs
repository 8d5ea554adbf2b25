//! The OpenAI-compatible routes on the fake backend with the real Qwen2.5 tokenizer: a chat
//! completion carries exactly the `/v1/score` decision of the same context (content, extension
//! field, log-probs), every refusal is OpenAI's error shape naming the parameter, `/v1/models`
//! lists the served model, a pydantic-style schema (enums under `$defs`) is inlined.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkscore_service::{router, AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use proptest::prelude::*;
use serde_json::{json, Value};
use tower::ServiceExt;

mod common;

const MODEL: &str = "fake-org/fake-model";

fn app() -> axum::Router {
    let provenance = json!({"model_id": MODEL, "revision": "test"})
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

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map_or(Body::empty(), |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("{method} {path}: body is not JSON: {bytes:?}"));
    (status, headers, value)
}

/// The example incident schema in JSON Schema form (as an OpenAI client sends it).
fn json_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "risk_level": {"type": "string", "enum": ["low", "medium", "high", "critical"],
                           "description": "Operational risk of the incident described in the context."},
            "requires_review": {"type": "boolean",
                                "description": "Whether the incident requires immediate human review."},
            "impact_scope": {"type": "string", "enum": ["single_user", "team", "all_customers"],
                             "description": "Who is affected."}
        },
        "required": ["risk_level", "requires_review", "impact_scope"],
        "additionalProperties": false
    })
}

fn chat(messages: Value) -> Value {
    json!({
        "model": MODEL,
        "messages": messages,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "incident", "schema": json_schema(), "strict": true}},
    })
}

const SYSTEM: &str = "Classify the incident.";
const USER: &str = "The payment service is down for every customer.";

#[tokio::test]
async fn a_chat_completion_is_the_score_decision_of_the_system_and_user_text() {
    let app = app();
    let body = chat(json!([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": USER},
    ]));
    let (status, _, got) = call(&app, "POST", "/v1/chat/completions", Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    // the same decision through /v1/score, the context being the two texts joined
    let score = json!({"context": format!("{SYSTEM}\n\n{USER}"), "schema": json_schema()});
    let (status, _, want) = call(&app, "POST", "/v1/score", Some(&score)).await;
    assert_eq!(status, StatusCode::OK, "{want}");

    assert_eq!(got["object"], "chat.completion");
    assert_eq!(got["model"], MODEL);
    assert!(got["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(got["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &got["choices"][0];
    assert_eq!(got["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["logprobs"], Value::Null, "not asked for");
    let content: Value =
        serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, want["output"]);
    let keys: Vec<&String> = content.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["risk_level", "requires_review", "impact_scope"]);
    // the extension field is the /v1/score result
    assert_eq!(got["forkscore"]["output"], want["output"]);
    assert_eq!(got["forkscore"]["fields"], want["fields"]);
    assert_eq!(got["forkscore"]["provenance"], want["provenance"]);
    let t = &want["telemetry"];
    let suffix: u64 = t["suffix_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    let prompt = t["prefix_tokens"].as_u64().unwrap() + suffix;
    assert_eq!(
        got["usage"],
        json!({"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt})
    );
}

#[tokio::test]
async fn text_parts_equal_a_string_content_and_ignored_sampling_parameters_change_nothing() {
    let app = app();
    let plain = chat(json!([{"role": "user", "content": "line one\nline two"}]));
    let mut parts = chat(json!([{"role": "user", "content": [
        {"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]}]));
    for (k, v) in [
        ("temperature", json!(0)),
        ("top_p", json!(1)),
        ("seed", json!(7)),
        ("max_tokens", json!(5)),
        ("n", json!(1)),
        ("stream", json!(false)),
        ("user", json!("u")),
        ("logprobs", json!(null)),
    ] {
        parts[k] = v;
    }
    let (s1, _, a) = call(&app, "POST", "/v1/chat/completions", Some(&plain)).await;
    let (s2, _, b) = call(&app, "POST", "/v1/chat/completions", Some(&parts)).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{a}\n{b}");
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
    assert_eq!(a["forkscore"]["fields"], b["forkscore"]["fields"]);
}

#[tokio::test]
async fn logprobs_list_each_fields_choice_and_its_most_probable_alternatives() {
    let app = app();
    let mut body = chat(json!([{"role": "user", "content": USER}]));
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let (status, _, got) = call(&app, "POST", "/v1/chat/completions", Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let entries = got["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let fields = got["forkscore"]["fields"].as_object().unwrap();
    assert_eq!(entries.len(), fields.len());
    for (entry, (name, field)) in entries.iter().zip(fields) {
        let value = &field["value"];
        let token = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_string);
        assert_eq!(entry["token"], token, "{name}");
        assert_eq!(entry["bytes"], json!(token.as_bytes()), "{name}");
        let p = field["scores"][&token].as_f64().unwrap();
        assert!(
            (entry["logprob"].as_f64().unwrap() - p.ln()).abs() < 1e-12,
            "{name}"
        );
        let top = entry["top_logprobs"].as_array().unwrap();
        let choices = field["scores"].as_object().unwrap();
        assert_eq!(top.len(), choices.len().min(2), "{name}");
        let mut best: Vec<f64> = choices.values().map(|v| v.as_f64().unwrap().ln()).collect();
        best.sort_by(|a, b| b.total_cmp(a));
        for (t, want) in top.iter().zip(best) {
            assert!(
                (t["logprob"].as_f64().unwrap() - want).abs() < 1e-12,
                "{name}: {t}"
            );
            let p = choices[t["token"].as_str().unwrap()].as_f64().unwrap();
            assert!((p.ln() - want).abs() < 1e-12);
        }
        // the decision is the argmax: the chosen value leads the list
        assert_eq!(top[0]["logprob"], entry["logprob"], "{name}");
    }
    // logprobs without top_logprobs: the chosen values only
    body["top_logprobs"] = Value::Null;
    let (_, _, got) = call(&app, "POST", "/v1/chat/completions", Some(&body)).await;
    for entry in got["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        assert_eq!(entry["top_logprobs"], json!([]));
    }
}

#[tokio::test]
async fn forkscore_options_reach_the_engine() {
    let app = app();
    let mut body = chat(json!([{"role": "user", "content": USER}]));
    body["forkscore_options"] = json!({"scoring": "literal", "temperature": 2.0});
    let (status, _, got) = call(&app, "POST", "/v1/chat/completions", Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["forkscore"]["temperature"]["value"], 2.0);
    for (name, f) in got["forkscore"]["fields"].as_object().unwrap() {
        assert_eq!(f["scoring"], "literal", "{name}");
    }
}

#[tokio::test]
async fn a_pydantic_schema_with_enums_under_defs_is_decided_as_its_inlined_form() {
    let app = app();
    let messages = json!([{"role": "user", "content": USER}]);
    let mut pydantic = chat(messages.clone());
    pydantic["response_format"]["json_schema"]["schema"] = json!({
        "$defs": {"Risk": {"enum": ["low", "medium", "high", "critical"], "title": "Risk", "type": "string"}},
        "properties": {"risk_level": {"$ref": "#/$defs/Risk"},
                       "requires_review": {"title": "Requires Review", "type": "boolean"}},
        "required": ["risk_level", "requires_review"], "title": "Incident", "type": "object",
        "additionalProperties": false
    });
    let mut inline = chat(messages);
    inline["response_format"]["json_schema"]["schema"] = json!({
        "properties": {"risk_level": {"enum": ["low", "medium", "high", "critical"], "type": "string"},
                       "requires_review": {"type": "boolean"}},
        "type": "object"
    });
    let (s1, _, a) = call(&app, "POST", "/v1/chat/completions", Some(&pydantic)).await;
    let (s2, _, b) = call(&app, "POST", "/v1/chat/completions", Some(&inline)).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{a}\n{b}");
    assert_eq!(a["forkscore"]["fields"], b["forkscore"]["fields"]);
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );
}

/// Each refusal: status, OpenAI error `type`, `code`, `param`, and a word of the message.
#[tokio::test]
async fn every_refusal_is_an_openai_error_naming_the_parameter() {
    let app = app();
    let user = json!([{"role": "user", "content": USER}]);
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut b = chat(user.clone());
        edit(&mut b);
        b
    };
    let cases: Vec<(Value, u16, &str, Value, &str)> = vec![
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("response_format");
            }),
            400,
            "missing_response_format",
            json!("response_format"),
            "json_schema",
        ),
        (
            with(&|b| b["response_format"] = json!({"type": "text"})),
            400,
            "unsupported_response_format",
            json!("response_format.type"),
            "\"text\"",
        ),
        (
            with(&|b| b["response_format"] = json!({"type": "json_object"})),
            400,
            "unsupported_response_format",
            json!("response_format.type"),
            "json_object",
        ),
        (
            with(&|b| {
                b["response_format"]["json_schema"]["schema"]["properties"]["note"] =
                    json!({"type": "string"})
            }),
            400,
            "invalid_schema",
            json!("response_format.json_schema.schema.properties.note"),
            "free text cannot be scored",
        ),
        (
            with(&|b| {
                b["response_format"]["json_schema"]["schema"]["properties"]["n"] =
                    json!({"type": "integer"})
            }),
            400,
            "invalid_schema",
            json!("response_format.json_schema.schema.properties.n.type"),
            "not supported",
        ),
        (
            with(&|b| {
                b["response_format"]["json_schema"]["schema"] =
                    json!({"urgent": {"type": "boolean"}})
            }),
            400,
            "invalid_schema",
            json!("response_format.json_schema.schema"),
            "\"type\": \"object\"",
        ),
        (
            with(&|b| {
                b["response_format"]["json_schema"]
                    .as_object_mut()
                    .unwrap()
                    .remove("name");
            }),
            400,
            "missing_required_parameter",
            json!("response_format.json_schema.name"),
            "required",
        ),
        (
            with(&|b| b["stream"] = json!(true)),
            400,
            "unsupported_parameter",
            json!("stream"),
            "not supported",
        ),
        (
            with(&|b| b["n"] = json!(2)),
            400,
            "unsupported_value",
            json!("n"),
            "n must be 1",
        ),
        (
            with(&|b| b["model"] = json!("gpt-4o")),
            404,
            "model_not_found",
            json!("model"),
            MODEL,
        ),
        (
            with(&|b| {
                b.as_object_mut().unwrap().remove("model");
            }),
            400,
            "missing_required_parameter",
            json!("model"),
            MODEL,
        ),
        (
            with(&|b| b["tools"] = json!([])),
            400,
            "unsupported_parameter",
            json!("tools"),
            "tools",
        ),
        (
            with(&|b| b["frobnicate"] = json!(1)),
            400,
            "unknown_parameter",
            json!("frobnicate"),
            "frobnicate",
        ),
        (
            with(&|b| b["temperature"] = json!(3)),
            400,
            "invalid_value",
            json!("temperature"),
            "0 to 2",
        ),
        (
            with(&|b| b["top_logprobs"] = json!(3)),
            400,
            "invalid_value",
            json!("top_logprobs"),
            "logprobs: true",
        ),
        (
            with(&|b| {
                b["logprobs"] = json!(true);
                b["top_logprobs"] = json!(21)
            }),
            400,
            "invalid_value",
            json!("top_logprobs"),
            "0 to 20",
        ),
        (
            with(&|b| b["messages"] = json!([{"role": "system", "content": "only a system"}])),
            400,
            "invalid_value",
            json!("messages"),
            "no user message",
        ),
        (
            with(&|b| {
                b["messages"] = json!([{"role": "user", "content": "q"},
                                       {"role": "assistant", "content": "a"}])
            }),
            400,
            "unsupported_message_role",
            json!("messages[1].role"),
            "assistant",
        ),
        (
            with(&|b| {
                b["messages"] = json!([{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
            }),
            400,
            "unsupported_content",
            json!("messages[0].content[0].type"),
            "image_url",
        ),
        (
            with(&|b| b["messages"] = json!([])),
            400,
            "invalid_value",
            json!("messages"),
            "empty",
        ),
        (
            with(&|b| b["messages"] = json!([{"role": "user", "content": ""}])),
            400,
            "empty_context",
            json!("messages"),
            "",
        ),
        (
            with(&|b| b["forkscore_options"] = json!({"scoring": "vibes"})),
            400,
            "options",
            json!("forkscore_options.scoring"),
            "literal-sum-loglik",
        ),
        (
            json!([1, 2]),
            400,
            "invalid_type",
            Value::Null,
            "JSON object",
        ),
    ];
    for (body, status, code, param, needle) in cases {
        let (got_status, _, got) = call(&app, "POST", "/v1/chat/completions", Some(&body)).await;
        let e = &got["error"];
        assert_eq!(got_status.as_u16(), status, "{body}\n→ {got}");
        assert_eq!(e["type"], "invalid_request_error", "{got}");
        assert_eq!(e["code"], code, "{body}\n→ {got}");
        assert_eq!(e["param"], param, "{body}\n→ {got}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{needle:?} not in {got}"
        );
    }
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let app = app();
    let (status, _, got) = call(&app, "GET", "/v1/models", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["object"], "list");
    let data = got["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["id"], MODEL);
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["owned_by"], "forkscore");
    assert!(data[0]["created"].as_u64().unwrap() > 1_600_000_000);
}

/// One runtime and app for every proptest case (loading the tokenizer once).
fn shared() -> &'static (tokio::runtime::Runtime, axum::Router) {
    static APP: std::sync::OnceLock<(tokio::runtime::Runtime, axum::Router)> =
        std::sync::OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let app = rt.block_on(async { app() });
        (rt, app)
    })
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z_ ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A chat request with any one top-level key (or message, or schema property) replaced by
    /// arbitrary JSON is a 200 or a 4xx in OpenAI's shape, never a 5xx.
    #[test]
    fn a_mangled_chat_request_is_never_a_5xx(
        key in prop::sample::select(&["model", "messages", "response_format", "logprobs",
            "top_logprobs", "n", "stream", "temperature", "forkscore_options", "stop"][..]),
        v in any_json(),
        property in any_json(),
    ) {
        let (rt, app) = shared();
        let mut body = chat(json!([{"role": "user", "content": USER}]));
        body[key] = v;
        let mut other = chat(json!([{"role": "user", "content": USER}]));
        other["response_format"]["json_schema"]["schema"]["properties"]["x"] = property;
        for b in [body, other] {
            let (status, _, got) = rt.block_on(call(app, "POST", "/v1/chat/completions", Some(&b)));
            prop_assert!(status == StatusCode::OK || status.is_client_error(), "{status}: {b} → {got}");
            if status != StatusCode::OK {
                prop_assert!(got["error"]["message"].is_string(), "{got}");
                prop_assert!(got["error"]["code"].is_string(), "{got}");
                prop_assert_eq!(&got["error"]["type"], "invalid_request_error");
            }
        }
    }
}
