//! The HTTP service on the fake backend (deterministic, bit-identical across batchings) with the
//! real Qwen2.5 tokenizer: merged requests equal single decisions, every bad input is a 4xx
//! naming the path and rule, limits, timeouts, health, metrics, the OpenAPI description, and a
//! graceful shutdown over real loopback.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use forkscore_engine::{Engine, Schema, ScoreOptions};
use forkscore_service::routes::ROUTES;
use forkscore_service::{router, AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;

mod common;

use common::{engine_on, Slow};

fn engine() -> Engine<FakeBackend> {
    engine_on(FakeBackend::new(1))
}

fn model_provenance() -> Map<String, Value> {
    json!({"model_id": "fake", "revision": "test"})
        .as_object()
        .unwrap()
        .clone()
}

fn state(config: ServeConfig) -> Arc<AppState<FakeBackend>> {
    AppState::start(engine(), model_provenance(), config)
        .expect("model thread")
        .0
}

fn schema() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/examples/parallel_schema.json"),
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

const CONTEXTS: [&str; 8] = [
    "The payment service is down for every customer.",
    "One user cannot reset a password.",
    "The staging build is flaky on Tuesdays.",
    "Card ending 4242 made 37 purchases within 3 minutes.",
    "Our EU region returns 500 errors on checkout.",
    "A typo on the pricing page.",
    "The data warehouse nightly load is 2 hours late.",
    "Customers report double charges after the last deploy.",
];

async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> (StatusCode, Value, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map_or(Body::empty(), Body::from))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).to_string();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        text,
    )
}

async fn post(app: &axum::Router, path: &str, body: Value) -> (StatusCode, Value) {
    let (s, v, _) = call(app, "POST", path, Some(serde_json::to_vec(&body).unwrap())).await;
    (s, v)
}

