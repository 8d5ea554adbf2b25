//! `forkscore serve` end to end on the demo model: binds loopback by default, answers
//! `/v1/score` with exactly the decision `forkscore score` prints, refuses bad flags before
//! loading, stops cleanly (exit 0) on SIGTERM — within its shutdown deadline even with slow
//! clients connected — and refuses foreign `Host` names unless allowed.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

const CONTEXT: &str = "Our production payment service is completely down for every customer.";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_forkscore"))
}

fn example(name: &str) -> String {
    format!("{}/../fixtures/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn demo_model(dir: &std::path::Path) {
    let out = bin()
        .args(["demo-model", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Start `forkscore serve --port 0 …`; returns the child and the printed `host:port`.
fn serve(model: &std::path::Path, extra: &[&str]) -> (Child, String) {
    let (child, addr, _) = serve_logged(model, extra);
    (child, addr)
}

/// [`serve`], also returning its start-up line.
fn serve_logged(model: &std::path::Path, extra: &[&str]) -> (Child, String, String) {
    let mut child = bin()
        .args([
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--revision",
            "demo",
        ])
        .args(["--port", "0"])
        .args(extra)
        // the default log level (info): the request lines below are asserted
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, addr, line)
}

/// One HTTP/1.1 request; (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_as(addr, addr, method, path, body)
}

/// One HTTP/1.1 request with `host` as its Host header; (status, body).
fn http_as(addr: &str, host: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(addr).unwrap();
    // a server that never answers fails the test instead of hanging it
    conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn sigterm(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(kill.success());
    child.wait().unwrap()
}

#[test]
fn serve_answers_like_score_on_loopback_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("demo");
    demo_model(&model);
    let schema_file = example("parallel_schema.json");
    let out = bin()
        .args([
            "score",
            "--model",
            model.to_str().unwrap(),
            "--revision",
            "demo",
        ])
        .args(["--schema-file", &schema_file, "--context", CONTEXT])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();

    let (mut child, addr) = serve(&model, &[]);
    assert!(
        addr.starts_with("127.0.0.1:"),
        "loopback by default: {addr}"
    );
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_file).unwrap()).unwrap();
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/score",
        &json!({"context": CONTEXT, "schema": schema}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    // the same decision and provenance as `forkscore score`; timings and the group differ
    assert_eq!(served["output"], cli["output"]);
    assert_eq!(served["temperature"], cli["temperature"]);
    assert_eq!(served["provenance"], cli["provenance"]);
    for (name, field) in cli["fields"].as_object().unwrap() {
        let got = &served["fields"][name];
        for key in ["value", "type", "choices", "codes"] {
            assert_eq!(got[key], field[key], "{name}.{key}");
        }
        for (choice, p) in field["scores"].as_object().unwrap() {
            let q = got["scores"][choice].as_f64().unwrap();
            assert!(
                (q - p.as_f64().unwrap()).abs() < 1e-6,
                "{name}.{choice}: {q} vs {p}"
            );
        }
    }
    for key in [
        "mode",
        "rows",
        "prefix_tokens",
        "suffix_tokens",
        "input_tokens",
    ] {
        assert_eq!(
            served["telemetry"][key], cli["telemetry"][key],
            "telemetry.{key}"
        );
    }
    let (status, health) = http(&addr, "GET", "/health", "");
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&health).unwrap()["status"],
        "ok"
    );
    let (status, body) = http(&addr, "POST", "/v1/score", "{\"context\": 1}");
    assert_eq!(status, 400, "{body}");
    let (status, metrics) = http(&addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(metrics.contains("forkscore_decisions_total 1"), "{metrics}");

    let exit = sigterm(&mut child);
    assert!(exit.success(), "SIGTERM is a clean stop: {exit:?}");
    let mut rest = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut rest)
        .unwrap();
    assert!(rest.contains("stopped"), "{rest}");
    // one log line per request on stderr: method, path, status, latency
    for needle in [
        "method=POST path=/v1/score}",
        "status=200",
        "status=400",
        "method=GET path=/metrics}",
        "latency_ms=",
    ] {
        assert!(rest.contains(needle), "no {needle} in the log:\n{rest}");
    }
    assert!(!rest.contains(CONTEXT), "request bodies are never logged");
}

