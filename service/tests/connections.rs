//! The connection layer over real loopback, against hostile clients: a head or a body dripped
//! byte by byte is cut at its timeout, idle keep-alive and half-open connections are closed,
//! hundreds of half-open connections past the cap cannot keep `/health` out, a slow client
//! cannot hold shutdown past its deadline, and browsers of other origins (or DNS-rebinding
//! names) are refused while the server's own page is served.

mod common;

use common::{engine_on, Slow};
use forkscore_service::{AppState, ServeConfig};
use forkscore_testkit::fake::FakeBackend;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<std::io::Result<()>>,
    state: std::sync::Arc<AppState<Slow>>,
}

/// `serve` on 127.0.0.1:0 with `config`, on the fake backend whose prefill takes `delay`.
async fn start(config: ServeConfig, delay: Duration) -> Server {
    let model = json!({"model_id": "fake"}).as_object().unwrap().clone();
    let slow = Slow {
        inner: FakeBackend::new(1),
        delay,
    };
    let (state, _) = AppState::start(engine_on(slow), model, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(forkscore_service::serve(listener, state.clone(), async {
        let _ = stopped.await;
    }));
    Server {
        addr,
        stop,
        handle,
        state,
    }
}

fn schema() -> Value {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/examples/parallel_schema.json"),
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Send `raw` on a fresh connection and read until the server closes it; (status, body).
async fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, Value) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(raw).await.unwrap();
    let mut response = Vec::new();
    // a reset after the response (the server closed with request bytes unread) keeps what came
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

/// A request with `headers` (each `name: value\r\n`) and a JSON body, `connection: close`.
fn request(method: &str, path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Wait until the peer closes `conn` (EOF or reset); how long that took. Panics past `limit`.
async fn closed_within(conn: &mut tokio::net::tcp::OwnedReadHalf, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, conn.read(&mut buf)).await {
            Err(_) => panic!("still open after {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            // a response (e.g. 408) before the close
            Ok(Ok(_)) => continue,
        }
    }
}

/// Write `bytes` one at a time, `every` apart, until the server closes the connection.
fn drip(mut w: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>, every: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        for b in bytes {
            if w.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_dripped_byte_by_byte_is_cut_at_the_header_timeout() {
    let server = start(
        ServeConfig {
            header_read_timeout: Duration::from_secs(1),
            ..ServeConfig::default()
        },
        Duration::ZERO,
    )
    .await;
    let (mut r, w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    // a head of 40 bytes at 5 bytes/s would take 8 s
    let dripper = drip(
        w,
        b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: 1\r\n\r\n".to_vec(),
        Duration::from_millis(200),
    );
    let took = closed_within(&mut r, Duration::from_secs(5)).await;
    assert!(took < Duration::from_millis(3000), "{took:?}");
    dripper.abort();

    // an idle keep-alive connection is cut as well: the wait for the next head counts
    let (mut r, mut w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    w.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = r.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let took = closed_within(&mut r, Duration::from_secs(5)).await;
    assert!(took < Duration::from_millis(3000), "{took:?}");

    // a connection that sends nothing at all is cut too
    let (mut r, _w) = TcpStream::connect(server.addr).await.unwrap().into_split();
    let took = closed_within(&mut r, Duration::from_secs(5)).await;
    assert!(took < Duration::from_millis(3000), "{took:?}");
    let _ = server.stop.send(());
    server.handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripped_body_is_a_408_at_the_body_timeout() {
    // the request timeout is far away: the body bound alone must cut the dripper
    let server = start(
        ServeConfig {
            body_read_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(60),
            ..ServeConfig::default()
        },
        Duration::ZERO,
    )
    .await;
    let body = json!({"context": "x", "schema": schema()}).to_string();
    let mut conn = TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(
        format!(
            "POST /v1/score HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let (mut r, w) = conn.into_split();
    let dripper = drip(w, body.into_bytes(), Duration::from_millis(100));
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), r.read_to_end(&mut response))
        .await
        .expect("answered and closed within 5 s");
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"body_timeout\""), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    dripper.abort();
    let _ = server.stop.send(());
    server.handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_past_the_cap_cannot_keep_health_out() {
    // timeouts far away: only the cap's eviction of the idlest can let /health in
    let server = start(
        ServeConfig {
            max_connections: 32,
            header_read_timeout: Duration::from_secs(60),
            ..ServeConfig::default()
        },
        Duration::ZERO,
    )
    .await;
    let mut idlers = Vec::new();
    for _ in 0..300 {
        let mut c = TcpStream::connect(server.addr).await.unwrap();
        c.write_all(b"GET /health HTTP/1.1\r\nhos").await.unwrap();
        idlers.push(c);
    }
    let started = Instant::now();
    let (status, health) = exchange(
        server.addr,
        &request("GET", "/health", "host: 127.0.0.1\r\n", ""),
    )
    .await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let metrics = server.state.metrics.render();
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("forkscore_connections_evicted_total "))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(evicted >= 300 - 32, "{metrics}");
    assert!(server.state.metrics.open_connections() <= 33, "{metrics}");
    // the oldest idlers were the ones closed: the first connection reads EOF
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), idlers[0].read(&mut buf))
        .await
        .expect("evicted: closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let _ = server.stop.send(());
    server.handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_every_connection_busy_a_newcomer_gets_a_503() {
    // each prefill takes 1.5 s: two requests in flight fill a cap of 2
    let server = start(
        ServeConfig {
            max_connections: 2,
            ..ServeConfig::default()
        },
        Duration::from_millis(1500),
    )
    .await;
    let body = json!({"context": "x", "schema": schema()}).to_string();
    let raw = request(
        "POST",
        "/v1/score",
        "host: 127.0.0.1\r\ncontent-type: application/json\r\n",
        &body,
    );
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let raw = raw.clone();
            let addr = server.addr;
            tokio::spawn(async move { exchange(addr, &raw).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, refused) = exchange(
        server.addr,
        &request("GET", "/health", "host: 127.0.0.1\r\n", ""),
    )
    .await;
    assert_eq!(
        (status, refused["error"]["kind"].as_str()),
        (503, Some("connections_full"))
    );
    for b in busy {
        assert_eq!(
            b.await.unwrap().0,
            200,
            "requests in flight are never evicted"
        );
    }
    assert!(server
        .state
        .metrics
        .render()
        .contains("forkscore_refused_total{reason=\"connections_full\"} 1"));
    let _ = server.stop.send(());
    server.handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_cannot_hold_shutdown_past_its_deadline() {
    let server = start(
        ServeConfig {
            header_read_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(60),
            shutdown_deadline: Duration::from_secs(1),
            ..ServeConfig::default()
        },
        Duration::ZERO,
    )
    .await;
    // one client dripping a body (a request in flight), one half a head, one idle
    let mut body_dripper = TcpStream::connect(server.addr).await.unwrap();
    body_dripper
        .write_all(b"POST /v1/score HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{")
        .await
        .unwrap();
    let (_r1, w1) = body_dripper.into_split();
    let d1 = drip(w1, vec![b' '; 999], Duration::from_millis(200));
    let (_r2, w2) = TcpStream::connect(server.addr).await.unwrap().into_split();
    let d2 = drip(
        w2,
        b"GET /health HTTP/1.1\r\n".to_vec(),
        Duration::from_millis(200),
    );
    let _idle = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let _ = server.stop.send(());
    tokio::time::timeout(Duration::from_secs(5), server.handle)
        .await
        .expect("serve returns by the deadline")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert!(
        took >= Duration::from_millis(900),
        "the request in flight had its deadline to finish: {took:?}"
    );
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "listener closed"
    );
    d1.abort();
    d2.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_origins_and_foreign_hosts_are_refused_the_own_page_is_not() {
    let server = start(ServeConfig::default(), Duration::ZERO).await;
    let port = server.addr.port();
    let body = json!({"context": "The payment service is down.", "schema": schema()}).to_string();
    let score = |headers: String| {
        let raw = request("POST", "/v1/score", &headers, &body);
        let addr = server.addr;
        async move { exchange(addr, &raw).await }
    };
    let json_ct = "content-type: application/json\r\n";
    // the page's own fetch: same origin, JSON
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (status, v) = score(format!(
            "host: {host}\r\norigin: http://{host}\r\n{json_ct}"
        ))
        .await;
        assert_eq!(status, 200, "{host}: {v}");
        assert!(v["output"].is_object());
    }
    // a cross-origin "simple" POST: text/plain (no preflight) is refused before scoring
    let (status, v) = score(format!(
        "host: 127.0.0.1:{port}\r\ncontent-type: text/plain\r\n"
    ))
    .await;
    assert_eq!(
        (status, v["error"]["kind"].as_str()),
        (415, Some("unsupported_media_type"))
    );
    // a page of another origin, even with the JSON type
    let (status, v) = score(format!(
        "host: 127.0.0.1:{port}\r\norigin: http://evil.example\r\n{json_ct}"
    ))
    .await;
    assert_eq!(
        (status, v["error"]["kind"].as_str()),
        (403, Some("forbidden_origin"))
    );
    // DNS rebinding: the page's name resolves here, so Host and Origin name it
    let (status, v) = score(format!(
        "host: rebind.example:{port}\r\norigin: http://rebind.example:{port}\r\n{json_ct}"
    ))
    .await;
    assert_eq!(
        (status, v["error"]["kind"].as_str()),
        (403, Some("forbidden_host"))
    );
    // GETs too: a rebinding page cannot read /health or /metrics
    let (status, _) = exchange(
        server.addr,
        &request("GET", "/metrics", "host: rebind.example\r\n", ""),
    )
    .await;
    assert_eq!(status, 403);
    let metrics = server.state.metrics.render();
    for needle in [
        "forkscore_refused_total{reason=\"host\"} 2",
        "forkscore_refused_total{reason=\"origin\"} 1",
        "forkscore_requests_total{route=\"/v1/score\",status=\"415\"} 1",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    let _ = server.stop.send(());
    server.handle.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_and_origins_are_accepted() {
    let server = start(
        ServeConfig {
            allowed_hosts: vec!["scorer.internal".into()],
            allowed_origins: vec!["https://app.example".into()],
            ..ServeConfig::default()
        },
        Duration::ZERO,
    )
    .await;
    let (status, _) = exchange(
        server.addr,
        &request(
            "GET",
            "/health",
            "host: scorer.internal\r\norigin: https://app.example\r\n",
            "",
        ),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = exchange(
        server.addr,
        &request(
            "GET",
            "/health",
            "host: scorer.internal\r\norigin: https://other.example\r\n",
            "",
        ),
    )
    .await;
    assert_eq!(status, 403);
    let _ = server.stop.send(());
    server.handle.await.unwrap().unwrap();
}
