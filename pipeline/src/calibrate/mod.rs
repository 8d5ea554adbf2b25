//! `forkscore calibrate`: fit one temperature per field on a training split of a labelled file
//! (optionally with contextual calibration, Zhao et al. 2021), write a calibration file that
//! `--calibration-file` (CLI, `forkscore serve`, Python `Scorer.load(calibration_file=…)`)
//! accepts, and report accuracy, ECE, Brier and log-loss before (T = 1) and after on the
//! held-out split.
//!
//! ```text
//! labelled JSONL ─► eval::score_labelled (the batch job, resumable) ─► predictions
//!   ─► eval::join ─► seeded stratified split of the labelled items (train / held-out)
//!   [─► --contextual: content-free inputs decided per schema → mean T = 1 probabilities p_cf per field]
//!   ─► per field fit::fit_temperature on train (NLL of softmax(s / T − ln p_cf))
//!   ─► calibration file (one entry for the model: per-field temperature + content_free)
//!   ─► held-out metrics before / after (eval::metrics) ─► stdout + --report JSON
//! ```

pub mod fit;

use crate::batch::records::parse_line;
use crate::batch::schema_cache::SchemaCache;
use crate::eval::join::{FieldItems, Joined};
use crate::eval::metrics::{self, FieldMetrics};
use crate::eval::{self, LabelledJobArgs};
use crate::load;
use crate::provenance::ModelProvenance;
use anyhow::{bail, Context, Result};
use forkscore_backends::Backend;
use forkscore_engine::calibration::{CalibrationEntry, CalibrationRegistry, FieldCalibration};
use forkscore_engine::{Engine, ScoreOptions};
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::PathBuf;

/// The content-free inputs of `--contextual` (Zhao et al. 2021 use "N/A", "" and "[MASK]";
/// forkscore refuses an empty context, so "None" stands in for it).
pub const CONTENT_FREE: [&str; 3] = ["N/A", "[MASK]", "None"];

#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub job: LabelledJobArgs,
    /// The calibration file to write (refused if it exists, unless --replace-output).
    #[arg(long)]
    pub output: PathBuf,
    /// Overwrite an existing --output.
    #[arg(long)]
    pub replace_output: bool,
    /// Write the JSON report (before / after on the held-out split) here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Seed of the train / held-out split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fraction of the labelled items held out (stratified by their expected values).
    #[arg(long, default_value_t = 0.5)]
    pub holdout_fraction: f64,
    /// ECE bins of the report.
    #[arg(long, default_value_t = 10)]
    pub bins: usize,
    /// Also fit contextual calibration: per field, the mean probabilities on content-free
    /// inputs ("N/A", "[MASK]", "None"), divided out before renormalising.
    #[arg(long)]
    pub contextual: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FieldOutcome {
    /// False for a field without a training item (T = 1, not written to the file).
    pub fitted: bool,
    pub temperature: f64,
    /// The fit stopped at a bound of [0.05, 20] (T → 20: the scores carry almost no signal on
    /// the training items; T → 0.05: they are far too flat or the training set is tiny).
    pub at_bound: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_free: Option<IndexMap<String, f64>>,
    pub train: usize,
    pub held_out: usize,
    /// Held-out metrics at T = 1 (raw probabilities).
    pub before: Option<FieldMetrics>,
    /// Held-out metrics with the fitted calibration.
    pub after: Option<FieldMetrics>,
}

fn check(args: &CalibrateArgs) -> Result<()> {
    if !(args.holdout_fraction > 0.0 && args.holdout_fraction < 1.0) {
        bail!(
            "--holdout-fraction must be between 0 and 1 (exclusive), got {}",
            args.holdout_fraction
        );
    }
    if args.bins == 0 {
        bail!("--bins must be at least 1");
    }
    if args.output.exists() && !args.replace_output {
        bail!(
            "--output {} exists: pass --replace-output to overwrite it",
            args.output.display()
        );
    }
    Ok(())
}