/// The single-request reference: `Engine::decide` on its own (one engine, loaded once).
fn reference(context: &str) -> Value {
    static E: std::sync::OnceLock<(Engine<FakeBackend>, forkscore_engine::CompiledSchema)> =
        std::sync::OnceLock::new();
    let (e, compiled) = E.get_or_init(|| {
        let e = engine();
        let compiled = e.compile(&Schema::from_value(&schema()).unwrap()).unwrap();
        (e, compiled)
    });
    serde_json::to_value(
        e.decide(context, compiled, &ScoreOptions::default())
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_merge_into_groups_and_equal_single_decisions() {
    // Every prefill sleeps 300 ms: while a first request holds the model thread, the eight
    // concurrent requests wait in the queue together, so the next drain merges them.
    let slow = Slow {
        inner: FakeBackend::new(1),
        delay: Duration::from_millis(300),
    };
    let (state, _) =
        AppState::start(engine_on(slow), model_provenance(), ServeConfig::default()).unwrap();
    let app = router(state);
    let blocker = {
        let app = app.clone();
        let body = json!({"context": "blocker", "schema": schema()});
        tokio::spawn(async move { post(&app, "/v1/score", body).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let calls = CONTEXTS.iter().map(|c| {
        let app = app.clone();
        let body = json!({"context": c, "schema": schema()});
        tokio::spawn(async move { post(&app, "/v1/score", body).await })
    });
    let mut group_sizes = Vec::new();
    for (handle, context) in futures_join(calls.collect())
        .await
        .into_iter()
        .zip(CONTEXTS)
    {
        let (status, got) = handle;
        assert_eq!(status, StatusCode::OK, "{got}");
        let want = reference(context);
        assert_eq!(got["output"], want["output"], "{context}");
        assert_eq!(
            got["fields"], want["fields"],
            "{context}: scores and logits bit-identical"
        );
        assert_eq!(
            got["telemetry"]["prefix_tokens"],
            want["telemetry"]["prefix_tokens"]
        );
        assert_eq!(got["provenance"]["model_id"], "fake");
        assert_eq!(
            got["provenance"]["schema_hash"].as_str().map(str::len),
            Some(64)
        );
        group_sizes.push(got["telemetry"]["group"]["size"].as_u64().unwrap());
    }
    assert_eq!(blocker.await.unwrap().0, StatusCode::OK);
    assert!(
        group_sizes.iter().any(|&n| n > 1),
        "concurrent requests were scored in shared context groups: {group_sizes:?}"
    );
    // decide_many: one request, one merged group, same decisions in input order
    let (status, many) = post(
        &app,
        "/v1/decide_many",
        json!({"contexts": CONTEXTS, "schema": schema()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let results = many["results"].as_array().unwrap();
    assert_eq!(results.len(), CONTEXTS.len());
    for (got, context) in results.iter().zip(CONTEXTS) {
        assert_eq!(got["fields"], reference(context)["fields"], "{context}");
        assert_eq!(
            got["telemetry"]["group"]["size"],
            CONTEXTS.len(),
            "all eight in one group"
        );
    }
}

async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_reserved_place_counts_against_the_queue_until_used_or_dropped() {
    // Handlers reserve a place before preparing a job's contexts: a full queue refuses (503
    // `queue_full`) before anything is prepared, and a place given up is free again.
    use forkscore_service::queue::{Job, Queue};
    let e = Arc::new(engine());
    let compiled = Arc::new(e.compile(&Schema::from_value(&schema()).unwrap()).unwrap());
    let metrics = Arc::new(forkscore_service::metrics::Metrics::default());
    let (queue, handle) = Queue::start(e.clone(), 1, 256, Default::default(), metrics).unwrap();
    let slot = queue.reserve().expect("the one place");
    let full = queue.reserve().err().expect("the queue is full");
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(full.kind, "queue_full");
    drop(slot);
    let slot = queue.reserve().expect("a dropped place is free again");
    let (reply, rx) = tokio::sync::oneshot::channel();
    let contexts = vec![CONTEXTS[0].to_string()];
    let prepared = forkscore_service::scheduler::prepare_contexts(
        &e,
        &contexts,
        &compiled,
        &ScoreOptions::default(),
    );
    slot.submit(Job {
        compiled: compiled.clone(),
        contexts,
        options: ScoreOptions::default(),
        prepared: Some(prepared),
        reply,
    });
    let d = rx.await.unwrap().pop().unwrap().unwrap();
    let got = serde_json::to_value(&d).unwrap();
    assert_eq!(got["fields"], reference(CONTEXTS[0])["fields"]);
    drop(queue);
    handle.join().unwrap();
}

#[tokio::test]
async fn queued_jobs_merge_into_one_decide_many_call() {
    // Submit directly to the queue faster than the model thread can drain it: jobs that wait
    // together are decided in one call, and each still gets its own single-request decision.
    use forkscore_service::queue::{Job, Queue};
    let e = Arc::new(engine());
    let compiled = Arc::new(e.compile(&Schema::from_value(&schema()).unwrap()).unwrap());
    let metrics = Arc::new(forkscore_service::metrics::Metrics::default());
    let (queue, handle) =
        Queue::start(e.clone(), 64, 256, Default::default(), metrics.clone()).unwrap();
    let mut replies = Vec::new();
    for c in CONTEXTS {
        let (reply, rx) = tokio::sync::oneshot::channel();
        queue
            .submit(Job {
                compiled: compiled.clone(),
                contexts: vec![c.to_string()],
                options: ScoreOptions::default(),
                prepared: None,
                reply,
            })
            .unwrap();
        replies.push(rx);
    }
    let mut sizes = Vec::new();
    for (rx, c) in replies.into_iter().zip(CONTEXTS) {
        let d = rx.await.unwrap().pop().unwrap().unwrap();
        let got = serde_json::to_value(&d).unwrap();
        assert_eq!(got["fields"], reference(c)["fields"], "{c}");
        sizes.push(d.telemetry.group.unwrap().size);
    }
    assert!(
        sizes.iter().any(|&s| s > 1),
        "some jobs were merged: group sizes {sizes:?}"
    );
    drop(queue);
    handle.join().unwrap();
    assert!(metrics.render().contains("forkscore_merged_contexts_count"));
}

#[tokio::test]
async fn bad_input_is_a_4xx_naming_the_path_and_rule() {
    let app = router(state(ServeConfig {
        max_body_bytes: 64 << 10,
        max_contexts_per_request: 4,
        ..ServeConfig::default()
    }));
    let s = schema();
    let cases: Vec<(&str, Vec<u8>, StatusCode, &str, &str)> = vec![
        (
            "/v1/score",
            b"{not json".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "<root>",
        ),
        (
            "/v1/score",
            br#"{"context": "a", "context": "b"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "<root>",
        ),
        (
            "/v1/score",
            b"[1]".to_vec(),
            StatusCode::BAD_REQUEST,
            "not_an_object",
            "<root>",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "extra": 1})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "unknown_key",
            "extra",
        ),
        (
            "/v1/score",
            json!({"schema": s}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "missing_context",
            "context",
        ),
        (
            "/v1/score",
            json!({"context": 5, "schema": s}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "context",
        ),
        (
            "/v1/score",
            json!({"context": "x"}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "missing_schema",
            "schema",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": {"f": {"type": "enum", "choices": []}}})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_schema",
            "schema.f.choices",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": {"f": {"type": "number"}}})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_schema",
            "schema.f.type",
        ),
        (
            "/v1/score",
            json!({"context": "", "schema": s}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "empty_context",
            "context",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "options": {"mode": "fast"}})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "options",
            "options.mode",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "options": {"temperature": -1}})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "options",
            "options.temperature",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "options": {"max_input_tokens": 100000}})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "options",
            "options.max_input_tokens",
        ),
        // the schema alone is over the bound: its fault, whatever the context
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "options": {"max_input_tokens": 20}})
                .to_string()
                .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_tokens",
            "schema",
        ),
        // the schema fits, the context does not
        (
            "/v1/score",
            json!({"context": "word ".repeat(3000), "schema": s, "options": {"max_input_tokens": 1000}})
                .to_string()
                .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_tokens",
            "context",
        ),
        (
            "/v1/score",
            json!({"context": "x".repeat(70 << 10), "schema": s})
                .to_string()
                .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            "<root>",
        ),
        (
            "/v1/decide_many",
            json!({"contexts": [], "schema": s})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "contexts",
        ),
        (
            "/v1/decide_many",
            json!({"contexts": ["a", 1], "schema": s})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "contexts[1]",
        ),
        (
            "/v1/decide_many",
            json!({"contexts": vec!["a"; 5], "schema": s})
                .to_string()
                .into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_contexts",
            "contexts",
        ),
        (
            "/v1/ask",
            json!({"context": "x", "question": ""})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "question",
        ),
        (
            "/v1/ask",
            json!({"context": "x"}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "missing_question",
            "question",
        ),
        (
            "/v1/ask",
            json!({"context": "x", "question": 3})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "question",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "options": []})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "options",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "options": {"speed": 1}})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "options",
            "options.speed",
        ),
        (
            "/v1/score",
            b"\xff\xfe".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_utf8",
            "<root>",
        ),
        (
            "/v1/ask",
            json!({"context": "x", "schema": s})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "unknown_key",
            "schema",
        ),
        (
            "/v1/generate",
            json!({"context": "x", "schema": s, "max_new_tokens": 0})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "max_new_tokens",
        ),
        (
            "/v1/generate",
            json!({"context": "x", "schema": s, "max_new_tokens": 4097})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "max_new_tokens",
        ),
        (
            "/v1/generate",
            json!({"context": "x", "schema": s, "max_new_tokens": "many"})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "max_new_tokens",
        ),
        (
            "/v1/generate",
            json!({"context": "   ", "schema": s})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "empty_context",
            "context",
        ),
        (
            "/v1/generate",
            json!({"schema": s}).to_string().into_bytes(),
            StatusCode::BAD_REQUEST,
            "missing_context",
            "context",
        ),
        (
            "/v1/score",
            json!({"context": "x", "schema": s, "max_new_tokens": 8})
                .to_string()
                .into_bytes(),
            StatusCode::BAD_REQUEST,
            "unknown_key",
            "max_new_tokens",
        ),
    ];
    for (path, body, status, kind, at) in cases {
        let (got, v, text) = call(&app, "POST", path, Some(body)).await;
        assert_eq!(
            (
                got,
                v["error"]["kind"].as_str(),
                v["error"]["path"].as_str()
            ),
            (status, Some(kind), Some(at)),
            "{path}: {text}"
        );
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    // a bad context in decide_many is an error entry for itself only
    let (status, v) = post(
        &app,
        "/v1/decide_many",
        json!({"contexts": ["fine", ""], "schema": s}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(v["results"][0]["output"].is_object());
    assert_eq!(v["results"][1]["error"]["kind"], "empty_context");
    assert_eq!(v["results"][1]["error"]["path"], "contexts[1]");
}

#[tokio::test]
async fn ask_scores_one_boolean_field() {
    let app = router(state(ServeConfig::default()));
    let (status, v) = post(
        &app,
        "/v1/ask",
        json!({"context": CONTEXTS[0], "question": "Is it an outage?"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["output"]["answer"].is_boolean());
    let scores = v["fields"]["answer"]["scores"].as_object().unwrap();
    let sum: f64 = scores.values().map(|p| p.as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 1e-9, "{scores:?}");
}

#[tokio::test]
async fn generate_reports_the_generation_beside_the_same_decision() {
    let app = router(state(ServeConfig::default()));
    let (status, v) = post(
        &app,
        "/v1/generate",
        json!({"context": CONTEXTS[0], "schema": schema(), "max_new_tokens": 12}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // forkscore's side is the decision /v1/score gives for the context
    assert_eq!(v["forkscore"]["output"], reference(CONTEXTS[0])["output"]);
    let g = &v["generation"];
    assert!(g["valid"].is_boolean(), "{g}");
    let n = g["generated_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&n), "{g}");
    assert_eq!(g["max_new_tokens"], 12);
    assert!(g["text"].is_string() && g["stop_reason"].is_string(), "{g}");
    assert!(v["speedup"].as_f64().unwrap() > 0.0);
    let fields = v["agreement"]["fields"].as_object().unwrap();
    assert_eq!(
        fields.len(),
        reference(CONTEXTS[0])["output"].as_object().unwrap().len()
    );
    assert!(v["decoding"].as_str().unwrap().starts_with("greedy"));
    assert_eq!(v["provenance"]["model_id"], "fake");
    assert!(v["provenance"]["schema_hash"].is_string());
    // a decision request queued behind a generation is still answered, and equal
    let (status, d) = post(
        &app,
        "/v1/score",
        json!({"context": CONTEXTS[1], "schema": schema()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(d["output"], reference(CONTEXTS[1])["output"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_timeout_is_a_504_and_the_server_keeps_serving() {
    // every prefill takes 400 ms; the request may wait 50 ms
    let slow = Slow {
        inner: FakeBackend::new(1),
        delay: Duration::from_millis(400),
    };
    let (state, _) = AppState::start(
        engine_on(slow),
        model_provenance(),
        ServeConfig {
            request_timeout: Duration::from_millis(50),
            ..ServeConfig::default()
        },
    )
    .unwrap();
    let app = router(state);
    let (status, v) = post(
        &app,
        "/v1/score",
        json!({"context": "x", "schema": schema()}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["kind"].as_str()),
        (StatusCode::GATEWAY_TIMEOUT, Some("timeout")),
        "{v}"
    );
    // the deadline strikes in the 400 ms prefill, or, on a loaded machine (a debug build
    // beside other test binaries), already in the schema's compile: both are the 504 contract
    let path = v["error"]["path"].as_str();
    assert!(matches!(path, Some("<root>") | Some("schema")), "{v}");
    let (status, health, _) = call(&app, "GET", "/health", None).await;
    assert_eq!(
        (status, health["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (_, _, metrics) = call(&app, "GET", "/metrics", None).await;
    assert!(
        metrics.contains("forkscore_requests_total{route=\"/v1/score\",status=\"504\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn health_metrics_and_openapi_describe_the_routes() {
    let app = router(state(ServeConfig::default()));
    let (status, health, _) = call(&app, "GET", "/health", None).await;
    assert_eq!(
        (status, health["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let _ = post(
        &app,
        "/v1/score",
        json!({"context": CONTEXTS[0], "schema": schema()}),
    )
    .await;
    let _ = post(&app, "/v1/score", json!({"context": ""})).await;
    let (_, _, metrics) = call(&app, "GET", "/metrics", None).await;
    for needle in [
        "forkscore_requests_total{route=\"/v1/score\",status=\"200\"} 1",
        "forkscore_requests_total{route=\"/v1/score\",status=\"400\"} 1",
        "forkscore_request_duration_seconds_count{route=\"/v1/score\"} 2",
        "forkscore_queue_depth 0",
        "forkscore_decisions_total 1",
        "forkscore_rows_total 3",
        "forkscore_group_size_count 1",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    // openapi.json (generated): exactly the routes, each of which answers (not 404/405)
    let (_, served, _) = call(&app, "GET", "/openapi.json", None).await;
    assert_eq!(
        served,
        serde_json::from_str::<Value>(forkscore_service::openapi::document_json()).unwrap()
    );
    assert_eq!(served["openapi"].as_str(), Some("3.1.0"));
    let mut described: Vec<(String, String)> = served["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), p.clone()))
        })
        .collect();
    let mut routes: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    described.sort();
    routes.sort();
    assert_eq!(described, routes);
    for (m, p) in ROUTES {
        let (status, _, _) = call(&app, &m.to_uppercase(), p, Some(b"{}".to_vec())).await;
        assert!(
            status != StatusCode::NOT_FOUND && status != StatusCode::METHOD_NOT_ALLOWED,
            "{m} {p}: {status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_the_request_in_flight() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // each prefill takes 100 ms: the request is still being scored when the stop comes
    let slow = Slow {
        inner: FakeBackend::new(1),
        delay: Duration::from_millis(100),
    };
    let (state, model_thread) =
        AppState::start(engine_on(slow), model_provenance(), ServeConfig::default()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(forkscore_service::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let body = json!({"contexts": CONTEXTS, "schema": schema()}).to_string();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("POST /v1/decide_many HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopped_at = std::time::Instant::now();
    stop.send(()).unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"results\""));
    assert!(
        stopped_at.elapsed() >= Duration::from_millis(100),
        "the answer came after the stop, so the request was in flight when it came"
    );
    server.await.unwrap().unwrap();
    // the server is gone: its state, hence the queue, is dropped and the model thread ends
    model_thread.join().unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn the_page_and_its_presets_are_served_self_contained() {
    let app = router(state(ServeConfig::default()));
    let req = Request::builder().uri("/").body(Body::empty()).unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/html"), "{ctype}");
    let csp = resp.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let html = String::from_utf8(bytes.to_vec()).unwrap();
    // one file: inline script and style, nothing fetched from elsewhere
    assert!(html.contains("<script>") && html.contains("<style>"));
    for external in ["http://", "https://", "src=", "<link", "@import"] {
        assert!(!html.contains(external), "the page references {external}");
    }
    for route in ["/v1/score", "/v1/presets", "/health"] {
        assert!(html.contains(route), "the page calls {route}");
    }
    // presets: every example schema, each a valid schema that compiles on this engine
    let (status, v, _) = call(&app, "GET", "/v1/presets", None).await;
    assert_eq!(status, StatusCode::OK);
    let presets = v["presets"].as_array().unwrap();
    assert_eq!(presets.len(), forkscore_service::presets::PRESETS.len());
    let e = engine();
    for p in presets {
        let schema = Schema::from_value(&p["schema"]).unwrap();
        e.compile(&schema)
            .unwrap_or_else(|err| panic!("{}: {err}", p["name"]));
    }
    assert!(presets.iter().any(|p| p["name"] == "parallel_schema"));
}

#[tokio::test]
async fn post_bodies_must_be_declared_json() {
    let app = router(state(ServeConfig::default()));
    let body = serde_json::to_vec(&json!({"context": CONTEXTS[0], "schema": schema()})).unwrap();
    let with_type = |ctype: Option<&str>| {
        let mut req = Request::builder().method("POST").uri("/v1/score");
        if let Some(t) = ctype {
            req = req.header("content-type", t);
        }
        req.body(Body::from(body.clone())).unwrap()
    };
    // what a cross-origin page can send without a preflight, and no type at all
    for ctype in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
        None,
    ] {
        let resp = app.clone().oneshot(with_type(ctype)).await.unwrap();
        let status = resp.status();
        let v: Value = serde_json::from_slice(
            &axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            (
                status,
                v["error"]["kind"].as_str(),
                v["error"]["path"].as_str()
            ),
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some("unsupported_media_type"),
                Some("<root>")
            ),
            "{ctype:?}"
        );
    }
    for ctype in ["application/json", "Application/JSON; charset=utf-8"] {
        let resp = app.clone().oneshot(with_type(Some(ctype))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{ctype}");
    }
}

#[tokio::test]
async fn options_reach_the_engine() {
    let app = router(state(ServeConfig::default()));
    let (status, v) = post(
        &app,
        "/v1/score",
        json!({"context": CONTEXTS[0], "schema": schema(),
               "options": {"mode": "cached-serial", "include_prompt": true, "allowed_mass": true, "top_k": 2}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["telemetry"]["mode"], "cached-serial");
    assert_eq!(v["provenance"]["mode"], "cached-serial");
    // the default literal-value rule is not written in the provenance
    assert!(v["provenance"].get("literal_value").is_none(), "{v}");
    assert!(v["prompt"]["prefix_ids"].is_array());
    let mass = &v["fields"]["risk_level"]["allowed_mass"];
    assert!(mass.is_object(), "{v}");
    // same decision as parallel mode without diagnostics
    assert_eq!(
        v["fields"]["risk_level"]["scores"],
        reference(CONTEXTS[0])["fields"]["risk_level"]["scores"]
    );
    // another literal-value rule is recorded, for a decision and for a generation's decision
    for route in ["/v1/score", "/v1/generate"] {
        let (status, v) = post(
            &app,
            route,
            json!({"context": CONTEXTS[0], "schema": schema(),
                   "options": {"literal_value": "greedy"}}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{route}: {v}");
        assert_eq!(v["provenance"]["literal_value"], "greedy", "{route}: {v}");
    }
    let (status, v) = post(
        &app,
        "/v1/score",
        json!({"context": "x", "schema": schema(), "options": {"top_k": 2}}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["path"].as_str()),
        (StatusCode::BAD_REQUEST, Some("options.top_k"))
    );
    let (status, v) = post(
        &app,
        "/v1/score",
        json!({"context": "x", "schema": schema(), "options": {"allowed_mass": true, "top_k": 5000}}),
    )
    .await;
    assert_eq!(
        (status, v["error"]["path"].as_str()),
        (StatusCode::BAD_REQUEST, Some("options.top_k"))
    );
}

/// A schema too long for the token bound whatever the context is reported at the schema (the
/// question for /v1/ask), not at the context; a schema over the byte maximum is refused at the
/// string that passes it (the question for /v1/ask) before anything is tokenized.
#[tokio::test]
async fn an_oversized_schema_or_question_is_reported_at_its_own_path() {
    let app = router(state(ServeConfig::default()));
    let long = "risk ".repeat(40_000); // about 40,000 tokens, under the byte maximum
    let (status, v) = post(
        &app,
        "/v1/score",
        json!({"context": CONTEXTS[0], "schema": {"risk": {"type": "boolean", "description": long}}}),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"]["kind"], "too_many_tokens", "{v}");
    assert_eq!(v["error"]["path"], "schema", "{v}");
    let (status, v) = post(
        &app,
        "/v1/ask",
        json!({"context": CONTEXTS[0], "question": long}),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"]["path"], "question", "{v}");
    let huge = "risk ".repeat(300_000); // 1.5 MB: over the schema byte maximum
    let (status, v) = post(
        &app,
        "/v1/score",
        json!({"context": CONTEXTS[0], "schema": {"risk": {"type": "boolean", "description": huge}}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["kind"], "invalid_schema", "{v}");
    assert_eq!(v["error"]["path"], "schema.risk.description", "{v}");
    let (status, v) = post(
        &app,
        "/v1/ask",
        json!({"context": CONTEXTS[0], "question": huge}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["path"], "question", "{v}");
}
