//! `forkscore batch --resume` against the real binary on a tiny real model: the literal-value
//! rule and the calibration in use are recorded in provenance, and a resume under another rule
//! or another calibration file is refused naming the key, while the same rule, or the same
//! calibration file at another path, continues the job.

use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CONTEXT: &str = "Our production payment service is down for every customer.";

fn forkscore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forkscore"))
        .args(args)
        .output()
        .expect("forkscore runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn schema() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/examples/parallel_schema.json")
        .display()
        .to_string()
}

fn input_file(dir: &Path, n: usize) -> PathBuf {
    let p = dir.join("in.jsonl");
    let text: String = (0..n)
        .map(|i| format!("{{\"id\": \"r{i}\", \"context\": \"{CONTEXT} ({i})\"}}\n"))
        .collect();
    std::fs::write(&p, text).expect("write input");
    p
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("read output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("record"))
        .collect()
}

/// Keep the first `n` records of `path` (an interrupted job); returns what was kept.
fn cut(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).expect("read output");
    let kept: String = text.lines().take(n).map(|l| format!("{l}\n")).collect();
    std::fs::write(path, &kept).expect("cut output");
    kept
}

/// What a record decided (its values and probabilities), without timings.
fn decided(r: &Value) -> (Value, Value, Value) {
    (r["id"].clone(), r["output"].clone(), r["fields"].clone())
}

fn batch(model: &str, input: &Path, output: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "batch",
        "--quiet",
        "--model",
        model,
        "--revision",
        "t",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ];
    let schema = schema();
    args.extend(["--schema-file", &schema]);
    args.extend(extra);
    forkscore(&args)
}

fn assert_refused(o: &Output, key: &str, output: &Path, kept: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
    assert!(stderr(o).contains(&format!("{key} = ")), "{}", stderr(o));
    assert_eq!(
        std::fs::read_to_string(output).expect("read"),
        kept,
        "a refused resume appended"
    );
}

#[test]
fn resume_compares_the_literal_value_rule() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = ensure_tiny_model(&TinySpec::qwen25()).display().to_string();
    let input = input_file(tmp.path(), 4);
    let literal = ["--scoring", "literal"];
    let greedy = ["--scoring", "literal", "--literal-value", "greedy"];

    // the default rule is not written (outputs of default runs are unchanged)
    let argmax_out = tmp.path().join("argmax.jsonl");
    let o = batch(&model, &input, &argmax_out, &literal);
    assert!(o.status.success(), "{}", stderr(&o));
    for r in records(&argmax_out) {
        assert!(r["provenance"].get("literal_value").is_none(), "{r}");
    }
    // greedy is written, on every record
    let greedy_out = tmp.path().join("greedy.jsonl");
    let o = batch(&model, &input, &greedy_out, &greedy);
    assert!(o.status.success(), "{}", stderr(&o));
    let full = records(&greedy_out);
    assert_eq!(full.len(), 4);
    for r in &full {
        assert_eq!(r["provenance"]["literal_value"], "greedy", "{r}");
    }

    // greedy over an argmax output, and argmax over a greedy one: refused, nothing appended
    let kept = cut(&argmax_out, 2);
    let o = batch(
        &model,
        &input,
        &argmax_out,
        &[&greedy[..], &["--resume"]].concat(),
    );
    assert_refused(&o, "literal_value", &argmax_out, &kept);
    assert!(
        stderr(&o).contains("literal_value = null"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("\"greedy\""), "{}", stderr(&o));
    let kept = cut(&greedy_out, 2);
    let o = batch(
        &model,
        &input,
        &greedy_out,
        &[&literal[..], &["--resume"]].concat(),
    );
    assert_refused(&o, "literal_value", &greedy_out, &kept);

    // the same rule continues, to the decisions of the uninterrupted run
    let o = batch(
        &model,
        &input,
        &greedy_out,
        &[&greedy[..], &["--resume"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let resumed = records(&greedy_out);
    assert_eq!(
        resumed.iter().map(decided).collect::<Vec<_>>(),
        full.iter().map(decided).collect::<Vec<_>>()
    );
    assert!(resumed
        .iter()
        .all(|r| r["provenance"]["literal_value"] == "greedy"));
}

/// A calibration file for `model` (any revision): `risk_level` at temperature `t_risk`, every
/// other field at 1.
fn calibration(path: &Path, model: &str, t_risk: f64) {
    std::fs::create_dir_all(path.parent().unwrap()).expect("mkdir");
    let file = json!({"entries": [{"model_id": model, "revision": null, "temperature": 1.0,
                                   "fields": {"risk_level": {"temperature": t_risk}}}]});
    std::fs::write(path, serde_json::to_string_pretty(&file).unwrap()).expect("write");
}

#[test]
fn resume_compares_the_calibration_file_content_not_its_path() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = ensure_tiny_model(&TinySpec::qwen25()).display().to_string();
    let input = input_file(tmp.path(), 4);
    let out = tmp.path().join("out.jsonl");
    let first = tmp.path().join("a/calibration.json");
    calibration(&first, &model, 0.5);
    let o = batch(
        &model,
        &input,
        &out,
        &["--calibration-file", first.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let full = records(&out);
    let source = &full[0]["provenance"]["temperature_source"];
    assert_eq!(source["kind"], "calibrated", "{source}");
    assert_eq!(source["fields"], json!(["risk_level"]));
    let kept = cut(&out, 2);

    // another per-field temperature under the same overall temperature (1): only the file's
    // SHA-256 tells the two apart
    let other = tmp.path().join("c/calibration.json");
    calibration(&other, &model, 2.0);
    let o = batch(
        &model,
        &input,
        &out,
        &["--calibration-file", other.to_str().unwrap(), "--resume"],
    );
    assert_refused(&o, "temperature_source", &out, &kept);
    // no calibration file at all: the default temperature source
    let o = batch(&model, &input, &out, &["--resume"]);
    assert_refused(&o, "temperature_source", &out, &kept);

    // the same content at another path continues, to the decisions of the uninterrupted run
    let moved = tmp.path().join("b/moved.json");
    std::fs::create_dir_all(moved.parent().unwrap()).expect("mkdir");
    std::fs::copy(&first, &moved).expect("copy");
    let o = batch(
        &model,
        &input,
        &out,
        &["--calibration-file", moved.to_str().unwrap(), "--resume"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let resumed = records(&out);
    assert_eq!(
        resumed.iter().map(decided).collect::<Vec<_>>(),
        full.iter().map(decided).collect::<Vec<_>>()
    );
    let sha = |r: &Value| r["provenance"]["temperature_source"]["file"]["sha256"].clone();
    let file = |r: &Value| r["provenance"]["temperature_source"]["file"]["file"].clone();
    assert_eq!(sha(&resumed[3]), sha(&resumed[0]));
    assert_eq!(file(&resumed[0]), json!(first.display().to_string()));
    assert_eq!(file(&resumed[3]), json!(moved.display().to_string()));
}
