//! Request logging: every request through the router, a fallback 404 included, writes one
//! `tracing` line naming its method, path, status and latency (captured here by a test
//! subscriber writing into a buffer; `forkscore serve` writes the same lines to stderr).

use axum::body::Body;
use axum::http::Request;
use forkscore_service::{router, AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tower::ServiceExt;

mod common;

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

async fn send(app: &axum::Router, method: &str, path: &str, body: &str) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = axum::body::to_bytes(resp.into_body(), usize::MAX).await;
    status
}

// current-thread runtime: the router runs on this thread, under the scoped subscriber
#[tokio::test]
async fn each_request_writes_one_line_with_method_path_status_and_latency() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(forkscore_service::logging::filter(None).unwrap())
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (state, _) = AppState::start(
        common::engine_on(FakeBackend::new(1)),
        json!({"model_id": "fake"}).as_object().unwrap().clone(),
        ServeConfig::default(),
    )
    .expect("model thread");
    let app = router(state);
    let body = json!({"context": "The payment service is down.",
                      "schema": {"urgent": {"type": "boolean"}}})
    .to_string();
    assert_eq!(send(&app, "POST", "/v1/score", &body).await, 200);
    assert_eq!(send(&app, "GET", "/health", "").await, 200);
    assert_eq!(send(&app, "GET", "/no/such/route", "").await, 404);
    assert_eq!(send(&app, "POST", "/v1/score", "{").await, 400);

    let text = captured.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "one line per request:\n{text}");
    for (line, (level, method, path, status)) in lines.iter().zip([
        ("INFO", "POST", "/v1/score", 200),
        ("INFO", "GET", "/health", 200),
        ("WARN", "GET", "/no/such/route", 404),
        ("WARN", "POST", "/v1/score", 400),
    ]) {
        assert!(line.contains(level), "{line}");
        assert!(
            line.contains(&format!("method={method} path={path}")),
            "{line}"
        );
        assert!(line.contains(&format!("status={status}")), "{line}");
        let latency: f64 = line
            .split("latency_ms=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no latency_ms in {line}"));
        assert!(latency >= 0.0 && latency.is_finite(), "{line}");
    }
    // the body (a context may be private) is never logged
    assert!(!text.contains("payment service"), "{text}");
}
