//! Literal-choice scoring on the tiny real-architecture checkpoints (Qwen2.5, Qwen3, Qwen3.5;
//! CPU f32, candle backend): every choice's probability equals the one computed independently
//! from full prompts (`forward_full` on prefix ++ selector ++ path prefix at each branching
//! position; `vocab_rows` for the log-likelihood methods), the token paths equal the whole
//! prompt's tokenization, the 255-choice example scores, and one whole decision is pinned by
//! a snapshot on the demo model (the tiny Qwen2.5).

use forkscore_backends::candle::checkpoint::ResolvedCheckpoint;
use forkscore_backends::candle::{CandleBackend, LoadOptions};
use forkscore_backends::{Backend, VocabRequest};
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Decision, Engine, FieldResult, Mode,
    Schema, ScoreOptions,
};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use serde_json::json;
use std::sync::OnceLock;

const CONTEXT: &str = "Our production payment service is completely down for every customer, and no one can complete a purchase.";

fn engine_for(dir: &std::path::Path) -> Engine<CandleBackend> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "test").unwrap();
    let backend = CandleBackend::load(&ckpt, &LoadOptions::default()).unwrap();
    let tok = ChatTokenizer::for_model(dir, backend.facts().family).unwrap();
    Engine::new(
        backend,
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )
    .unwrap()
}

