//! Batch jobs on the fake backend (real Qwen2.5 tokenizer) through the test seam
//! `batch::run_job`: the example file end to end (snapshots), batch modes agree, any group
//! budget gives the same results, resume after a cut at many points, output protection,
//! --fail-fast, shared mode.

mod common;

use common::{engine, essence, examples, job, records, run};
use forkscore_engine::{GroupBudget, Schema, ScoreOptions};
use forkscore_pipeline::batch::resume::OutputPolicy;
use forkscore_pipeline::batch::{run_job, BatchMode, Job};
use serde_json::{json, Value};
use std::path::Path;

/// A compact, human-readable view for snapshots (probabilities to 6 digits).
fn compact(r: &Value) -> Value {
    if let Some(e) = r.get("error") {
        return json!({"id": r["id"], "line": r["line"], "error": e["kind"]});
    }
    let scores: serde_json::Map<String, Value> = r["fields"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, f)| {
            let s: Vec<String> = f["scores"]
                .as_object()
                .unwrap()
                .values()
                .map(|p| format!("{:.6}", p.as_f64().unwrap()))
                .collect();
            (k.clone(), Value::String(s.join(" ")))
        })
        .collect();
    json!({"id": r["id"], "line": r["line"], "group": r["telemetry"]["group"]["size"], "output": r["output"], "scores": scores})
}

fn redact(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "timings_ms" {
                    *x = json!("[timings]");
                } else {
                    redact(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact),
        _ => {}
    }
}

#[test]
fn the_example_file_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let out = dir.path().join("out.jsonl");
    let summary = run(&job(&input, &out, BatchMode::Grouped));
    let recs = records(&out);
    let nonblank = std::fs::read(&input)
        .unwrap()
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .count();
    assert_eq!(recs.len(), nonblank);
    assert_eq!(summary.written.lines as usize, nonblank);
    let lines: Vec<u64> = recs.iter().map(|r| r["line"].as_u64().unwrap()).collect();
    assert!(lines.windows(2).all(|w| w[0] < w[1]));
    for r in &recs {
        let p = &r["provenance"];
        for key in [
            "forkscore_version",
            "forkscore_commit",
            "model_id",
            "revision",
            "fingerprint",
            "dtype",
            "device",
            "mode",
            "batch_mode",
            "temperature",
            "temperature_source",
            "schema_hash",
        ] {
            assert!(
                p.get(key).is_some(),
                "line {} provenance lacks {key}",
                r["line"]
            );
        }
    }
    let view: Vec<Value> = recs.iter().map(compact).collect();
    insta::assert_json_snapshot!("decisions_grouped_compact", view);
    let mut first = recs[0].clone();
    redact(&mut first);
    insta::assert_json_snapshot!("decisions_grouped_first_record", first);
    let mut err = recs
        .iter()
        .find(|r| r["id"] == "inc-001" && r.get("error").is_some())
        .unwrap()
        .clone();
    redact(&mut err);
    insta::assert_json_snapshot!("decisions_duplicate_id_record", err);
}

#[test]
fn batch_modes_and_budgets_give_the_same_results() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let reference = dir.path().join("grouped.jsonl");
    run(&job(&input, &reference, BatchMode::Grouped));
    let want: Vec<Value> = records(&reference).iter().map(essence).collect();
    let cases: Vec<(&str, BatchMode, GroupBudget, usize)> = vec![
        ("direct", BatchMode::Direct, GroupBudget::default(), 8),
        ("serial", BatchMode::Serial, GroupBudget::default(), 8),
        (
            "rows3",
            BatchMode::Grouped,
            GroupBudget {
                max_rows: 3,
                ..GroupBudget::default()
            },
            8,
        ),
        (
            "tokens",
            BatchMode::Grouped,
            GroupBudget {
                max_prefix_tokens: 400,
                ..GroupBudget::default()
            },
            3,
        ),
        ("window1", BatchMode::Grouped, GroupBudget::default(), 1),
    ];
    for (name, mode, budget, window) in cases {
        let out = dir.path().join(format!("{name}.jsonl"));
        run(&Job {
            budget,
            window,
            ..job(&input, &out, mode)
        });
        let got = records(&out);
        assert_eq!(got.iter().map(essence).collect::<Vec<_>>(), want, "{name}");
        if mode == BatchMode::Serial {
            let reused: Vec<&Value> = got
                .iter()
                .filter(|r| r.get("reused_from_line").is_some())
                .map(|r| &r["id"])
                .collect();
            assert_eq!(reused, [&json!("rep-002")]);
        }
    }
}

