//! Property: whatever the body, a scoring route answers 200 or a 4xx with a typed error — never
//! a 5xx, never a panic. Bodies are arbitrary bytes and arbitrary JSON built from the keys the
//! routes know (so many cases get deep into validation), on the fake backend.

mod common;

use axum::body::Body;
use axum::http::Request;
use forkscore_service::{router, AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use tower::ServiceExt;

fn app() -> &'static (tokio::runtime::Runtime, axum::Router) {
    static APP: OnceLock<(tokio::runtime::Runtime, axum::Router)> = OnceLock::new();
    APP.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let model = json!({"model_id": "fake"}).as_object().unwrap().clone();
        let (state, _) = AppState::start(
            common::engine_on(FakeBackend::new(3)),
            model,
            ServeConfig {
                max_body_bytes: 16 << 10,
                max_contexts_per_request: 4,
                ..ServeConfig::default()
            },
        )
        .unwrap();
        (rt, router(state))
    })
}

const KEYS: &[&str] = &[
    "context",
    "contexts",
    "schema",
    "question",
    "options",
    "type",
    "choices",
    "description",
    "mode",
    "temperature",
    "max_input_tokens",
    "field_batch_size",
    "allowed_mass",
    "top_k",
    "properties",
    "enum",
    "f",
];

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|x| json!(x)),
        prop_oneof![
            Just("".to_string()),
            Just("enum".to_string()),
            Just("boolean".to_string()),
            Just("parallel".to_string()),
            "[a-z <|>]{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..5).prop_map(|kv| {
                Value::Object(
                    kv.into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    })
}

fn status_of(path: &str, body: Vec<u8>) -> (u16, Value) {
    let (rt, app) = app();
    rt.block_on(async {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    })
}

fn check(status: u16, body: &Value) -> Result<(), TestCaseError> {
    prop_assert!(
        status == 200 || (400..500).contains(&status),
        "{status}: {body}"
    );
    if status != 200 {
        prop_assert!(body["error"]["kind"].is_string(), "{body}");
        prop_assert!(body["error"]["path"].is_string(), "{body}");
    }
    // a decide_many entry's error is the input's fault too, never the server's
    for entry in body["results"].as_array().into_iter().flatten() {
        let kind = entry["error"]["kind"].as_str();
        prop_assert!(
            !matches!(kind, Some("backend" | "non_finite_logits")),
            "{entry}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_is_never_a_5xx(
        route in prop::sample::select(&["/v1/score", "/v1/decide_many", "/v1/ask", "/v1/generate"][..]),
        v in value(),
    ) {
        let (status, body) = status_of(route, serde_json::to_vec(&v).unwrap());
        check(status, &body)?;
    }

    #[test]
    fn near_valid_requests_are_never_a_5xx(
        context in "[a-z <|>#\\n]{0,40}",
        choices in value(),
        options in value(),
        field_type in prop::sample::select(&["enum", "boolean", "number"][..]),
    ) {
        let body = json!({
            "context": context,
            "schema": {"f": {"type": field_type, "choices": choices}},
            "options": options,
        });
        let (status, out) = status_of("/v1/score", serde_json::to_vec(&body).unwrap());
        check(status, &out)?;
        let mut many = body.clone();
        if let Some(o) = many.as_object_mut() {
            let c = o.remove("context").unwrap_or(Value::Null);
            o.insert("contexts".into(), json!([c, "", "x"]));
        }
        let (status, out) = status_of("/v1/decide_many", serde_json::to_vec(&many).unwrap());
        check(status, &out)?;
    }

    #[test]
    fn arbitrary_bytes_are_never_a_5xx(
        route in prop::sample::select(&["/v1/score", "/v1/decide_many", "/v1/ask", "/v1/generate"][..]),
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let (status, body) = status_of(route, bytes);
        check(status, &body)?;
    }
}
