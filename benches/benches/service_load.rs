//! A bounded loopback load test of the HTTP service (`forkscore serve`) on the demo model.
//!
//! `cargo bench -p forkscore-benches --bench service_load` — starts the service in-process on
//! 127.0.0.1 (a free port) over the `forkscore demo-model` checkpoint (tiny seeded Qwen2.5 layout,
//! written to a temporary folder), then for 1, 8 and 64 concurrent clients sends a fixed number
//! of `POST /v1/score` requests (3-field example schema, varied contexts; one HTTP/1.1 connection
//! per request) and prints a Markdown table: throughput, p50 / p99 / max latency, and the mean
//! contexts per merged scoring call and per context group read back from `/metrics`.
//! Env: FORKSCORE_LOAD_REQUESTS (per concurrency level, default 512), FORKSCORE_LOAD_CLIENTS
//! (default 1,8,64).

use forkscore_backends::candle::LoadOptions;
use forkscore_benches::load_engine;
use forkscore_service::{AppState, ServeConfig};
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

fn env_list(name: &str, default: &[usize]) -> anyhow::Result<Vec<usize>> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .map(|c| {
                c.trim()
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{name}={v:?}: {c:?} is not a count: {e}"))
            })
            .collect(),
        Err(_) => Ok(default.to_vec()),
    }
}

/// One request over a fresh connection: (status, seconds).
async fn one(addr: SocketAddr, body: &str) -> anyhow::Result<(u16, f64)> {
    let start = Instant::now();
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.set_nodelay(true)?;
    let head = format!(
        "POST /v1/score HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response).await?;
    let status = std::str::from_utf8(response.get(9..12).unwrap_or_default())?.parse()?;
    Ok((status, start.elapsed().as_secs_f64()))
}

async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut response = String::new();
    conn.read_to_string(&mut response).await?;
    Ok(response)
}

/// `name` (no labels) from a Prometheus text body.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct Row {
    clients: usize,
    requests: usize,
    errors: usize,
    seconds: f64,
    p50: f64,
    p99: f64,
    max: f64,
    merged_mean: f64,
    group_mean: f64,
}

async fn level(
    addr: SocketAddr,
    clients: usize,
    requests: usize,
    schema: &Value,
) -> anyhow::Result<Row> {
    let before = get(addr, "/metrics").await?;
    let bodies: Vec<String> = (0..requests)
        .map(|i| {
            json!({"context": format!("{} (ticket {i})", CONTEXTS[i % CONTEXTS.len()]), "schema": schema})
                .to_string()
        })
        .collect();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bodies = std::sync::Arc::new(bodies);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (next, bodies) = (next.clone(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { break };
                out.push(one(addr, body).await);
            }
            out
        }));
    }
    let mut latencies = Vec::with_capacity(requests);
    let mut errors = 0;
    for t in tasks {
        for r in t.await? {
            match r {
                Ok((200, s)) => latencies.push(s),
                _ => errors += 1,
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let after = get(addr, "/metrics").await?;
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let ratio = |sum: &str, count: &str| delta(sum) / delta(count).max(1.0);
    Ok(Row {
        clients,
        requests,
        errors,
        seconds,
        p50: percentile(&latencies, 50.0) * 1e3,
        p99: percentile(&latencies, 99.0) * 1e3,
        max: latencies.last().copied().unwrap_or(f64::NAN) * 1e3,
        merged_mean: ratio(
            "forkscore_merged_contexts_sum",
            "forkscore_merged_contexts_count",
        ),
        group_mean: ratio("forkscore_group_size_sum", "forkscore_group_size_count"),
    })
}

fn main() -> anyhow::Result<()> {
    let requests = env_list("FORKSCORE_LOAD_REQUESTS", &[512])?
        .first()
        .copied()
        .unwrap_or(512);
    let levels = env_list("FORKSCORE_LOAD_CLIENTS", &[1, 8, 64])?;
    let dir = std::env::temp_dir().join("forkscore-load-demo-qwen25");
    if !dir.join("config.json").is_file() {
        // exactly what `forkscore demo-model DIR` writes (default --arch qwen2.5)
        write_hf_folder(&dir, &TinySpec::qwen25())?;
    }
    let engine = load_engine(&dir, &LoadOptions::default())?;
    let schema: Value =
        serde_json::from_str(include_str!("../../fixtures/examples/parallel_schema.json"))?;
    let mut model = Map::new();
    model.insert("model_id".into(), "demo-model qwen2.5".into());
    let config = ServeConfig {
        request_timeout: Duration::from_secs(600),
        ..ServeConfig::default()
    };
    let (state, model_thread) = AppState::start(engine, model, config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let rows = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(forkscore_service::serve(listener, state, async {
            let _ = stopped.await;
        }));
        // warm-up: first calls allocate and fill caches
        for c in CONTEXTS {
            one(addr, &json!({"context": c, "schema": schema}).to_string()).await?;
        }
        let mut rows = Vec::new();
        for &clients in &levels {
            rows.push(level(addr, clients, requests, &schema).await?);
        }
        let _ = stop.send(());
        server.await??;
        anyhow::Ok(rows)
    })?;
    model_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the model thread panicked"))?;

    println!(
        "| clients | requests | errors | wall s | req/s | p50 ms | p99 ms | max ms | contexts per merged call | contexts per group |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.clients,
            r.requests,
            r.errors,
            r.seconds,
            (r.requests - r.errors) as f64 / r.seconds,
            r.p50,
            r.p99,
            r.max,
            r.merged_mean,
            r.group_mean
        );
    }
    Ok(())
}