/// Per field, the mean T = 1 probabilities of the content-free inputs, over every distinct
/// schema of the labelled lines that has the field.
fn content_free<B: Backend>(
    engine: &Engine<B>,
    args: &LabelledJobArgs,
    scored: &eval::Scored,
) -> Result<IndexMap<String, IndexMap<String, f64>>> {
    let default_schema = args.schema.load()?;
    let base = args.base_dir()?;
    let schemas = SchemaCache::new(engine, default_schema.as_ref(), &base);
    let lines: Vec<&str> = scored.labelled.batch_input.lines().collect();
    let mut seen = HashSet::new();
    let mut sums: IndexMap<String, (IndexMap<String, f64>, usize)> = IndexMap::new();
    let opts = ScoreOptions {
        temperature: None,
        ..args.scoring.options()
    };
    for label in &scored.labelled.labels {
        let Some(raw) = lines.get(label.line as usize - 1) else {
            continue;
        };
        let Ok(request) = parse_line(label.line, raw.as_bytes(), false) else {
            continue;
        };
        let Ok(compiled) = schemas.resolve(engine, &request.schema) else {
            continue;
        };
        if !seen.insert(compiled.schema_hash().to_string()) {
            continue;
        }
        for cf in CONTENT_FREE {
            let d = engine
                .decide(cf, &compiled, &opts)
                .with_context(|| format!("content-free input {cf:?}"))?;
            for (name, f) in &d.fields {
                let keys: Vec<String> = f.logits.keys().cloned().collect();
                let s: Vec<f32> = f.logits.values().copied().collect();
                let p = fit::probabilities(&s, 1.0, None);
                let (acc, n) = sums.entry(name.clone()).or_default();
                for (k, v) in keys.into_iter().zip(p) {
                    *acc.entry(k).or_insert(0.0) += v;
                }
                *n += 1;
            }
        }
    }
    Ok(sums
        .into_iter()
        .map(|(name, (acc, n))| {
            let mean = acc
                .into_iter()
                // a probability of exactly 0 would make the shift infinite
                .map(|(k, v)| (k, (v / n as f64).max(1e-12)))
                .collect();
            (name, mean)
        })
        .collect())
}

/// Held-out metrics of `field` at temperature `t` with `shift` (argmax values).
fn metrics_at(
    field: &FieldItems,
    idx: &[usize],
    t: f64,
    shift: Option<&[f64]>,
    bins: usize,
) -> Result<Option<FieldMetrics>> {
    if idx.is_empty() {
        return Ok(None);
    }
    let items: Vec<metrics::Scored> = idx
        .iter()
        .map(|&i| {
            let it = &field.items[i];
            let p = fit::probabilities(&it.log_scores, t, shift);
            metrics::Scored {
                truth: it.scored.truth,
                predicted: forkscore_engine::literal::assemble::argmax_f64_first(&p),
                probabilities: p,
            }
        })
        .collect();
    Ok(Some(metrics::field_metrics(
        &items,
        field.classes.len(),
        bins,
    )?))
}

