//! `forkscore batch` on a tiny real model with OpenAI Batch API files (`--format openai`):
//! output lines in OpenAI's batch output shape, in input order, with error lines; the same
//! decision as the equivalent native line; resume, shards + merge; `--input -` / `--output -`;
//! the error counts by kind in the summary; and the Ctrl-C hint.

use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_forkscore"))
}

/// `forkscore batch --model <tiny> …` (no --revision: the folder is recorded as unlabelled).
fn batch(model: &Path, args: &[&str]) -> Command {
    let mut c = bin();
    c.arg("batch").arg("--model").arg(model).args(args);
    c
}

fn run_ok(mut c: Command) -> Output {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "forkscore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("every output line is JSON"))
        .collect()
}

fn read(path: &Path) -> Vec<Value> {
    lines(&std::fs::read_to_string(path).unwrap())
}

fn schema() -> Value {
    json!({"type": "object", "additionalProperties": false,
           "required": ["severity", "outage"],
           "properties": {
               "severity": {"type": "string", "enum": ["low", "medium", "high"],
                            "description": "How severe the incident is."},
               "outage": {"type": "boolean", "description": "Whether a service is down."}}})
}

fn openai_line(custom_id: &str, messages: Value, schema: Value) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "gpt-4o-mini", "temperature": 0, "messages": messages,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "triage", "strict": true, "schema": schema}}}})
    .to_string()
}

const CONTEXTS: [&str; 4] = [
    "The payment API is down for every customer.",
    "A typo on the pricing page.",
    "Login is slow for one user in Berlin.",
    "All EU databases are unreachable.",
];

