//! `forkscore eval --baseline generate`: the autoregressive JSON baseline on the same labelled
//! items, with the same contexts and schemas (`Engine::generate`: the model writes the JSON
//! answer, greedy, validated against the schema). Reports its accuracy per field (an invalid
//! or missing value counts as wrong), the validity rate, per-field agreement with forkscore's
//! values from the predictions, and the speed ratio: forkscore's decisions per second in this
//! run's scoring job ÷ generated items per second in this run (one untimed 2-token generation
//! warms up first). Resumable: each item's outcome is appended to `<predictions>.generate.jsonl`
//! as it finishes ([`super::generations`]), and `--resume` generates only the items missing
//! there.

use super::generations::{Generated, GenerationsFile};
use super::join::Joined;
use super::labels::Label;
use super::{LabelledJobArgs, Scored};
use crate::batch::records::{parse_line, SchemaRef};
use crate::batch::schema_cache::SchemaCache;
use anyhow::Result;
use forkscore_backends::Backend;
use forkscore_engine::{Engine, GenerateOptions};
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Instant;

pub struct Settings {
    /// The generations file, what its records depend on (its header), and whether to continue
    /// it.
    pub file: std::path::PathBuf,
    pub header: Value,
    pub resume: bool,
    pub max_new_tokens: Option<usize>,
    pub eos_ids: Vec<u32>,
    /// forkscore's throughput in this run (None when the scoring job scored nothing now).
    pub forkscore_decisions_per_s: Option<f64>,
}

/// Per field: correct / labelled and agreement with forkscore.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FieldBaseline {
    pub n: usize,
    pub correct: usize,
    pub accuracy: f64,
    /// Items where forkscore also has a value for the field.
    pub compared: usize,
    pub agree: usize,
    pub agreement: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BaselineReport {
    pub kind: &'static str,
    pub decoding: &'static str,
    pub items: usize,
    pub valid: usize,
    pub validity_rate: f64,
    /// Items generation could not run on, by error message.
    pub errors: Vec<(Value, String)>,
    pub fields: IndexMap<String, FieldBaseline>,
    /// Micro accuracy over every labelled field of every item.
    pub accuracy: f64,
    /// Micro agreement with forkscore's values over every compared field.
    pub agreement: f64,
    pub seconds: f64,
    pub items_per_s: f64,
    pub generated_tokens: usize,
    pub forkscore_decisions_per_s: Option<f64>,
    /// forkscore decisions/s ÷ generate items/s (null when forkscore scored nothing in this run,
    /// e.g. a complete --resume; rerun with --force to measure both).
    pub speed_ratio: Option<f64>,
}

pub fn run<B: Backend>(
    engine: &Engine<B>,
    args: &LabelledJobArgs,
    scored: &Scored,
    joined: &Joined,
    settings: Settings,
) -> Result<BaselineReport> {
    let default_schema = args.schema.load()?;
    let base = args.base_dir()?;
    let schemas = SchemaCache::new(engine, default_schema.as_ref(), &base);
    let lines: Vec<&str> = scored.labelled.batch_input.lines().collect();
    // forkscore's value per (id, field)
    let mut forkscore: HashMap<(String, String), Value> = HashMap::new();
    for f in joined.fields.iter() {
        for item in &f.1.items {
            forkscore.insert((item.id.to_string(), f.0.clone()), item.value.clone());
        }
    }
    for r in &scored.records {
        if let (Some(id), Some(out)) = (r.get("id"), r.get("output").and_then(Value::as_object)) {
            for (k, v) in out {
                forkscore
                    .entry((id.to_string(), k.clone()))
                    .or_insert(v.clone());
            }
        }
    }
    let opts = GenerateOptions {
        max_new_tokens: settings.max_new_tokens,
        max_input_tokens: args.scoring.max_input_tokens,
        eos_ids: settings.eos_ids,
        include_prompt: false,
        layout: args.scoring.layout,
    };
    let bar = crate::batch::writer::progress_bar(
        args.quiet,
        Some(scored.labelled.labels.len() as u64),
        0,
    );
    let mut report = BaselineReport {
        kind: "generate",
        decoding: forkscore_engine::generate::DECODING,
        items: 0,
        valid: 0,
        validity_rate: 0.0,
        errors: Vec::new(),
        fields: IndexMap::new(),
        accuracy: 0.0,
        agreement: 0.0,
        seconds: 0.0,
        items_per_s: 0.0,
        generated_tokens: 0,
        forkscore_decisions_per_s: settings.forkscore_decisions_per_s,
        speed_ratio: None,
    };
    let mut file = GenerationsFile::open(&settings.file, &settings.header, settings.resume)?;
    let mut warmed = false;
    let mut elapsed = 0.0;
    for label in &scored.labelled.labels {
        bar.inc(1);
        let g = match file.done.get(&label.line) {
            Some(g) => g.clone(),
            None => {
                let Some(raw) = lines.get(label.line as usize - 1) else {
                    continue;
                };
                let g = generate_one(engine, &schemas, &opts, label, raw, &mut warmed);
                file.append(&g)?;
                g
            }
        };
        elapsed += g.seconds;
        tally(&mut report, label, &g, &forkscore);
    }
    bar.finish_and_clear();
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let (mut correct, mut n, mut agree, mut compared) = (0, 0, 0, 0);
    for f in report.fields.values_mut() {
        f.accuracy = ratio(f.correct, f.n);
        f.agreement = ratio(f.agree, f.compared);
        correct += f.correct;
        n += f.n;
        agree += f.agree;
        compared += f.compared;
    }
    report.accuracy = ratio(correct, n);
    report.agreement = ratio(agree, compared);
    report.validity_rate = ratio(report.valid, report.items);
    report.seconds = elapsed;
    report.items_per_s = if elapsed > 0.0 {
        report.items as f64 / elapsed
    } else {
        0.0
    };
    report.speed_ratio = match (settings.forkscore_decisions_per_s, report.items_per_s) {
        (Some(f), g) if g > 0.0 => Some(f / g),
        _ => None,
    };
    Ok(report)
}

