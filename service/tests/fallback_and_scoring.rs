//! Routes beside the decision endpoints: an unknown path is a JSON 404 naming the routes, a known
//! path asked with another method a JSON 405 with `Allow`; and `options.scoring` (the
//! `--scoring` of the CLI) on the decision endpoints, validated as the other options.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkscore_service::{router, AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use tower::ServiceExt;

mod common;

const USER: &str = "The payment service is down for every customer.";

fn app() -> axum::Router {
    let provenance = json!({"model_id": "fake", "revision": "test"})
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

#[tokio::test]
async fn unknown_paths_are_a_json_404_and_wrong_methods_a_json_405() {
    let app = app();
    let (status, _, got) = call(&app, "GET", "/v1/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(got["error"]["kind"], "not_found");
    assert_eq!(got["error"]["path"], "<root>");
    let message = got["error"]["message"].as_str().unwrap();
    assert!(message.contains("GET /v1/nope"), "{message}");
    assert!(message.contains("POST /v1/chat/completions"), "{message}");
    let (status, _, got) = call(&app, "POST", "/nope", Some(&json!({}))).await;
    assert_eq!(
        (status, got["error"]["kind"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    for (method, path, allowed) in [
        ("GET", "/v1/score", "POST"),
        ("DELETE", "/v1/chat/completions", "POST"),
        ("POST", "/health", "GET"),
        ("PUT", "/v1/models", "GET"),
    ] {
        let (status, headers, got) = call(&app, method, path, Some(&json!({}))).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(got["error"]["kind"], "method_not_allowed", "{got}");
        let message = got["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{path} does not answer {method}")),
            "{message}"
        );
        assert!(
            message.contains(&format!("allowed: {allowed}")),
            "{message}"
        );
        let allow: BTreeSet<&str> = headers["allow"].to_str().unwrap().split(',').collect();
        assert!(allow.contains(allowed), "{allow:?}");
    }
}

#[tokio::test]
async fn score_accepts_options_scoring_and_refuses_an_unknown_method() {
    let app = app();
    let schema = json!({"urgent": {"type": "boolean"}, "level": {"type": "enum", "choices": ["low", "high"]}});
    for scoring in [
        "code",
        "literal",
        "literal-first-token",
        "literal-sum-loglik",
        "literal-mean-loglik",
    ] {
        let body = json!({"context": USER, "schema": schema, "options": {"scoring": scoring}});
        let (status, _, got) = call(&app, "POST", "/v1/score", Some(&body)).await;
        assert_eq!(status, StatusCode::OK, "{scoring}: {got}");
        for (name, f) in got["fields"].as_object().unwrap() {
            let want = if scoring == "code" {
                Value::Null
            } else {
                json!(scoring)
            };
            assert_eq!(f["scoring"], want, "{scoring}: {name}");
        }
    }
    // a field's own scoring wins over the option
    let own = json!({"urgent": {"type": "boolean", "scoring": "code"}});
    let body = json!({"context": USER, "schema": own, "options": {"scoring": "literal"}});
    let (_, _, got) = call(&app, "POST", "/v1/score", Some(&body)).await;
    assert_eq!(got["fields"]["urgent"]["scoring"], Value::Null, "{got}");
    for (bad, needle) in [
        (json!("vibes"), "unknown scoring"),
        (json!(3), "must be a string"),
    ] {
        let body = json!({"context": USER, "schema": schema, "options": {"scoring": bad}});
        let (status, _, got) = call(
            &app,
            "POST",
            "/v1/decide_many",
            Some(&json!({
            "contexts": [USER], "schema": schema, "options": body["options"]})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{got}");
        assert_eq!(got["error"]["kind"], "options");
        assert_eq!(got["error"]["path"], "options.scoring");
        assert!(
            got["error"]["message"].as_str().unwrap().contains(needle),
            "{got}"
        );
    }
}