fn engines() -> &'static [(&'static str, Engine<CandleBackend>)] {
    static E: OnceLock<Vec<(&'static str, Engine<CandleBackend>)>> = OnceLock::new();
    E.get_or_init(|| {
        let q35 = TinyQwen35::new(35, Qwen35Layout::Multimodal)
            .ensure()
            .unwrap();
        vec![
            (
                "qwen2.5",
                engine_for(&ensure_tiny_model(&TinySpec::qwen25())),
            ),
            ("qwen3", engine_for(&ensure_tiny_model(&TinySpec::qwen3()))),
            ("qwen3.5", engine_for(&q35)),
        ]
    })
}

/// Choices that share first tokens, one a word-prefix of another, next to a code field.
fn schema(method: &str) -> Schema {
    let v = json!({
        "risk": {"type": "enum", "scoring": method,
                 "choices": ["high", "high risk", "low", "medium", "medium-high", "critical"]},
        "team": {"type": "enum", "choices": ["payments", "search", "identity"]},
    });
    Schema::from_json_str(&v.to_string()).unwrap()
}

fn decide(engine: &Engine<CandleBackend>, schema: &Schema, mode: Mode) -> Decision {
    let compiled = engine.compile(schema).unwrap();
    engine
        .decide(
            CONTEXT,
            &compiled,
            &ScoreOptions {
                mode,
                include_prompt: true,
                ..ScoreOptions::default()
            },
        )
        .unwrap()
}

/// softmax(x / t) in f64.
fn softmax(x: &[f32], t: f64) -> Vec<f64> {
    let max = x
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x
        .iter()
        .map(|&v| ((f64::from(v) - max) / t).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// The distinct tokens that follow `path[..i]` among `paths`, in first-seen order.
fn siblings(paths: &[Vec<u32>], path: &[u32], i: usize) -> Vec<u32> {
    let mut out = Vec::new();
    for p in paths {
        if p.len() > i && p[..i] == path[..i] && !out.contains(&p[i]) {
            out.push(p[i]);
        }
    }
    out
}

/// The independent reference of a field's exact literal probabilities, from full prompts.
fn reference_exact(backend: &CandleBackend, head: &[u32], paths: &[Vec<u32>], t: f64) -> Vec<f32> {
    paths
        .iter()
        .map(|path| {
            let mut p = 1f64;
            for i in 0..path.len() {
                let sib = siblings(paths, path, i);
                if sib.len() < 2 {
                    continue;
                }
                let ids = [head, &path[..i]].concat();
                let logits = backend.forward_full(&ids, &sib).unwrap();
                let k = sib.iter().position(|&s| s == path[i]).unwrap();
                p *= softmax(&logits, t)[k];
            }
            p as f32
        })
        .collect()
}

/// A field's probabilities equal `want` (strict f32) and sum to 1.
fn assert_scores(what: &str, field: &FieldResult, want: &[f32]) {
    let got: Vec<f32> = field.scores.values().map(|&p| p as f32).collect();
    Tolerance::CPU_F32_STRICT.assert_close(what, &got, want);
    let sum: f64 = field.scores.values().sum();
    assert!((sum - 1.0).abs() < 1e-9, "{what}: Σp = {sum}");
}

/// The independent reference of each choice's summed full-vocabulary log-probability.
fn reference_sum_loglik(backend: &CandleBackend, head: &[u32], paths: &[Vec<u32>]) -> Vec<f32> {
    paths
        .iter()
        .map(|path| {
            let ids = [head, path.as_slice()].concat();
            let req = VocabRequest::new(&ids, head.len() - 1..ids.len() - 1, 0).unwrap();
            let rows = backend.vocab_rows(&req).unwrap();
            rows.iter()
                .map(|r| f64::from(r.next.unwrap().logprob))
                .sum::<f64>() as f32
        })
        .collect()
}

/// The decision's prompt head (prefix ++ selector ids) and choice paths of field `row`, the
/// paths checked against the whole prompt's own tokenization.
fn head_and_paths(
    engine: &Engine<CandleBackend>,
    d: &Decision,
    row: usize,
    choices: &[String],
) -> (Vec<u32>, Vec<Vec<u32>>) {
    let prompt = d.prompt.as_ref().unwrap();
    let r = &prompt.rows[row];
    let head = [prompt.prefix_ids.as_slice(), &r.suffix_ids].concat();
    for (path, choice) in r.choice_ids.iter().zip(choices) {
        let whole = engine
            .tokenizer()
            .encode(&format!("{}{}: {choice}\n", prompt.prefix_text, r.field))
            .unwrap();
        assert_eq!(whole, [head.as_slice(), path].concat(), "{choice}");
    }
    (head, r.choice_ids.clone())
}

#[test]
fn exact_literal_probabilities_equal_full_prompt_references_on_all_architectures() {
    let schema = schema("literal");
    let choices: Vec<String> = [
        "high",
        "high risk",
        "low",
        "medium",
        "medium-high",
        "critical",
    ]
    .map(String::from)
    .to_vec();
    for (name, engine) in engines() {
        for mode in Mode::ALL {
            let d = decide(engine, &schema, mode);
            let (head, paths) = head_and_paths(engine, &d, 0, &choices);
            let t = d.temperature.value;
            let want = reference_exact(engine.backend(), &head, &paths, t);
            assert_scores(
                &format!("{name} {mode:?}: exact probabilities vs full prompts"),
                &d.fields["risk"],
                &want,
            );
            // the code field is scored as before, next to the tree
            assert_eq!(d.fields["team"].scores.len(), 3);
        }
    }
}

#[test]
fn loglik_methods_equal_full_vocabulary_references_on_all_architectures() {
    let choices: Vec<String> = [
        "high",
        "high risk",
        "low",
        "medium",
        "medium-high",
        "critical",
    ]
    .map(String::from)
    .to_vec();
    for (name, engine) in engines() {
        for method in ["literal-sum-loglik", "literal-mean-loglik"] {
            let schema = schema(method);
            for mode in [Mode::Parallel, Mode::Independent, Mode::Tree] {
                let d = decide(engine, &schema, mode);
                let (head, paths) = head_and_paths(engine, &d, 0, &choices);
                let mut want = reference_sum_loglik(engine.backend(), &head, &paths);
                if method == "literal-mean-loglik" {
                    for (w, p) in want.iter_mut().zip(&paths) {
                        *w /= p.len() as f32;
                    }
                }
                let risk = &d.fields["risk"];
                let got: Vec<f32> = risk.logits.values().copied().collect();
                eprintln!(
                    "{name} {method} {mode:?}: log-likelihoods vs full prompts max |diff| = {:e}",
                    Tolerance::max_abs_diff(&got, &want)
                );
                Tolerance::CPU_F32_LOGLIK_SUM.assert_close(
                    &format!("{name} {method} {mode:?}: log-likelihoods vs full prompts"),
                    &got,
                    &want,
                );
                let probs: Vec<f32> = softmax(&want, d.temperature.value)
                    .into_iter()
                    .map(|p| p as f32)
                    .collect();
                let got: Vec<f32> = risk.scores.values().map(|&p| p as f32).collect();
                Tolerance::CPU_F32_STRICT.assert_close(
                    &format!("{name} {method} {mode:?}: probabilities"),
                    &got,
                    &probs,
                );
            }
        }
    }
}

#[test]
fn the_255_choice_example_scores_literally_on_a_tiny_model() {
    let text = std::fs::read_to_string(format!(
        "{}/../fixtures/examples/high_cardinality_255.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let schema = Schema::from_json_str_with(&text, "literal".parse().unwrap()).unwrap();
    let (name, engine) = &engines()[0];
    let compiled = engine.compile(&schema).unwrap();
    let d = engine
        .decide(CONTEXT, &compiled, &ScoreOptions::default())
        .unwrap();
    let f = d.fields.values().next().unwrap();
    assert_eq!(f.scores.len(), 255);
    let sum: f64 = f.scores.values().sum();
    assert!((sum - 1.0).abs() < 1e-9, "{name}: Σp = {sum}");
    assert!(f.choices.contains(&f.value));
    assert_eq!(d.telemetry.tree_calls, 1);
}

/// Every float of `v` rounded to 4 decimal places (absolute): the snapshot below is of real
/// f32 model output, whose last digits move with summation order (thread counts, CPUs); the
/// exact values are pinned by the parity tests above, the snapshot pins the shape.
fn round_abs(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => {
            let x = (n.as_f64().unwrap_or(f64::NAN) * 1e4).round() / 1e4;
            json!(if x == 0.0 { 0.0 } else { x })
        }
        Value::Array(a) => Value::Array(a.iter().map(round_abs).collect()),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, x)| (k.clone(), round_abs(x))).collect())
        }
        other => other.clone(),
    }
}