#[test]
fn resume_after_a_cut_anywhere_gives_the_uninterrupted_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let full = dir.path().join("full.jsonl");
    run(&job(&input, &full, BatchMode::Grouped));
    let text = std::fs::read_to_string(&full).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let want: Vec<Value> = records(&full).iter().map(essence).collect();
    for k in [0, 1, 2, 5, 13, 22, 27, lines.len() - 1, lines.len()] {
        for torn in [false, true] {
            let out = dir.path().join(format!("cut-{k}-{torn}.jsonl"));
            let mut kept: String = lines[..k].iter().map(|l| format!("{l}\n")).collect();
            if torn && k < lines.len() {
                kept.push_str(&lines[k][..lines[k].len() / 2]);
            }
            std::fs::write(&out, kept).unwrap();
            let s = run(&Job {
                policy: OutputPolicy::Resume,
                ..job(&input, &out, BatchMode::Grouped)
            });
            assert_eq!(
                s.written.lines as usize,
                lines.len() - k,
                "cut {k} torn {torn}"
            );
            let got: Vec<Value> = records(&out).iter().map(essence).collect();
            assert_eq!(got, want, "cut {k} torn {torn}");
        }
    }
}

#[test]
fn outputs_are_protected_and_resume_checks_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let out = dir.path().join("out.jsonl");
    std::fs::write(&out, "precious\n").unwrap();
    let (e, p) = engine();
    let err = run_job(e, p, &job(&input, &out, BatchMode::Grouped)).unwrap_err();
    assert!(err.to_string().contains("--resume"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious\n");
    run(&Job {
        policy: OutputPolicy::Force,
        ..job(&input, &out, BatchMode::Grouped)
    });
    assert_eq!(records(&out).len(), 35);
    // an output whose last record names another id than the input's line (no provenance:
    // that check is overridden here so that the input check is the one exercised)
    std::fs::write(&out, "{\"id\":\"someone-else\",\"line\":1}\n").unwrap();
    let err = run_job(
        e,
        p,
        &Job {
            policy: OutputPolicy::Resume,
            resume_any_provenance: true,
            ..job(&input, &out, BatchMode::Grouped)
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("another input"), "{err}");
}

#[test]
fn fail_fast_stops_after_the_first_error_record() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    let out = dir.path().join("out.jsonl");
    let s = run(&Job {
        fail_fast: true,
        ..job(&input, &out, BatchMode::Grouped)
    });
    assert!(s.stopped_at_error);
    let recs = records(&out);
    assert_eq!(recs.last().unwrap()["error"]["kind"], "invalid_json");
    assert!(recs[..recs.len() - 1]
        .iter()
        .all(|r| r.get("error").is_none()));
    assert_eq!(recs.len(), 23);
}

#[test]
fn shared_mode_scores_each_line_schema_against_one_context() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("q.jsonl");
    std::fs::write(
        &input,
        [
            r#"{"id": "a", "question": "Is the customer asking for a refund?"}"#,
            r#"{"id": "b", "question": "Is the customer angry?"}"#,
            r#"{"id": "c", "question": "Is the customer asking for a refund?"}"#,
            r#"{"id": "d", "schema": {"tone": {"type": "enum", "choices": ["calm", "furious"]}}}"#,
            r#"{"id": "e", "context": "not allowed here"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let out = dir.path().join("out.jsonl");
    let context = "Order #5531 arrived broken; I want my money back.";
    run(&Job {
        shared_context: Some(context.into()),
        default_schema: None,
        ..job(&input, &out, BatchMode::Shared)
    });
    let recs = records(&out);
    assert_eq!(recs.len(), 5);
    assert_eq!(recs[2]["reused_from_line"], 1);
    assert_eq!(recs[4]["error"]["kind"], "unexpected_context");
    let (e, _) = engine();
    for (r, schema) in recs.iter().zip([
        forkscore_pipeline::batch::records::question_schema("Is the customer asking for a refund?"),
        forkscore_pipeline::batch::records::question_schema("Is the customer angry?"),
    ]) {
        let compiled = e.compile(&Schema::from_value(&schema).unwrap()).unwrap();
        let d = e
            .decide(context, &compiled, &ScoreOptions::default())
            .unwrap();
        assert_eq!(r["output"], serde_json::to_value(&d.output).unwrap());
    }
}

mod generated {
    use super::*;
    use proptest::prelude::*;

    /// Input lines drawn from good and bad kinds (schema sources, repeats, malformed lines).
    fn arb_line() -> impl Strategy<Value = (u8, u8)> {
        (0u8..14, 0u8..4)
    }

    fn render(lines: &[(u8, u8)]) -> Vec<u8> {
        let contexts = [
            "The payment service is down.",
            "short",
            "数据库宕机了。",
            "A refund for order 12 please.",
        ];
        let mut out = Vec::new();
        for (i, &(kind, c)) in lines.iter().enumerate() {
            let ctx = contexts[c as usize];
            let id = format!("dup-{}", c); // kind 7: ids that repeat across lines
            let line = match kind {
                0..=3 => json!({"id": format!("l{i}"), "context": ctx}).to_string(),
                4 => json!({"id": format!("l{i}"), "context": ctx, "schema_file": "fintech_fraud.json"}).to_string(),
                5 => json!({"id": format!("l{i}"), "context": ctx, "question": "Is it urgent?"}).to_string(),
                6 => json!({"id": format!("l{i}"), "context": ctx, "schema": {"tone": {"type": "enum", "choices": ["calm", "angry"]}}}).to_string(),
                7 => json!({"id": id, "context": ctx}).to_string(),
                8 => "{\"id\": \"broken\"".to_string(),
                9 => json!({"id": format!("l{i}"), "context": " "}).to_string(),
                10 => {
                    // invalid UTF-8 inside the context
                    out.extend_from_slice(format!("{{\"id\": \"u{i}\", \"context\": \"caf").as_bytes());
                    out.extend_from_slice(b"\xff\"}");
                    String::new()
                }
                11 => String::new(),
                12 => json!({"context": ctx}).to_string(),
                _ => json!({"id": format!("l{i}"), "context": ctx, "schema_file": "code_security.json"}).to_string(),
            };
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        /// Any input, window, budget and batch mode: one record per non-blank line, in order,
        /// equal to the line-by-line run; a cut at any byte then --resume gives the same file.
        #[test]
        fn any_input_any_grouping_any_cut(
            lines in prop::collection::vec(arb_line(), 1..14),
            window in 1usize..8,
            max_rows in 1usize..30,
            mode in prop_oneof![Just(BatchMode::Grouped), Just(BatchMode::Serial), Just(BatchMode::Direct)],
            cut in 0.0f64..1.0,
        ) {
            let dir = tempfile::tempdir().unwrap();
            // schema files are resolved next to the input
            for f in ["fintech_fraud.json", "code_security.json"] {
                std::fs::copy(examples().join(f), dir.path().join(f)).unwrap();
            }
            let input = dir.path().join("in.jsonl");
            std::fs::write(&input, render(&lines)).unwrap();
            let reference = dir.path().join("ref.jsonl");
            run(&Job { window: 1, ..job(&input, &reference, BatchMode::Direct) });
            let want: Vec<Value> = records(&reference).iter().map(essence).collect();
            let nonblank = lines.iter().filter(|(k, _)| *k != 11).count();
            prop_assert_eq!(want.len(), nonblank);

            let out = dir.path().join("out.jsonl");
            let budget = GroupBudget { max_rows, ..GroupBudget::default() };
            run(&Job { window, budget, ..job(&input, &out, mode) });
            let full = std::fs::read(&out).unwrap();
            prop_assert_eq!(records(&out).iter().map(essence).collect::<Vec<_>>(), want.clone());

            let at = (full.len() as f64 * cut) as usize;
            std::fs::write(&out, &full[..at]).unwrap();
            run(&Job { window, budget, policy: OutputPolicy::Resume, ..job(&input, &out, mode) });
            prop_assert_eq!(records(&out).iter().map(essence).collect::<Vec<_>>(), want);
        }
    }
}

#[test]
fn a_byte_order_mark_is_not_part_of_the_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bom.jsonl");
    std::fs::write(&input, b"\xEF\xBB\xBF{\"id\": \"a\", \"context\": \"The API is down.\"}\n{\"id\": \"b\", \"context\": \"All good.\"}\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let (engine, prov) = engine();
    run_job(engine, prov, &job(&input, &out, BatchMode::Grouped)).unwrap();
    let lines: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");
    assert_eq!(lines[0]["id"], "a");
}

#[test]
fn the_output_may_not_be_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("d.jsonl");
    let text = "{\"id\": \"a\", \"context\": \"x\"}\n";
    std::fs::write(&input, text).unwrap();
    let (engine, prov) = engine();
    let mut j = job(&input, &dir.path().join("./d.jsonl"), BatchMode::Grouped);
    j.policy = OutputPolicy::Force;
    let err = run_job(engine, prov, &j).unwrap_err();
    assert!(err.to_string().contains("is the input file"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&input).unwrap(),
        text,
        "the input is untouched"
    );
}

#[test]
fn shared_and_serial_modes_extend_one_context_state_per_schema_with_identical_results() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("q.jsonl");
    let context = "The checkout API returns 502 for every enterprise customer since the deploy; they cannot bill anyone.";
    let lines = [
        json!({"id": "q1", "question": "Is production affected?"}),
        json!({"id": "q2", "question": "Is the customer asking for a refund?"}),
        json!({"id": "q3", "schema": {"sev": {"type": "enum", "choices": ["low", "high"]}}}),
        json!({"id": "q4", "question": "Is this a security issue?"}),
    ];
    std::fs::write(
        &input,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let shared_out = dir.path().join("shared.jsonl");
    run(&Job {
        shared_context: Some(context.into()),
        default_schema: None,
        ..job(&input, &shared_out, BatchMode::Shared)
    });
    // The same questions, each with the context inline, scored line by line.
    let direct_in = dir.path().join("d.jsonl");
    std::fs::write(
        &direct_in,
        lines
            .iter()
            .map(|l| {
                let mut l = l.clone();
                l["context"] = context.into();
                format!("{l}\n")
            })
            .collect::<String>(),
    )
    .unwrap();
    let direct_out = dir.path().join("direct.jsonl");
    run(&Job {
        default_schema: None,
        ..job(&direct_in, &direct_out, BatchMode::Direct)
    });
    let serial_out = dir.path().join("serial.jsonl");
    run(&Job {
        default_schema: None,
        ..job(&direct_in, &serial_out, BatchMode::Serial)
    });
    let fields = |p: &Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                assert!(v.get("error").is_none(), "{v}");
                v["fields"].clone()
            })
            .collect()
    };
    let direct = fields(&direct_out);
    let reused = |p: &Path| -> Vec<u64> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["telemetry"]["reused_prefix_tokens"]
                    .as_u64()
                    .unwrap_or(0)
            })
            .collect()
    };
    assert!(
        reused(&shared_out).iter().all(|&n| n >= 16),
        "every shared line extends the context state: {:?}",
        reused(&shared_out)
    );
    assert!(
        reused(&serial_out).iter().all(|&n| n >= 16),
        "{:?}",
        reused(&serial_out)
    );
    // direct lines continue only the prompt head (instructions and the context's opening),
    // shorter than the shared context state
    let (shared_reuse, direct_reuse) = (reused(&shared_out), reused(&direct_out));
    assert!(
        direct_reuse.iter().all(|&n| n >= 16),
        "every direct line continues the prompt head: {direct_reuse:?}"
    );
    assert!(
        shared_reuse.iter().zip(&direct_reuse).all(|(s, d)| s > d),
        "{shared_reuse:?} vs {direct_reuse:?}"
    );
    assert_eq!(
        fields(&shared_out),
        direct,
        "shared == direct, exactly (fake backend)"
    );
    assert_eq!(
        fields(&serial_out),
        direct,
        "serial == direct, exactly (fake backend)"
    );
}