/// An OpenAI batch file: good lines, an unsupported property, a broken line.
fn openai_file(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for (i, c) in CONTEXTS.iter().enumerate() {
        let messages = if i == 1 {
            json!([{"role": "system", "content": "You triage incidents."}, {"role": "user", "content": c}])
        } else {
            json!([{"role": "user", "content": c}])
        };
        text.push_str(&openai_line(&format!("req-{i}"), messages, schema()));
        text.push('\n');
    }
    let number = json!({"type": "object", "properties": {"cost": {"type": "number"}}});
    text.push_str(&openai_line(
        "req-number",
        json!([{"role": "user", "content": "x"}]),
        number,
    ));
    text.push('\n');
    text.push_str("{\"custom_id\": \"req-broken\", \"body\": \n");
    let path = dir.join("requests.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_openai_batch_file_runs_unchanged_and_answers_in_the_batch_output_shape() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let dir = tempfile::tempdir().unwrap();
    let input = openai_file(dir.path());
    let output = dir.path().join("results.jsonl");
    let out = run_ok(batch(
        &model,
        &[
            "--format",
            "openai",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
    ));
    let got = read(&output);
    let ids: Vec<Value> = got.iter().map(|r| r["custom_id"].clone()).collect();
    assert_eq!(
        ids,
        vec![
            json!("req-0"),
            json!("req-1"),
            json!("req-2"),
            json!("req-3"),
            json!("req-number"),
            Value::Null
        ]
    );
    for r in &got[..4] {
        assert!(r["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(r["error"], Value::Null);
        let resp = &r["response"];
        assert_eq!(resp["status_code"], 200);
        assert!(resp["request_id"].is_string());
        let body = &resp["body"];
        assert_eq!(body["object"], "chat.completion");
        let choice = &body["choices"][0];
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["finish_reason"], "stop");
        let decision: Value =
            serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
        assert!(["low", "medium", "high"].contains(&decision["severity"].as_str().unwrap()));
        assert!(decision["outage"].is_boolean());
        // the extension field holds the native per-field probabilities
        let scores = body["forkscore"]["fields"]["severity"]["scores"]
            .as_object()
            .unwrap();
        let total: f64 = scores.values().map(|p| p.as_f64().unwrap()).sum();
        assert!((total - 1.0).abs() < 1e-4, "{scores:?}");
        let best = scores
            .iter()
            .max_by(|a, b| a.1.as_f64().partial_cmp(&b.1.as_f64()).unwrap())
            .unwrap()
            .0;
        assert_eq!(decision["severity"], json!(best));
    }
    let number = &got[4];
    assert_eq!(number["response"], Value::Null);
    assert_eq!(number["error"]["code"], "invalid_schema");
    assert!(
        number["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cost"),
        "{number}"
    );
    assert_eq!(got[5]["error"]["code"], "invalid_json");
    // the summary counts errors by kind
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(r#"(2 errors: {"invalid_json":1,"invalid_schema":1})"#),
        "{stderr}"
    );

    // the same request as a native line gets the same decision and probabilities
    let native = dir.path().join("native.jsonl");
    let native_schema = serde_json::to_string(&schema()).unwrap();
    std::fs::write(
        &native,
        format!(
            "{}\n",
            json!({"id": "req-0", "context": CONTEXTS[0], "schema": serde_json::from_str::<Value>(&native_schema).unwrap()})
        ),
    )
    .unwrap();
    let native_out = run_ok(batch(
        &model,
        &[
            "--quiet",
            "--input",
            native.to_str().unwrap(),
            "--output",
            "-",
        ],
    ));
    let n = &lines(&String::from_utf8_lossy(&native_out.stdout))[0];
    let body = &got[0]["response"]["body"];
    assert_eq!(
        serde_json::from_str::<Value>(body["choices"][0]["message"]["content"].as_str().unwrap())
            .unwrap(),
        n["output"]
    );
    assert_eq!(body["forkscore"]["fields"], n["fields"]);

    // an OpenAI line read in the native format says what to do
    let native_read = run_ok(batch(
        &model,
        &[
            "--quiet",
            "--input",
            input.to_str().unwrap(),
            "--output",
            "-",
        ],
    ));
    let first = &lines(&String::from_utf8_lossy(&native_read.stdout))[0];
    assert_eq!(first["error"]["kind"], "missing_id");
    assert!(first["error"]["message"]
        .as_str()
        .unwrap()
        .contains("this looks like an OpenAI Batch API line (custom_id, method, url, body); use --format openai"));
}

#[test]
fn openai_outputs_resume_and_merge_like_native_ones() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let dir = tempfile::tempdir().unwrap();
    let input = openai_file(dir.path());
    let inp = input.to_str().unwrap();
    let full = dir.path().join("full.jsonl");
    run_ok(batch(
        &model,
        &[
            "--quiet",
            "--format",
            "openai",
            "--input",
            inp,
            "--output",
            full.to_str().unwrap(),
        ],
    ));
    let want = read(&full);
    // what must not depend on how lines were grouped: ids, lines, decisions, errors, and the
    // probabilities (to 1e-4: a group's padding may move the last digits)
    let same = |got: Vec<Value>, want: &[Value], what: &str| {
        let key = |r: &Value| {
            json!([
                r["id"],
                r["custom_id"],
                r["forkscore"]["line"],
                r["error"],
                r.pointer("/response/body/choices/0/message/content")
            ])
        };
        let scores = |r: &Value| -> Vec<f64> {
            r.pointer("/response/body/forkscore/fields")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|f| f.values())
                .flat_map(|f| f["scores"].as_object().unwrap().values())
                .map(|p| p.as_f64().unwrap())
                .collect()
        };
        assert_eq!(got.len(), want.len(), "{what}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(key(g), key(w), "{what}");
            let (gs, ws) = (scores(g), scores(w));
            assert_eq!(gs.len(), ws.len(), "{what}");
            assert!(
                gs.iter().zip(&ws).all(|(a, b)| (a - b).abs() < 1e-4),
                "{what}: {gs:?} vs {ws:?}"
            );
        }
    };

    // an output cut after two records and a torn third resumes to the full output
    let text = std::fs::read_to_string(&full).unwrap();
    let cut: Vec<&str> = text.split_inclusive('\n').collect();
    let resumed = dir.path().join("resumed.jsonl");
    std::fs::write(&resumed, format!("{}{}", cut[0], cut[1]) + &cut[2][..20]).unwrap();
    run_ok(batch(
        &model,
        &[
            "--quiet",
            "--format",
            "openai",
            "--resume",
            "--input",
            inp,
            "--output",
            resumed.to_str().unwrap(),
        ],
    ));
    same(read(&resumed), &want, "resumed");

    // two shards, merged, give the unsharded output
    let mut shards = Vec::new();
    for i in 0..2 {
        let p = dir.path().join(format!("shard-{i}.jsonl"));
        run_ok(batch(
            &model,
            &[
                "--quiet",
                "--format",
                "openai",
                "--shard",
                &format!("{i}/2"),
                "--input",
                inp,
                "--output",
                p.to_str().unwrap(),
            ],
        ));
        shards.push(p);
    }
    let merged = dir.path().join("merged.jsonl");
    let mut m = bin();
    m.arg("merge")
        .args(&shards)
        .arg("--output")
        .arg(&merged)
        .arg("--input")
        .arg(&input);
    let out = m.output().unwrap();
    assert!(
        out.status.success(),
        "merge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    same(read(&merged), &want, "merged");
}

#[test]
fn stdin_to_stdout_and_resume_is_refused_for_stdout() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let schema = format!(
        "{}/../fixtures/examples/parallel_schema.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut text = String::new();
    for (i, c) in CONTEXTS.iter().enumerate() {
        text.push_str(&format!("{}\n", json!({"id": i, "context": c})));
    }
    text.push_str("not json\n");
    let mut child = batch(
        &model,
        &["--schema-file", &schema, "--input", "-", "--output", "-"],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = lines(&String::from_utf8_lossy(&out.stdout));
    let ids: Vec<Value> = got.iter().map(|r| r["id"].clone()).collect();
    assert_eq!(
        ids,
        vec![json!(0), json!(1), json!(2), json!(3), Value::Null]
    );
    assert!(got[..4].iter().all(|r| r["output"].is_object()));
    // the summary goes to stderr, never into the records
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(r#"5 lines written (1 errors: {"invalid_json":1})"#),
        "{stderr}"
    );

    let out = batch(
        &model,
        &[
            "--schema-file",
            &schema,
            "--input",
            "-",
            "--output",
            "-",
            "--resume",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--resume needs an output file"), "{err}");
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_on_a_complete_record_and_says_how_to_resume() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let dir = tempfile::tempdir().unwrap();
    let schema = format!(
        "{}/../fixtures/examples/parallel_schema.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let n = 600;
    let input = dir.path().join("many.jsonl");
    let text: String = (0..n)
        .map(|i| {
            format!(
                "{}\n",
                json!({"id": i, "context": format!("Case {i}: the service is slow.")})
            )
        })
        .collect();
    std::fs::write(&input, text).unwrap();
    let output = dir.path().join("out.jsonl");
    let args = [
        "--quiet",
        "--schema-file",
        &schema,
        "--window",
        "4",
        "--group-max-rows",
        "6",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ];
    let mut child = batch(&model, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&output).map_or(0, |t| t.lines().count()) < 3 {
        assert!(Instant::now() < deadline, "no records after 120 s");
        assert!(child.try_wait().unwrap().is_none(), "the job ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on the child's pid with SIGINT has no memory effects here
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let written = read(&output);
    if out.status.code() == Some(0) {
        // the job finished before the signal arrived: nothing to check
        eprintln!("the job finished before SIGINT arrived; the interrupt path was not exercised");
        assert_eq!(written.len(), n);
        return;
    }
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let hint = format!(
        "interrupted: {} lines written; rerun with --resume to continue",
        written.len()
    );
    assert!(stderr.contains(&hint), "{stderr}");
    assert!(written.len() < n);
    eprintln!("interrupted after {} of {n} lines", written.len());
    // the output ends on a complete record, and --resume finishes the job
    let mut args = args.to_vec();
    args.push("--resume");
    run_ok(batch(&model, &args));
    let ids: Vec<Value> = read(&output).iter().map(|r| r["id"].clone()).collect();
    assert_eq!(ids, (0..n).map(|i| json!(i)).collect::<Vec<_>>());
}