/// One whole literal decision on the demo model (`forkscore demo-model`, the tiny Qwen2.5),
/// floats rounded to 4 decimal places.
#[test]
fn literal_decision_snapshot_on_the_demo_model() {
    let (_, engine) = &engines()[0];
    let compiled = engine.compile(&schema("literal")).unwrap();
    let d = engine
        .decide(CONTEXT, &compiled, &ScoreOptions::default())
        .unwrap();
    let v = round_abs(&serde_json::to_value(&d).unwrap());
    insta::assert_json_snapshot!("literal_decision_demo_qwen25", v, {
        ".telemetry.timings_ms" => "[timings]",
        ".telemetry.state_bytes" => "[bytes]",
    });
}

/// One whole tree-mode decision on the demo model (the tiny Qwen2.5, packed): the code field's
/// row in one packed tree call, the literal field's trie in another; floats rounded as above.
#[test]
fn tree_mode_decision_snapshot_on_the_demo_model() {
    let (_, engine) = &engines()[0];
    let compiled = engine.compile(&schema("literal")).unwrap();
    let opts = ScoreOptions {
        mode: Mode::Tree,
        ..ScoreOptions::default()
    };
    let d = engine.decide(CONTEXT, &compiled, &opts).unwrap();
    assert_eq!(d.telemetry.tree_packing, Some("packed"));
    assert_eq!(d.telemetry.tree_calls, 2);
    let v = round_abs(&serde_json::to_value(&d).unwrap());
    insta::assert_json_snapshot!("tree_mode_decision_demo_qwen25", v, {
        ".telemetry.timings_ms" => "[timings]",
        ".telemetry.state_bytes" => "[bytes]",
    });
}