/// Generation on one labelled line (`raw`, the derived batch line): its outcome as a record.
fn generate_one<B: Backend>(
    engine: &Engine<B>,
    schemas: &SchemaCache,
    opts: &GenerateOptions,
    label: &Label,
    raw: &str,
    warmed: &mut bool,
) -> Generated {
    let failed = |ran: bool, error: String, seconds: f64| Generated {
        line: label.line,
        id: label.id.clone(),
        ran,
        error: Some(error),
        valid: false,
        generated_tokens: 0,
        seconds,
        fields: IndexMap::new(),
    };
    let request = match parse_line(label.line, raw.as_bytes(), false) {
        Ok(r) => r,
        Err(f) => return failed(false, f.error.message, 0.0),
    };
    let schema_ref: &SchemaRef = &request.schema;
    let compiled = match schemas.resolve(engine, schema_ref) {
        Ok(c) => c,
        Err(e) => return failed(false, e.message, 0.0),
    };
    let context = request.context.unwrap_or_default();
    if !*warmed {
        let warm = GenerateOptions {
            max_new_tokens: Some(2),
            ..opts.clone()
        };
        let _ = engine.generate(&context, compiled.schema_fields(), &warm);
        *warmed = true;
    }
    let t = Instant::now();
    let generated = engine.generate(&context, compiled.schema_fields(), opts);
    let seconds = t.elapsed().as_secs_f64();
    match generated {
        Ok(g) => Generated {
            line: label.line,
            id: label.id.clone(),
            ran: true,
            error: None,
            valid: g.valid,
            generated_tokens: g.generated_tokens,
            seconds,
            fields: label
                .expected
                .keys()
                .map(|name| {
                    (
                        name.clone(),
                        g.fields.get(name).and_then(|f| f.value.clone()),
                    )
                })
                .collect(),
        },
        Err(e) => failed(true, e.to_string(), seconds),
    }
}

/// One item's outcome into the report: its counts, and per labelled field correctness and
/// agreement with forkscore (an item without an answer counts every field as wrong).
fn tally(
    report: &mut BaselineReport,
    label: &Label,
    g: &Generated,
    forkscore: &HashMap<(String, String), Value>,
) {
    if g.ran {
        report.items += 1;
    }
    if let Some(e) = &g.error {
        report.errors.push((label.id.clone(), e.clone()));
        count_wrong(report, label);
        return;
    }
    report.generated_tokens += g.generated_tokens;
    if g.valid {
        report.valid += 1;
    }
    for (name, want) in &label.expected {
        let got = g.fields.get(name).cloned().flatten();
        let fb = report.fields.entry(name.clone()).or_default();
        fb.n += 1;
        if got.as_ref() == Some(want) {
            fb.correct += 1;
        }
        if let Some(fs) = forkscore.get(&(label.id.to_string(), name.clone())) {
            fb.compared += 1;
            if got.as_ref() == Some(fs) {
                fb.agree += 1;
            }
        }
    }
}

/// An item generation could not run on: every labelled field counts as wrong.
fn count_wrong(report: &mut BaselineReport, label: &Label) {
    for name in label.expected.keys() {
        report.fields.entry(name.clone()).or_default().n += 1;
    }
}
