//! `forkscore eval` and `forkscore calibrate` end to end on the demo model with the tiny
//! labelled file of fixtures/examples/: reports, diagrams, counted failures, resume, the
//! generation baseline, the calibration file and its effect on `forkscore score`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn forkscore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forkscore"))
        .args(args)
        .output()
        .expect("forkscore runs")
}

fn example(name: &str) -> String {
    format!("{}/../fixtures/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "forkscore failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn demo(dir: &Path) -> String {
    let d = dir.join("demo");
    let out = forkscore(&["demo-model", d.to_str().unwrap(), "--arch", "qwen2.5"]);
    ok(&out);
    d.to_str().unwrap().to_string()
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn eval_reports_metrics_diagrams_and_counted_failures_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let preds = tmp.path().join("preds.jsonl");
    let report = tmp.path().join("out/report.json");
    std::fs::create_dir_all(report.parent().unwrap()).unwrap();
    let input = example("labelled_tiny.jsonl");
    let args = |extra: &[&str]| {
        let mut a: Vec<String> = [
            "eval",
            "--model",
            &model,
            "--revision",
            "demo",
            "--input",
            &input,
            "--predictions",
            s(&preds),
            "--report",
            s(&report),
            "--quiet",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        forkscore(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let stdout = ok(&run(&[]));
    assert!(stdout.contains("topic"), "{stdout}");
    let r = read_json(&report);
    // 17 labelled lines (15 topic/urgent, 1 question, 1 bad label); 1 line without a label
    assert_eq!(r["counts"]["lines_labelled"], 17);
    assert_eq!(r["counts"]["label_problems"].as_array().unwrap().len(), 1);
    assert_eq!(r["counts"]["decided"], 17);
    assert_eq!(r["counts"]["failures_by_kind"]["label_not_a_choice"], 1);
    let topic = &r["fields"]["topic"];
    assert_eq!(topic["n"], 15);
    assert_eq!(
        topic["classes"],
        serde_json::json!(["business", "sport", "tech"])
    );
    let confusion: Vec<Vec<u64>> = serde_json::from_value(topic["confusion"].clone()).unwrap();
    assert_eq!(confusion.iter().flatten().sum::<u64>(), 15);
    assert_eq!(
        confusion
            .iter()
            .map(|r| r.iter().sum::<u64>())
            .collect::<Vec<_>>(),
        [5, 5, 5]
    );
    let diag: u64 = (0..3).map(|k| confusion[k][k]).sum();
    assert!((topic["accuracy"].as_f64().unwrap() - diag as f64 / 15.0).abs() < 1e-12);
    for key in [
        "ece_equal_width",
        "ece_equal_mass",
        "brier",
        "log_loss",
        "macro_f1",
    ] {
        assert!(topic[key].as_f64().unwrap().is_finite(), "{key}");
    }
    assert_eq!(topic["bins"], 10);
    assert_eq!(
        r["fields"]["urgent"]["n"], 15,
        "the bad-label line labels the topic only"
    );
    assert_eq!(r["fields"]["answer"]["n"], 1);
    // a reliability diagram per field, beside the report
    let svg =
        std::fs::read_to_string(report.parent().unwrap().join("topic.reliability.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Reliability of field “topic” (N = 15)"));
    assert!(svg.contains("equal-width, 10 bins") && svg.contains("perfect calibration"));
    // and as a PNG beside it, named in the report
    let png_path = report.parent().unwrap().join("topic.reliability.png");
    let png = std::fs::read(&png_path).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&png[12..16], b"IHDR");
    assert_eq!(topic["png"], png_path.display().to_string());
    // the predictions are the batch job's records; a rerun needs --resume and scores nothing
    let err = run(&[]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("--resume"));
    ok(&run(&["--resume"]));
    let again = read_json(&report);
    assert_eq!(again["scoring_job"]["records_scored_in_this_run"], 0);
    assert_eq!(again["fields"], r["fields"]);
    // the predictions were scored under the default literal-value rule: resuming them under
    // another one is another run, refused naming the key, and the predictions stay as they are
    let before = std::fs::read_to_string(&preds).unwrap();
    let other = run(&["--resume", "--literal-value", "greedy"]);
    assert_eq!(other.status.code(), Some(1));
    let e = String::from_utf8_lossy(&other.stderr);
    assert!(e.contains("literal_value = null"), "{e}");
    assert_eq!(std::fs::read_to_string(&preds).unwrap(), before);
}

/// `forkscore eval --baseline generate` of the tiny labelled file on `model`, quiet, plus
/// `extra`.
fn baseline_eval(model: &str, preds: &Path, report: &Path, extra: &[&str]) -> Output {
    let input = example("labelled_tiny.jsonl");
    let mut a = vec![
        "eval",
        "--model",
        model,
        "--revision",
        "demo",
        "--input",
        &input,
        "--predictions",
        s(preds),
        "--report",
        s(report),
        "--quiet",
        "--baseline",
        "generate",
    ];
    a.extend_from_slice(extra);
    forkscore(&a)
}

#[test]
fn the_generation_baseline_runs_on_the_same_items() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let preds = tmp.path().join("p.jsonl");
    let report = tmp.path().join("r.json");
    ok(&baseline_eval(
        &model,
        &preds,
        &report,
        &["--max-new-tokens", "8"],
    ));
    let b = &read_json(&report)["baseline"];
    assert_eq!(b["kind"], "generate");
    assert_eq!(b["items"], 17);
    let v = b["validity_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&v));
    assert_eq!(b["fields"]["topic"]["n"], 16, "15 + the bad-label line");
    assert_eq!(
        b["fields"]["topic"]["compared"], 16,
        "forkscore decided every line"
    );
    assert!(b["items_per_s"].as_f64().unwrap() > 0.0);
    let ratio = b["speed_ratio"].as_f64().unwrap();
    let want =
        b["forkscore_decisions_per_s"].as_f64().unwrap() / b["items_per_s"].as_f64().unwrap();
    assert!((ratio - want).abs() < 1e-9 * want);
}

fn field_probs(v: &serde_json::Value, field: &str) -> Vec<f64> {
    v["fields"][field]["scores"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn calibrate_writes_a_file_that_score_applies_per_field() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let preds = tmp.path().join("p.jsonl");
    let cal = tmp.path().join("cal.json");
    let report = tmp.path().join("cal-report.json");
    let input = example("labelled_tiny.jsonl");
    let stdout = ok(&forkscore(&[
        "calibrate",
        "--model",
        &model,
        "--revision",
        "demo",
        "--input",
        &input,
        "--predictions",
        s(&preds),
        "--output",
        s(&cal),
        "--report",
        s(&report),
        "--quiet",
        "--seed",
        "7",
    ]));
    assert!(stdout.contains("held-out"), "{stdout}");
    let file = read_json(&cal);
    let entry = &file["entries"][0];
    assert_eq!(entry["model_id"], model.as_str());
    assert_eq!(entry["revision"], serde_json::Value::Null);
    let t_topic = entry["fields"]["topic"]["temperature"].as_f64().unwrap();
    assert!((0.05..=20.0).contains(&t_topic));
    let r = read_json(&report);
    assert_eq!(
        r["items"]["train"].as_u64().unwrap() + r["items"]["held_out"].as_u64().unwrap(),
        17
    );
    for side in ["before", "after"] {
        assert!(
            r["fields"]["topic"][side]["ece_equal_width"]
                .as_f64()
                .unwrap()
                <= 1.0
        );
    }
    // the file round-trips through --calibration-file: score applies T_topic to topic only
    let score = |extra: &[&str]| {
        let mut a = vec![
            "score",
            "--model",
            &model,
            "--revision",
            "demo",
            "--schema-file",
        ];
        let schema = example("labelled_tiny_schema.json");
        a.push(&schema);
        a.extend_from_slice(&["--context", "The striker scored twice in the final."]);
        a.extend_from_slice(extra);
        let out = forkscore(&a);
        serde_json::from_str::<serde_json::Value>(&ok(&out)).unwrap()
    };
    let raw = score(&[]);
    let calibrated = score(&["--calibration-file", s(&cal)]);
    let logits: Vec<f64> = raw["fields"]["topic"]["logits"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| ((l - max) / t_topic).exp()).collect();
    let sum: f64 = e.iter().sum();
    let want: Vec<f64> = e.iter().map(|x| x / sum).collect();
    let got = field_probs(&calibrated, "topic");
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
    }
    if (t_topic - 1.0).abs() > 1e-3 {
        assert_ne!(got, field_probs(&raw, "topic"));
    }
    assert_eq!(
        calibrated["fields"]["topic"]["logits"],
        raw["fields"]["topic"]["logits"]
    );
    let src = &calibrated["provenance"]["temperature_source"];
    assert_eq!(src["kind"], "calibrated");
    assert_eq!(src["file"]["file"], s(&cal));
    assert_eq!(src["file"]["sha256"].as_str().unwrap().len(), 64);
    let listed: Vec<&String> = entry["fields"].as_object().unwrap().keys().collect();
    assert_eq!(src["fields"], serde_json::json!(listed));
    assert!(
        listed.len() >= 2,
        "topic and urgent have training items: {listed:?}"
    );
    // a field without a training item (the one-line question, here held out) is not written
    let answer = &r["fields"]["answer"];
    assert_eq!(answer["fitted"], answer["train"].as_u64().unwrap() > 0);
    assert_eq!(
        entry["fields"].get("answer").is_some(),
        answer["fitted"] == true
    );
    // --output is never overwritten silently
    let again = forkscore(&[
        "calibrate",
        "--model",
        &model,
        "--revision",
        "demo",
        "--input",
        &input,
        "--predictions",
        s(&preds),
        "--resume",
        "--output",
        s(&cal),
        "--quiet",
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--replace-output"));
}

#[test]
fn contextual_calibration_records_content_free_probabilities() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let preds: PathBuf = tmp.path().join("p.jsonl");
    let cal = tmp.path().join("cal.json");
    let input = example("labelled_tiny.jsonl");
    ok(&forkscore(&[
        "calibrate",
        "--model",
        &model,
        "--revision",
        "demo",
        "--input",
        &input,
        "--predictions",
        s(&preds),
        "--output",
        s(&cal),
        "--quiet",
        "--contextual",
    ]));
    let f = &read_json(&cal)["entries"][0]["fields"]["topic"];
    let cf: Vec<f64> = f["content_free"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(cf.len(), 3);
    assert!((cf.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{cf:?}");
    // score applies it: probabilities ∝ softmax(logits / T) / p_cf
    let schema = example("labelled_tiny_schema.json");
    let out = forkscore(&[
        "score",
        "--model",
        &model,
        "--revision",
        "demo",
        "--schema-file",
        &schema,
        "--context",
        "Shares fell.",
        "--calibration-file",
        s(&cal),
    ]);
    let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    let t = f["temperature"].as_f64().unwrap();
    let logits: Vec<f64> = v["fields"]["topic"]["logits"]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let z: Vec<f64> = logits
        .iter()
        .zip(&cf)
        .map(|(l, p)| l / t - p.ln())
        .collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    let got = field_probs(&v, "topic");
    for (a, b) in got.iter().zip(e.iter().map(|x| x / sum)) {
        assert!((a - b).abs() < 1e-6, "{got:?}");
    }
    // the value is the argmax of the calibrated probabilities
    let best = got.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let k = got.iter().position(|&p| p == best).unwrap();
    assert_eq!(
        v["fields"]["topic"]["value"],
        v["fields"]["topic"]["choices"][k]
    );
}

/// A relative --input path: its relative schema files are still found although the derived
/// batch input lives beside the predictions, in another folder.
#[test]
fn a_relative_input_path_resolves_its_schema_files() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let preds = tmp.path().join("p.jsonl");
    let report = tmp.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_forkscore"))
        .current_dir(format!("{}/..", env!("CARGO_MANIFEST_DIR")))
        .args([
            "eval",
            "--model",
            &model,
            "--revision",
            "demo",
            "--input",
            "fixtures/examples/labelled_tiny.jsonl",
            "--predictions",
            s(&preds),
            "--report",
            s(&report),
            "--quiet",
        ])
        .output()
        .unwrap();
    ok(&out);
    let r = read_json(&report);
    assert_eq!(r["counts"]["decided"], 17, "{}", r["counts"]);
}

/// Lines that fail to score are counted by their batch error kind, never dropped.
#[test]
fn failed_lines_are_counted_by_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let schema = example("labelled_tiny_schema.json");
    let input = tmp.path().join("labelled.jsonl");
    let lines = [
        serde_json::json!({"id": 1, "context": "Shares fell.", "schema_file": schema, "expected": {"topic": "business"}}),
        serde_json::json!({"id": 2, "context": "Goal!", "schema_file": "missing.json", "expected": {"topic": "sport"}}),
        serde_json::json!({"id": 3, "context": "   ", "schema_file": schema, "expected": {"topic": "tech"}}),
        serde_json::json!({"id": 4, "context": "New chip.", "schema_file": schema, "expected": {"colour": "red"}}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&input, text).unwrap();
    let preds = tmp.path().join("p.jsonl");
    let report = tmp.path().join("r.json");
    ok(&forkscore(&[
        "eval",
        "--model",
        &model,
        "--revision",
        "demo",
        "--input",
        s(&input),
        "--predictions",
        s(&preds),
        "--report",
        s(&report),
        "--quiet",
    ]));
    let c = &read_json(&report)["counts"];
    assert_eq!(c["lines_labelled"], 4);
    assert_eq!(c["decided"], 2);
    assert_eq!(c["failures_by_kind"]["schema_file"], 1, "{c}");
    assert_eq!(c["failures_by_kind"]["empty_context"], 1, "{c}");
    assert_eq!(c["failures_by_kind"]["field_not_in_schema"], 1, "{c}");
    assert_eq!(read_json(&report)["fields"]["topic"]["n"], 1);
}

/// The generation baseline resumes: its outcomes go to `<predictions>.generate.jsonl` as they
/// finish; a run interrupted mid-file (a torn last record) and resumed generates only the
/// missing items and reports what the uninterrupted run reported; a resume under another
/// token budget is refused, naming both, with the file untouched.
#[test]
fn the_generation_baseline_resumes_from_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = demo(tmp.path());
    let preds = tmp.path().join("p.jsonl");
    let report = tmp.path().join("r.json");
    let run = |extra: &[&str]| baseline_eval(&model, &preds, &report, extra);
    ok(&run(&["--max-new-tokens", "8"]));
    let full = read_json(&report)["baseline"].clone();
    let gens = tmp.path().join("p.jsonl.generate.jsonl");
    let text = std::fs::read_to_string(&gens).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1 + 17,
        "a header and one record per labelled line"
    );
    let records = |t: &str| -> Vec<serde_json::Value> {
        t.lines()
            .skip(1)
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("seconds");
                v
            })
            .collect()
    };

    // interrupted after 5 records, the 6th cut short
    let torn = format!(
        "{}\n{}",
        lines[..6].join("\n"),
        &lines[6][..lines[6].len() / 2]
    );
    std::fs::write(&gens, torn).unwrap();
    ok(&run(&["--max-new-tokens", "8", "--resume"]));
    let resumed = read_json(&report)["baseline"].clone();
    for key in [
        "items",
        "valid",
        "accuracy",
        "agreement",
        "fields",
        "errors",
        "generated_tokens",
    ] {
        assert_eq!(resumed[key], full[key], "{key}");
    }
    let again = std::fs::read_to_string(&gens).unwrap();
    assert_eq!(
        records(&again),
        records(&text),
        "the missing items generated once each"
    );

    // another token budget: refused, the file left as it was
    let out = run(&["--max-new-tokens", "9", "--resume"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("was generated under") && e.contains("--force"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&gens).unwrap(), again);
}