/// `json` scoring: the scoring prompt is the generation baseline's prompt, character for
/// character; each field's row opens the object (`{\n  "name":`) and each choice's path is the
/// whole prompt's tokenization of its JSON value and what follows it (`,`, `\n}` after the
/// last field); the probabilities equal the constrained decoder's, computed from
/// full prompts, in every mode and on every architecture. The choices include one that is a
/// prefix of another (`high` / `high risk`), digit strings (`1` / `12`) and a boolean.
#[test]
fn json_scoring_uses_the_generation_prompt_and_equals_full_prompt_references() {
    let v = json!({
        "scoring": "json",
        "risk": {"type": "enum", "description": "Operational risk.",
                 "choices": ["high", "high risk", "low", "medium", "medium-high", "critical"]},
        "tier": {"type": "enum", "choices": ["1", "12", "2"]},
        "urgent": {"type": "boolean"},
    });
    let schema = Schema::from_json_str(&v.to_string()).unwrap();
    let expected: [(&str, Vec<serde_json::Value>); 3] = [
        (
            "risk",
            [
                "high",
                "high risk",
                "low",
                "medium",
                "medium-high",
                "critical",
            ]
            .map(|c| json!(c))
            .to_vec(),
        ),
        ("tier", ["1", "12", "2"].map(|c| json!(c)).to_vec()),
        ("urgent", vec![json!(false), json!(true)]),
    ];
    for (name, engine) in engines() {
        let generation_prompt = forkscore_engine::generate::prompt::render(
            engine.tokenizer().template(),
            CONTEXT,
            schema.fields(),
            forkscore_engine::Layout::ContextFirst,
        )
        .unwrap();
        for mode in Mode::ALL {
            let d = decide(engine, &schema, mode);
            let prompt = d.prompt.as_ref().unwrap();
            assert_eq!(
                prompt.prefix_text, generation_prompt,
                "{name}: the same prompt"
            );
            for (row, (field, choices)) in expected.iter().enumerate() {
                let r = &prompt.rows[row];
                assert_eq!(r.selector, format!("{{\n  \"{field}\":"), "{name}");
                let head = [prompt.prefix_ids.as_slice(), &r.suffix_ids].concat();
                let end = if row + 1 == expected.len() {
                    "\n}"
                } else {
                    ","
                };
                for (path, choice) in r.choice_ids.iter().zip(choices) {
                    let whole = engine
                        .tokenizer()
                        .encode(&format!(
                            "{}{{\n  \"{field}\": {choice}{end}",
                            prompt.prefix_text
                        ))
                        .unwrap();
                    assert_eq!(whole, [head.as_slice(), path].concat(), "{name} {choice}");
                }
                let want =
                    reference_exact(engine.backend(), &head, &r.choice_ids, d.temperature.value);
                let f = &d.fields[*field];
                assert_eq!(f.scoring, Some("json"));
                assert_scores(
                    &format!("{name} {mode:?} {field}: json probabilities vs full prompts"),
                    f,
                    &want,
                );
            }
        }
    }
}

/// One whole json-scored decision on the demo model (the tiny Qwen2.5) with its prompt: the
/// generation prompt, the object-opening rows and the JSON choice paths; floats rounded as
/// above.
#[test]
fn json_decision_snapshot_on_the_demo_model() {
    let (_, engine) = &engines()[0];
    let schema = Schema::from_json_str_with(
        &json!({
            "risk": {"type": "enum", "choices": ["low", "high", "high risk"]},
            "urgent": {"type": "boolean"},
        })
        .to_string(),
        "json".parse().unwrap(),
    )
    .unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let opts = ScoreOptions {
        include_prompt: true,
        ..ScoreOptions::default()
    };
    let d = engine.decide(CONTEXT, &compiled, &opts).unwrap();
    let v = round_abs(&serde_json::to_value(&d).unwrap());
    insta::assert_json_snapshot!("json_decision_demo_qwen25", v, {
        ".telemetry.timings_ms" => "[timings]",
        ".telemetry.state_bytes" => "[bytes]",
    });
}
