//! A schema far past every bound, through `serve` over loopback: answered within the request
//! timeout while `/health` keeps answering. Its own test binary: a compile abandoned at the
//! timeout may keep the engine's worker threads busy until the process ends, which must not
//! slow other tests.

mod common;

use common::{engine_on, Slow};
use forkscore_service::{AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Send `raw` on a fresh connection and read until the server closes it; (status, body).
async fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, Value) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(raw).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut response))
        .await
        .expect("the server answers and closes within 20 s");
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn request(method: &str, path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

// One async worker: had the compile run on it, /health could not answer until it ended. The
// schema (10,000 fields) is far past any token bound; whether the engine refuses it quickly or
// compiles it slowly, the answer comes within the request timeout.
//
// A runtime of its own: at its end it is shut down without waiting for a compile still running
// on its blocking pool (a `#[tokio::test]` runtime would wait for it).
#[test]
fn a_huge_schema_is_answered_within_the_request_timeout_and_health_stays_up() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(huge_schema());
    rt.shutdown_background();
}

async fn huge_schema() {
    let model = json!({"model_id": "fake"}).as_object().unwrap().clone();
    let slow = Slow {
        inner: FakeBackend::new(1),
        delay: Duration::ZERO,
    };
    let config = ServeConfig {
        request_timeout: Duration::from_secs(2),
        ..ServeConfig::default()
    };
    let (state, _) = AppState::start(engine_on(slow), model, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(forkscore_service::serve(listener, state, async {
        let _ = stopped.await;
    }));
    let fields: serde_json::Map<String, Value> = (0..10_000)
        .map(|i| {
            (
                format!("field_{i}"),
                json!({"type": "boolean", "description": "Is it so?"}),
            )
        })
        .collect();
    let body = json!({"context": "x", "schema": fields}).to_string();
    let raw = request(
        "POST",
        "/v1/score",
        "host: 127.0.0.1\r\ncontent-type: application/json\r\n",
        &body,
    );
    let started = Instant::now();
    let big = tokio::spawn(async move { exchange(addr, &raw).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let asked = Instant::now();
        let (status, _) =
            exchange(addr, &request("GET", "/health", "host: 127.0.0.1\r\n", "")).await;
        assert_eq!(status, 200);
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "{:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, v) = big.await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    match status {
        504 => assert_eq!(
            (v["error"]["kind"].as_str(), v["error"]["path"].as_str()),
            (Some("timeout"), Some("schema"))
        ),
        413 => assert_eq!(v["error"]["kind"].as_str(), Some("too_many_tokens")),
        other => panic!("{other}: {v}"),
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