/// Fit every field and build the report; returns (calibration entry, report).
pub fn run_calibrate<B: Backend>(
    engine: &Engine<B>,
    model: &ModelProvenance,
    args: &CalibrateArgs,
) -> Result<(CalibrationEntry, Value)> {
    check(args)?;
    let labelled = args.job.read_labels()?;
    let scored = eval::score_labelled(engine, model, &args.job, labelled)?;
    let joined: Joined = eval::join::join(&scored.records, &scored.labelled.labels);
    // split the labelled items (by id), stratified by their expected values
    let strata: Vec<String> = scored
        .labelled
        .labels
        .iter()
        .map(|l| Value::Object(l.expected.clone()).to_string())
        .collect();
    let (_, held) = fit::stratified_split(&strata, args.holdout_fraction, args.seed);
    let held_ids: HashSet<String> = held
        .iter()
        .map(|&i| scored.labelled.labels[i].id.to_string())
        .collect();
    let cf = if args.contextual {
        content_free(engine, &args.job, &scored)?
    } else {
        IndexMap::new()
    };
    let mut outcomes: IndexMap<String, FieldOutcome> = IndexMap::new();
    let mut fields: IndexMap<String, FieldCalibration> = IndexMap::new();
    for (name, f) in &joined.fields {
        let (mut tr, mut ho) = (Vec::new(), Vec::new());
        for (i, it) in f.items.iter().enumerate() {
            if held_ids.contains(&it.id.to_string()) {
                ho.push(i)
            } else {
                tr.push(i)
            }
        }
        let fitted = !tr.is_empty();
        let content_free = cf.get(name).filter(|_| fitted).map(|m| {
            f.classes
                .iter()
                .map(|k| (k.clone(), m.get(k).copied().unwrap_or(1.0)))
                .collect::<IndexMap<String, f64>>()
        });
        let shift: Option<Vec<f64>> = content_free
            .as_ref()
            .map(|m| m.values().map(|p| p.ln()).collect());
        let train: Vec<(&[f32], usize)> = tr
            .iter()
            .map(|&i| (f.items[i].log_scores.as_slice(), f.items[i].scored.truth))
            .collect();
        let t = fit::fit_temperature(&train, shift.as_deref());
        outcomes.insert(
            name.clone(),
            FieldOutcome {
                fitted,
                temperature: t,
                at_bound: fitted
                    && ((t / fit::T_MIN).ln().abs() < 1e-6 || (t / fit::T_MAX).ln().abs() < 1e-6),
                content_free: content_free.clone(),
                train: tr.len(),
                held_out: ho.len(),
                before: metrics_at(f, &ho, 1.0, None, args.bins)?,
                after: metrics_at(f, &ho, t, shift.as_deref(), args.bins)?,
            },
        );
        if fitted {
            fields.insert(
                name.clone(),
                FieldCalibration {
                    temperature: t,
                    content_free,
                },
            );
        }
    }
    if fields.is_empty() {
        bail!("no field has a training item: nothing to fit (see the failures in the predictions)");
    }
    let id = engine.identity();
    let revision = id
        .revision
        .clone()
        .filter(|r| r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit()));
    let entry = CalibrationEntry {
        model_id: id.model_id.clone().unwrap_or_else(|| model.model_id.clone()),
        revision: revision.clone(),
        adapter_sha256: id.adapter_sha256.clone().into_iter().collect(),
        temperature: 1.0,
        fields,
        note: Some(format!(
            "forkscore calibrate on {} (seed {}, held-out fraction {}, {} training items{}); revision {}",
            args.job.input.display(),
            args.seed,
            args.holdout_fraction,
            strata.len() - held.len(),
            if args.contextual { ", contextual calibration" } else { "" },
            revision.as_deref().unwrap_or("any (the folder's revision label is not a 40-hex commit)")
        )),
        origin: None,
    };
    let counts = eval::counts(&scored, &joined);
    let report = json!({
        "input": args.job.input.display().to_string(),
        "predictions": args.job.predictions.display().to_string(),
        "calibration_file": args.output.display().to_string(),
        "seed": args.seed,
        "holdout_fraction": args.holdout_fraction,
        "items": {"train": strata.len() - held.len(), "held_out": held.len()},
        "bins": args.bins,
        "contextual": args.contextual.then_some(CONTENT_FREE),
        "before": "T = 1: softmax of the recorded log-scores (a code field's raw logits, a literal field's method log-scores), value = argmax",
        "after": "softmax(log-scores / T_field - ln p_cf), value = argmax",
        "definitions": eval::DEFINITIONS,
        "counts": counts,
        "fields": outcomes,
        "provenance": model,
    });
    Ok((entry, report))
}

pub fn summary(report: &Value) -> String {
    let mut s = format!(
        "forkscore calibrate: {} training / {} held-out items (seed {}), wrote {}\n{:<20} {:>8} {:>6} {:>17} {:>17} {:>17}\n",
        report["items"]["train"],
        report["items"]["held_out"],
        report["seed"],
        report["calibration_file"].as_str().unwrap_or(""),
        "field",
        "T",
        "N",
        "acc before→after",
        "ECE(w) bef→aft",
        "ECE(m) bef→aft"
    );
    if let Some(fields) = report["fields"].as_object() {
        for (name, f) in fields {
            let pair = |key: &str| match (f["before"][key].as_f64(), f["after"][key].as_f64()) {
                (Some(b), Some(a)) => format!("{b:>8.4}→{a:<8.4}"),
                _ => format!("{:>17}", "no held-out item"),
            };
            s.push_str(&format!(
                "{:<20} {:>8} {:>6} {} {} {}\n",
                name,
                if f["fitted"] == true {
                    format!("{:.4}", f["temperature"].as_f64().unwrap_or(f64::NAN))
                } else {
                    "unfitted".into()
                },
                f["held_out"].as_u64().unwrap_or(0),
                pair("accuracy"),
                pair("ece_equal_width"),
                pair("ece_equal_mass"),
            ));
        }
    }
    s.push_str(&format!(
        "held-out ECE over {} bins (w: equal width, m: equal mass); before = T 1\n",
        report["bins"]
    ));
    s
}

pub fn run(args: &CalibrateArgs) -> Result<()> {
    check(args)?;
    args.job.read_labels()?;
    let loaded = load::open(&args.job.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(args.job.scoring.context_special_tokens);
    let (entry, report) = run_calibrate(&engine, &loaded.provenance, args)?;
    let registry = CalibrationRegistry {
        entries: vec![entry],
    };
    std::fs::write(
        &args.output,
        format!("{}\n", serde_json::to_string_pretty(&registry)?),
    )
    .with_context(|| format!("cannot write {}", args.output.display()))?;
    if let Some(path) = &args.report {
        std::fs::write(
            path,
            format!("{}\n", serde_json::to_string_pretty(&report)?),
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
    }
    print!("{}", summary(&report));
    Ok(())
}
