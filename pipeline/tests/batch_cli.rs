//! The real `forkscore batch` binary on a tiny real model (testkit's Qwen2.5-shaped checkpoint,
//! CPU f32): the example file end to end, grouped vs direct, and a job SIGKILLed at several
//! points then `--resume`d — every id exactly once, results equal to an uninterrupted run.

use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tolerance::Tolerance;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/examples")
}

fn forkscore(model: &Path, input: &Path, output: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_forkscore"));
    c.args(["batch", "--quiet", "--revision", "tiny-test", "--model"])
        .arg(model)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn probabilities(r: &Value) -> Vec<f32> {
    r["fields"]
        .as_object()
        .map(|f| {
            f.values()
                .flat_map(|f| {
                    f["scores"]
                        .as_object()
                        .unwrap()
                        .values()
                        .map(|p| p.as_f64().unwrap() as f32)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Same ids in the same order, same values or error kinds, probabilities within `tol`.
fn assert_same_results(got: &[Value], want: &[Value], tol: Tolerance, what: &str) {
    let ids = |rs: &[Value]| rs.iter().map(|r| r["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(got), ids(want), "{what}: ids");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["line"], w["line"], "{what}");
        assert_eq!(g["output"], w["output"], "{what}: line {}", w["line"]);
        assert_eq!(
            g["error"]["kind"], w["error"]["kind"],
            "{what}: line {}",
            w["line"]
        );
        tol.assert_close(
            &format!("{what}: line {}", w["line"]),
            &probabilities(g),
            &probabilities(w),
        );
    }
}

#[test]
fn the_binary_scores_the_example_file_on_a_tiny_model() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let dir = tempfile::tempdir().unwrap();
    let schema = examples().join("parallel_schema.json");
    let schema = schema.to_str().unwrap();
    let input = examples().join("decisions.jsonl");
    let grouped = dir.path().join("grouped.jsonl");
    let out = forkscore(&model, &input, &grouped, &["--schema-file", schema])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recs = records(&grouped);
    assert_eq!(recs.len(), 35);
    assert_eq!(recs.iter().filter(|r| r.get("error").is_some()).count(), 12);
    let p = &recs[0]["provenance"];
    assert_eq!(p["revision"], "tiny-test");
    assert_eq!(p["architecture"], "Qwen2ForCausalLM");
    assert_eq!(
        (
            p["dtype"].as_str(),
            p["device"].as_str(),
            p["batch_mode"].as_str()
        ),
        (Some("f32"), Some("cpu"), Some("grouped"))
    );
    assert!(
        p["fingerprint"].as_str().is_some_and(|f| !f.is_empty()) && p["schema_hash"].is_string()
    );
    assert!(recs[0]["telemetry"]["group"]["size"].as_u64().unwrap() > 1);

    // a second run refuses to overwrite; --force does
    let again = forkscore(&model, &input, &grouped, &["--schema-file", schema])
        .output()
        .unwrap();
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--resume"));

    let direct = dir.path().join("direct.jsonl");
    let out = forkscore(
        &model,
        &input,
        &direct,
        &["--schema-file", schema, "--batch-mode", "direct"],
    )
    .output()
    .unwrap();
    assert!(out.status.success());
    assert_same_results(
        &records(&direct),
        &recs,
        Tolerance::CPU_F32_STRICT,
        "direct vs grouped",
    );

    // not a terminal: no progress bar on stderr, only the one-line summary
    let loud = dir.path().join("loud.jsonl");
    let c = forkscore(
        &model,
        &input,
        &loud,
        &["--schema-file", schema, "--window", "4"],
    );
    let args: Vec<_> = c
        .get_args()
        .filter(|a| *a != "--quiet")
        .map(|a| a.to_os_string())
        .collect();
    let out = Command::new(c.get_program())
        .args(args)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("ETA") && !stderr.contains('\r'),
        "{stderr}"
    );
    // the summary counts the error records by kind, as the output holds them
    let mut want = std::collections::BTreeMap::<String, u64>::new();
    for r in records(&loud) {
        if let Some(k) = r["error"]["kind"].as_str() {
            *want.entry(k.to_string()).or_default() += 1;
        }
    }
    let counts = stderr
        .split_once("35 lines written (12 errors: ")
        .and_then(|(_, rest)| rest.split_once("),"))
        .map(|(json, _)| json)
        .unwrap_or_else(|| panic!("no error counts in {stderr}"));
    let got: std::collections::BTreeMap<String, u64> = serde_json::from_str(counts).unwrap();
    assert_eq!(got, want, "{stderr}");

    // --fail-fast exits non-zero after writing the first error record
    let ff = dir.path().join("ff.jsonl");
    let out = forkscore(
        &model,
        &input,
        &ff,
        &["--schema-file", schema, "--fail-fast"],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        records(&ff).last().unwrap()["error"]["kind"],
        "invalid_json"
    );
}

/// An input of `n` distinct decisions over two schemas, with a bad line every 17.
fn big_input(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("big.jsonl");
    let mut text = String::new();
    for i in 0..n {
        if i % 17 == 16 {
            text.push_str(&format!("{{\"id\": \"bad-{i}\", \"context\": \n"));
            continue;
        }
        let schema = if i % 3 == 0 {
            "code_security.json"
        } else {
            "fintech_fraud.json"
        };
        let context = format!(
            "Case {i}: {} Amount ${}.",
            "details ".repeat(i % 7 + 1),
            i * 37
        );
        let line = serde_json::json!({"id": format!("case-{i}"), "context": context, "schema_file": examples().join(schema)});
        text.push_str(&format!("{line}\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_killed_job_resumes_without_duplicates_or_gaps() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let dir = tempfile::tempdir().unwrap();
    let n = 120;
    let input = big_input(dir.path(), n);
    let budget = ["--group-max-rows", "8", "--window", "6"];
    let full = dir.path().join("full.jsonl");
    let t = Instant::now();
    let out = forkscore(&model, &input, &full, &budget).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uninterrupted = t.elapsed();
    let want = records(&full);
    assert_eq!(want.len(), n);

    let mut killed_mid_run = 0;
    for (k, mode) in [(5usize, "grouped"), (40, "grouped"), (85, "direct")] {
        let out_path = dir.path().join(format!("killed-{k}.jsonl"));
        let mode_args = ["--batch-mode", mode];
        let reference = if mode == "direct" {
            let p = dir.path().join("full-direct.jsonl");
            if !p.exists() {
                assert!(
                    forkscore(&model, &input, &p, &[&budget[..], &mode_args[..]].concat())
                        .status()
                        .unwrap()
                        .success()
                );
            }
            records(&p)
        } else {
            want.clone()
        };
        let mut child = forkscore(
            &model,
            &input,
            &out_path,
            &[&budget[..], &mode_args[..]].concat(),
        )
        .spawn()
        .unwrap();
        let deadline = Instant::now() + uninterrupted * 20 + Duration::from_secs(30);
        loop {
            let lines = std::fs::read(&out_path)
                .map(|b| b.iter().filter(|&&c| c == b'\n').count())
                .unwrap_or(0);
            if lines >= k || Instant::now() > deadline || child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().ok(); // SIGKILL
        child.wait().unwrap();
        let at_kill = std::fs::read_to_string(&out_path)
            .unwrap_or_default()
            .lines()
            .count();
        if at_kill < n {
            killed_mid_run += 1;
        }
        let resumed = forkscore(
            &model,
            &input,
            &out_path,
            &[&budget[..], &mode_args[..], &["--resume"][..]].concat(),
        )
        .output()
        .unwrap();
        assert!(
            resumed.status.success(),
            "{}",
            String::from_utf8_lossy(&resumed.stderr)
        );
        let got = records(&out_path);
        // every input line (bad lines have no id) exactly once, every id exactly once
        let mut lines: Vec<u64> = got.iter().map(|r| r["line"].as_u64().unwrap()).collect();
        lines.dedup();
        assert_eq!(
            lines,
            (1..=n as u64).collect::<Vec<_>>(),
            "kill at {k}: every line exactly once"
        );
        let mut ids: Vec<String> = got
            .iter()
            .filter(|r| !r["id"].is_null())
            .map(|r| r["id"].to_string())
            .collect();
        let with_id = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), with_id, "kill at {k}: an id written twice");
        // direct mode recomputes each line alone: bit-identical. Grouped mode may pair
        // contexts differently after the resume point: slot-merged vs alone tolerance.
        let tol = if mode == "direct" {
            Tolerance::EXACT
        } else {
            Tolerance::CPU_F32_STRICT
        };
        assert_same_results(
            &got,
            &reference,
            tol,
            &format!("kill at {k} ({at_kill} lines written)"),
        );
        eprintln!(
            "killed at {at_kill}/{n} lines ({mode}); resumed output equals the uninterrupted run"
        );
    }
    assert!(
        killed_mid_run >= 2,
        "the job finished before most kills ({uninterrupted:?} uninterrupted)"
    );
}

fn newlines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

fn marker_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".done.json");
    PathBuf::from(s)
}

/// Spawn `cmd`, SIGKILL it as soon as `ready()` holds (or it exits, or after `limit`), and
/// say whether it was still running when killed.
fn kill_when(mut cmd: Command, limit: Duration, ready: impl Fn() -> bool) -> bool {
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + limit;
    let mut running = true;
    loop {
        if child.try_wait().unwrap().is_some() {
            running = false;
            break;
        }
        if ready() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().ok(); // SIGKILL
    child.wait().unwrap();
    running
}

fn merge_cmd(output: &Path, shards: &[PathBuf], extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_forkscore"))
        .arg("merge")
        .arg("--output")
        .arg(output)
        .args(extra)
        .args(shards)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// `merge` takes a shard only with the completion marker its job writes on a clean finish: a
/// shard SIGKILLed mid-run, one killed right after creating its output and a finished one
/// killed while `--force` rewrites it are refused by name; `--resume` finishes them and the
/// merge then covers every input line exactly once (also checked against `--input`). A merge
/// SIGKILLed mid-write leaves its temporary file, which the next merge removes.
#[test]
fn merge_refuses_killed_shards_until_they_are_resumed() {
    let model = ensure_tiny_model(&TinySpec::qwen25());
    let dir = tempfile::tempdir().unwrap();
    let n = 120;
    let input = big_input(dir.path(), n);
    let shard_job = |i: u32, out: &Path, extra: &[&str]| {
        let spec = format!("{i}/3");
        let mut args = vec![
            "--group-max-rows",
            "8",
            "--window",
            "6",
            "--shard",
            spec.as_str(),
        ];
        args.extend_from_slice(extra);
        forkscore(&model, &input, out, &args)
    };
    let shards: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("shard-{i}.jsonl")))
        .collect();
    let t = Instant::now();
    for i in 0..2 {
        let o = shard_job(i, &shards[i as usize], &[]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(marker_of(&shards[i as usize]).exists());
    }
    let limit = t.elapsed() * 20 + Duration::from_secs(30);
    let merged = dir.path().join("merged.jsonl");
    let refused = |files: &[PathBuf], named: &Path| {
        let o = merge_cmd(&merged, files, &[]);
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(
            e.contains(&named.display().to_string()) && e.contains("no completion marker"),
            "{e}"
        );
        assert!(!merged.exists(), "a refused merge writes nothing");
    };

    // killed mid-run: the file ends on a complete record, but the job did not finish
    let s2 = &shards[2];
    let running = kill_when(shard_job(2, s2, &[]), limit, || newlines(s2) >= 3);
    assert!(running, "shard 2 finished before the kill ({limit:?})");
    let at_kill = newlines(s2);
    assert!(at_kill >= 3 && !marker_of(s2).exists(), "{at_kill}");
    refused(&shards, s2);

    // killed right after creating its output
    let early = dir.path().join("early.jsonl");
    let running = kill_when(shard_job(2, &early, &[]), limit, || early.exists());
    assert!(running && early.exists() && !marker_of(&early).exists());
    refused(
        &[shards[0].clone(), shards[1].clone(), early.clone()],
        &early,
    );

    // a finished shard killed while --force rewrites it: its marker went first
    let s0 = &shards[0];
    let m0 = marker_of(s0);
    let running = kill_when(shard_job(0, s0, &["--force"]), limit, || {
        !m0.exists() && newlines(s0) >= 2
    });
    assert!(running, "the --force run finished before the kill");
    refused(&shards, s0);

    // --resume finishes both; the merge covers every line exactly once
    for (i, s) in [(0u32, s0), (2, s2)] {
        let o = shard_job(i, s, &["--resume"]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(marker_of(s).exists());
    }
    let input_s = input.display().to_string();
    let o = merge_cmd(&merged, &shards, &["--input", &input_s]);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(&format!("{n} records from 3 shard outputs")),
        "{e}"
    );
    let got = records(&merged);
    let lines: Vec<u64> = got.iter().map(|r| r["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, (1..=n as u64).collect::<Vec<_>>());

    // a merge killed mid-write (blocked on an --input FIFO that never delivers) leaves its
    // locked temporary file; the next merge into that folder removes it
    let fifo = dir.path().join("in.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // held open for writing so the merge's open does not block and its reads wait
    let _writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let merged2 = dir.path().join("merged2.jsonl");
    let temps = || -> Vec<PathBuf> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(".merged2.jsonl.forkscore-merge.")
            })
            .collect()
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_forkscore"));
    cmd.arg("merge")
        .arg("--output")
        .arg(&merged2)
        .arg("--input")
        .arg(&fifo)
        .args(&shards)
        .stderr(Stdio::null());
    let running = kill_when(cmd, Duration::from_secs(30), || !temps().is_empty());
    assert!(running, "the blocked merge exited");
    let left = temps();
    assert_eq!(left.len(), 1, "{left:?}");
    let o = merge_cmd(&merged2, &shards, &[]);
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("removed") && e.contains(&left[0].display().to_string()),
        "{e}"
    );
    assert!(temps().is_empty());
    assert_eq!(records(&merged2).len(), n);
}