#[test]
fn resume_against_another_input_fails_before_appending_anything() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    std::fs::write(&a, "{\"id\": 1, \"context\": \"one\"}\n{\"id\": 2, \"context\": \"two\"}\n{\"id\": 3, \"context\": \"three\"}\n").unwrap();
    let out = dir.path().join("out.jsonl");
    run(&job(&a, &out, BatchMode::Grouped));
    let before = std::fs::read_to_string(&out).unwrap();
    // Line 3 is blank in this input: the output's last record (line 3) has no counterpart.
    let b = dir.path().join("b.jsonl");
    std::fs::write(&b, "{\"id\": 1, \"context\": \"one\"}\n{\"id\": 2, \"context\": \"two\"}\n\n{\"id\": 4, \"context\": \"four\"}\n").unwrap();
    let (engine, prov) = engine();
    let mut j = job(&b, &out, BatchMode::Grouped);
    j.policy = OutputPolicy::Resume;
    let err = run_job(engine, prov, &j).unwrap_err();
    assert!(
        err.to_string().contains("belongs to another input"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        before,
        "nothing appended"
    );
}

/// `--allowed-mass` / `--top-k` in a batch job: every decision record carries, per field, its
/// allowed mass and exactly K top tokens; the job summary (the stderr end line of `forkscore
/// batch`) holds the min and median over exactly the masses of the written records.
#[test]
fn allowed_mass_and_top_k_are_in_every_record_and_summarised() {
    let dir = tempfile::tempdir().unwrap();
    let input = examples().join("decisions.jsonl");
    for (k, mode) in [(3usize, BatchMode::Grouped), (0, BatchMode::Direct)] {
        let out = dir.path().join(format!("mass-{k}.jsonl"));
        let mut j = job(&input, &out, mode);
        j.options = ScoreOptions {
            allowed_mass: Some(k),
            ..ScoreOptions::default()
        };
        let summary = run(&j);
        let mut masses = Vec::new();
        let decisions: Vec<Value> = records(&out)
            .into_iter()
            .filter(|r| r.get("error").is_none())
            .collect();
        assert!(decisions.len() > 10, "{}", decisions.len());
        for r in &decisions {
            for (name, f) in r["fields"].as_object().unwrap() {
                let a = &f["allowed_mass"];
                let mass = a["mass"].as_f64().unwrap_or_else(|| {
                    panic!("line {} field {name}: no allowed mass in {f}", r["line"])
                });
                assert!((0.0..=1.0).contains(&mass), "{mass}");
                assert!(a["logsumexp"].as_f64().is_some_and(f64::is_finite));
                let top = a["top"].as_array().unwrap();
                assert_eq!(top.len(), k, "line {} field {name}", r["line"]);
                for w in top.windows(2) {
                    assert!(w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64());
                }
                masses.push(mass);
            }
        }
        masses.sort_by(f64::total_cmp);
        let n = masses.len();
        let median = if n % 2 == 1 {
            masses[n / 2]
        } else {
            (masses[n / 2 - 1] + masses[n / 2]) / 2.0
        };
        let m = summary
            .written
            .allowed_mass
            .expect("a job with --allowed-mass has a mass summary");
        assert_eq!((m.fields as usize, m.min, m.median), (n, masses[0], median));
    }
    // without --allowed-mass: no mass in the records, no summary
    let out = dir.path().join("plain.jsonl");
    let summary = run(&job(&input, &out, BatchMode::Grouped));
    assert_eq!(summary.written.allowed_mass, None);
    let first = records(&out)
        .into_iter()
        .find(|r| r.get("error").is_none())
        .unwrap();
    assert!(first["fields"]
        .as_object()
        .unwrap()
        .values()
        .all(|f| f.get("allowed_mass").is_none()));
}