#[test]
fn serve_refuses_bad_flags_before_loading() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-model");
    for (flags, needle) in [
        (vec!["--max-body-mib", "0"], "--max-body-mib"),
        (vec!["--queue-capacity", "0"], "--queue-capacity"),
        (vec!["--request-timeout-s", "0"], "--request-timeout-s"),
        (vec!["--max-input-tokens", "0"], "--max-input-tokens"),
        (vec!["--max-connections", "0"], "--max-connections"),
        (
            vec!["--header-read-timeout-s", "0"],
            "--header-read-timeout-s",
        ),
        (
            vec!["--body-read-timeout-s", "nan"],
            "--body-read-timeout-s",
        ),
        (
            vec!["--shutdown-deadline-s", "100000"],
            "--shutdown-deadline-s",
        ),
        (vec!["--allow-origin", "evil.example"], "--allow-origin"),
        (vec!["--allow-host", "http://x"], "--allow-host"),
    ] {
        let out = bin()
            .args([
                "serve",
                "--model",
                missing.to_str().unwrap(),
                "--revision",
                "x",
            ])
            .args(&flags)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
    let out = bin()
        .env("RUST_LOG", "forkscore_service=loud")
        .args([
            "serve",
            "--model",
            missing.to_str().unwrap(),
            "--revision",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RUST_LOG=\"forkscore_service=loud\""), "{err}");
}

#[test]
fn sigterm_with_slow_clients_connected_exits_0_within_the_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("demo");
    demo_model(&model);
    // read timeouts far past the deadline: only the deadline can end the slow clients
    let (mut child, addr, log) = serve_logged(
        &model,
        &[
            "--shutdown-deadline-s",
            "2",
            "--header-read-timeout-s",
            "60",
            "--body-read-timeout-s",
            "60",
            "--allow-host",
            "scorer.internal",
        ],
    );
    let mut stderr = child.stderr.take().unwrap();
    // the start-up line names the open-file limit in force
    assert!(log.contains("open-file limit"), "{log}");
    // Host: the bound address, localhost, the allowed name; nothing else
    let port = addr.rsplit(':').next().unwrap();
    for (host, want) in [
        (format!("localhost:{port}"), 200),
        ("scorer.internal".to_string(), 200),
        (format!("rebind.example:{port}"), 403),
    ] {
        let (status, body) = http_as(&addr, &host, "GET", "/health", "");
        assert_eq!(status, want, "{host}: {body}");
    }
    // a body dripped byte by byte (a request in flight) and half a head
    let mut body_dripper = TcpStream::connect(&addr).unwrap();
    write!(
        body_dripper,
        "POST /v1/score HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{"
    )
    .unwrap();
    let mut head_dripper = TcpStream::connect(&addr).unwrap();
    head_dripper
        .write_all(b"GET /health HTTP/1.1\r\nho")
        .unwrap();
    let dripping = std::thread::spawn(move || {
        for _ in 0..60 {
            if body_dripper.write_all(b" ").is_err() || head_dripper.write_all(b"s").is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let started = std::time::Instant::now();
    let exit = sigterm(&mut child);
    let took = started.elapsed();
    assert!(exit.success(), "SIGTERM is a clean stop: {exit:?}");
    assert!(
        took < std::time::Duration::from_secs(6),
        "stopped {took:?} after SIGTERM, past the 2 s deadline"
    );
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
    let _ = dripping.join();
}

#[test]
fn a_half_open_flood_under_a_low_open_file_limit_cannot_keep_health_out() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("demo");
    demo_model(&model);
    // soft and hard limit 256: more half-open clients than the server has file descriptors
    let mut child = Command::new("sh")
        .args([
            "-c",
            "ulimit -n 256 && exec \"$0\" \"$@\"",
            env!("CARGO_BIN_EXE_forkscore"),
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--revision",
            "demo",
            "--port",
            "0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("open-file limit 256"), "{line}");
    assert!(line.contains("at most 192 connections"), "{line}");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let idlers: Vec<TcpStream> = (0..400)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            c.write_all(b"GET /health HTTP/1.1\r\nho").unwrap();
            c
        })
        .collect();
    let started = std::time::Instant::now();
    let (status, body) = http(&addr, "GET", "/health", "");
    assert_eq!(status, 200, "{body}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(idlers);
    assert!(sigterm(&mut child).success());
}
