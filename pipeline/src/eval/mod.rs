//! `forkscore eval`: a labelled JSONL file (batch lines plus `"expected": {field: value}`) →
//! per-field accuracy, macro-F1, confusion matrix, Brier score, log-loss and ECE (equal-width
//! and equal-mass bins), a JSON report, a summary on stdout and one reliability diagram (SVG)
//! per field; optionally the autoregressive generation baseline on the same items and prompts.
//!
//! ```text
//! labelled JSONL ─► labels::split ─► derived batch input (<predictions>.input.jsonl) + labels
//!   ─► the batch job (batch::run_job: grouped scoring, progress bar, --resume) ─► predictions JSONL
//!   ─► join (by id) ─► metrics per field ─► report JSON, stdout summary, svg per field
//!   [─► baseline::run (Engine::generate per labelled item, same prompts' contexts and schemas)]
//! ```
//!
//! The scoring is the batch job itself, so it resumes exactly like `forkscore batch` (the
//! predictions file is its output). Metrics are pure functions ([`metrics`]), tested against
//! scikit-learn's figures. `forkscore calibrate` reuses [`score_labelled`] and [`join`].

pub mod baseline;
pub mod generations;
pub mod join;
pub mod labels;
pub mod metrics;
pub mod png;
pub mod svg;

use crate::batch::{self, BatchArgs, BatchModeArg};
use crate::group_args::GroupBudgetArgs;
use crate::load::{self, ModelArgs};
use crate::provenance::ModelProvenance;
use crate::score_cmd::{ContextArgs, SchemaArgs, ScoringArgs};
use anyhow::{bail, Context, Result};
use forkscore_backends::Backend;
use forkscore_engine::Engine;
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The scoring side shared by `eval` and `calibrate`: a labelled file scored by the batch job.
#[derive(Debug, clap::Args)]
pub struct LabelledJobArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Labelled JSONL: batch lines (id, context, optional schema | schema_file | question)
    /// with "expected": {"field": value, ...}.
    #[arg(long)]
    pub input: PathBuf,
    /// The predictions JSONL (the scoring job's output records; resumable with --resume). The
    /// derived batch input is written beside it as <predictions>.input.jsonl.
    #[arg(long)]
    pub predictions: PathBuf,
    /// The default schema for lines without one.
    #[command(flatten)]
    pub schema: SchemaArgs,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    /// Continue an interrupted scoring job after the predictions' last complete record (with
    /// a complete predictions file nothing is scored again).
    #[arg(long)]
    pub resume: bool,
    /// Overwrite existing predictions.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Lines read, prepared and grouped together.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    #[command(flatten)]
    pub group: GroupBudgetArgs,
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub job: LabelledJobArgs,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write one reliability diagram per field here (<field>.reliability.svg); default: the
    /// report's folder, or no diagrams without --report.
    #[arg(long)]
    pub svg_dir: Option<PathBuf>,
    /// ECE bins (equal-width and equal-mass alike).
    #[arg(long, default_value_t = 10)]
    pub bins: usize,
    /// Also run a baseline on the same items: `generate` (the model writes the JSON answer,
    /// greedy; accuracy, validity rate, agreement with forkscore, speed ratio).
    #[arg(long, value_enum)]
    pub baseline: Option<BaselineKind>,
    /// Most tokens the generation baseline may write per item (default: per schema).
    #[arg(long, requires = "baseline")]
    pub max_new_tokens: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BaselineKind {
    Generate,
}

/// What the scoring phase did and produced.
pub struct Scored {
    pub labelled: labels::Labelled,
    pub records: Vec<Value>,
    /// Predictions records written in this run (0 when a resumed file was complete).
    pub scored_now: u64,
    pub seconds: f64,
}

fn derived_input(predictions: &Path) -> PathBuf {
    let mut name = predictions.as_os_str().to_owned();
    name.push(".input.jsonl");
    PathBuf::from(name)
}

impl LabelledJobArgs {
    /// Read the labelled file and check the flags (before the model loads).
    pub fn read_labels(&self) -> Result<labels::Labelled> {
        let text = std::fs::read_to_string(&self.input)
            .with_context(|| format!("cannot read labelled input {}", self.input.display()))?;
        let labelled = labels::split(&text, &self.base_dir()?);
        if labelled.labels.is_empty() {
            bail!(
                "{}: no labelled line (each line needs \"expected\": {{\"field\": value}}); {} problem(s), first: {}",
                self.input.display(),
                labelled.problems.len(),
                labelled
                    .problems
                    .first()
                    .map_or("empty file".into(), |p| format!("line {}: {}", p.line, p.message))
            );
        }
        let exists = std::fs::metadata(&self.predictions)
            .map(|m| m.len() > 0)
            .unwrap_or(false);
        if exists && !self.resume && !self.force {
            bail!(
                "--predictions {} exists: pass --resume to continue (or reuse) it, or --force to overwrite it",
                self.predictions.display()
            );
        }
        Ok(labelled)
    }

    /// The labelled file's folder as an absolute path (relative schema files are resolved
    /// against it, and the derived batch input lives elsewhere).
    pub fn base_dir(&self) -> Result<PathBuf> {
        let parent = self.input.parent().map(PathBuf::from).unwrap_or_default();
        let parent = if parent.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            parent
        };
        std::path::absolute(&parent)
            .with_context(|| format!("cannot resolve the folder of {}", self.input.display()))
    }

    fn batch_args(&self, input: PathBuf) -> BatchArgs {
        BatchArgs {
            model: self.model.clone(),
            input,
            output: self.predictions.clone(),
            schema: self.schema.clone(),
            batch_mode: BatchModeArg::Grouped,
            context: ContextArgs {
                context: None,
                context_file: None,
            },
            scoring: self.scoring.clone(),
            resume: self.resume,
            force: self.force,
            resume_any_provenance: false,
            format: crate::batch::LineFormatArg::Native,
            fail_fast: false,
            quiet: self.quiet,
            window: self.window,
            group: self.group.clone(),
            shard: None,
        }
    }
}

/// Score the labelled file with the batch job into the predictions file and read it back.
pub fn score_labelled<B: Backend>(
    engine: &Engine<B>,
    model: &ModelProvenance,
    args: &LabelledJobArgs,
    labelled: labels::Labelled,
) -> Result<Scored> {
    let input = derived_input(&args.predictions);
    std::fs::write(&input, &labelled.batch_input)
        .with_context(|| format!("cannot write {}", input.display()))?;
    let batch_args = args.batch_args(input);
    crate::batch::precheck::precheck_batch(&batch_args)?;
    let job = batch_args.job(&engine.memory_model(), batch_args.read_inputs()?)?;
    let summary = batch::run_job(engine, model, &job)?;
    let text = std::fs::read_to_string(&args.predictions)
        .with_context(|| format!("cannot read {}", args.predictions.display()))?;
    let records = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{} record {} is not JSON",
                    args.predictions.display(),
                    i + 1
                )
            })
        })
        .collect::<Result<Vec<Value>>>()?;
    Ok(Scored {
        labelled,
        records,
        scored_now: summary.written.lines,
        seconds: summary.seconds,
    })
}

/// Counts of what was evaluated and what failed, by reason.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub lines_labelled: usize,
    pub label_problems: Vec<labels::LabelProblem>,
    pub decided: usize,
    pub failures_by_kind: IndexMap<String, usize>,
    pub failures: Vec<join::Failure>,
}

pub fn counts(scored: &Scored, joined: &join::Joined) -> Counts {
    let mut by_kind = IndexMap::new();
    for f in &joined.failures {
        *by_kind.entry(f.kind.clone()).or_insert(0) += 1;
    }
    Counts {
        lines_labelled: scored.labelled.labels.len(),
        label_problems: scored.labelled.problems.clone(),
        decided: joined.decided,
        failures_by_kind: by_kind,
        failures: joined.failures.clone(),
    }
}

/// One field's report.
#[derive(Debug, Clone, Serialize)]
pub struct FieldReport {
    pub classes: Vec<String>,
    #[serde(flatten)]
    pub metrics: metrics::FieldMetrics,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// The same diagram as a PNG, beside the SVG.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
}

/// The metrics of every field with at least one item.
pub fn field_reports(joined: &join::Joined, bins: usize) -> Result<IndexMap<String, FieldReport>> {
    let mut out = IndexMap::new();
    for (name, f) in &joined.fields {
        if f.items.is_empty() {
            continue;
        }
        let items: Vec<metrics::Scored> = f.items.iter().map(|i| i.scored.clone()).collect();
        let m = metrics::field_metrics(&items, f.classes.len(), bins)
            .with_context(|| format!("field {name}"))?;
        out.insert(
            name.clone(),
            FieldReport {
                classes: f.classes.clone(),
                metrics: m,
                svg: None,
                png: None,
            },
        );
    }
    Ok(out)
}

fn svg_file_name(field: &str) -> String {
    let safe: String = field
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.reliability.svg")
}

/// The eval report (also printed as a summary).
pub fn run_eval<B: Backend>(
    engine: &Engine<B>,
    model: &ModelProvenance,
    args: &EvalArgs,
    eos_ids: Vec<u32>,
) -> Result<Value> {
    if args.bins == 0 {
        bail!("--bins must be at least 1");
    }
    let labelled = args.job.read_labels()?;
    let scored = score_labelled(engine, model, &args.job, labelled)?;
    let joined = join::join(&scored.records, &scored.labelled.labels);
    let mut fields = field_reports(&joined, args.bins)?;
    let svg_dir = args.svg_dir.clone().or_else(|| {
        args.report
            .as_ref()
            .map(|r| r.parent().map(PathBuf::from).unwrap_or_default())
    });
    if let Some(dir) = &svg_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let label = format!(
            "{} @ {} · {} · input {}",
            model.model_id,
            model.revision,
            format!("mode {:?}", args.job.scoring.mode).to_lowercase(),
            args.job.input.display()
        );
        for (name, f) in fields.iter_mut() {
            let path = dir.join(svg_file_name(name));
            std::fs::write(&path, svg::reliability_svg(name, &f.metrics, &label))
                .with_context(|| format!("cannot write {}", path.display()))?;
            f.svg = Some(path.display().to_string());
            let png_path = path.with_extension("png");
            std::fs::write(&png_path, png::reliability_png(name, &f.metrics, &label))
                .with_context(|| format!("cannot write {}", png_path.display()))?;
            f.png = Some(png_path.display().to_string());
        }
    }
    let counts = counts(&scored, &joined);
    let decisions_per_s = (scored.scored_now > 0 && scored.seconds > 0.0)
        .then(|| scored.scored_now as f64 / scored.seconds);
    let baseline = match args.baseline {
        None => None,
        Some(BaselineKind::Generate) => Some(baseline::run(
            engine,
            &args.job,
            &scored,
            &joined,
            baseline::Settings {
                file: generations::path_for(&args.job.predictions),
                header: json!({
                    "generations_of": {
                        "model_id": model.model_id,
                        "revision": model.revision,
                        "fingerprint": model.fingerprint,
                        "dtype": model.dtype,
                        "quantization": model.quantization,
                    },
                    "input": args.job.input.display().to_string(),
                    "max_new_tokens": args.max_new_tokens,
                    "layout": args.job.scoring.layout,
                }),
                resume: args.job.resume,
                max_new_tokens: args.max_new_tokens,
                eos_ids,
                forkscore_decisions_per_s: decisions_per_s,
            },
        )?),
    };
    let report = json!({
        "input": args.job.input.display().to_string(),
        "predictions": args.job.predictions.display().to_string(),
        "bins": args.bins,
        "definitions": DEFINITIONS,
        "counts": counts,
        "fields": fields,
        "scoring_job": {
            "records_scored_in_this_run": scored.scored_now,
            "seconds": scored.seconds,
            "decisions_per_s": decisions_per_s,
        },
        "baseline": baseline,
        "provenance": model,
    });
    Ok(report)
}

/// Metric definitions, as written into every report.
pub const DEFINITIONS: &str = "accuracy: fraction of items whose value is the expected value. \
macro_f1: unweighted mean of per-class F1 over the classes present in the expected or predicted values. \
confusion[true][predicted]: counts, rows and columns in the order of `classes`. \
brier: mean over items of sum_k (p_k - y_k)^2 (multi-class; range 0..2). \
log_loss: mean of -ln p(expected), p clipped to [2.2e-16, 1 - 2.2e-16]. \
ECE: sum over bins of (items in bin / N) * |accuracy in bin - mean confidence in bin|, confidence = the probability of the chosen value; \
equal-width: `bins` bins of width 1/bins over [0, 1]; equal-mass: items sorted by confidence, split into `bins` bins of (nearly) equal count.";

/// The human summary of a report.
pub fn summary(report: &Value) -> String {
    let mut s = String::new();
    let c = &report["counts"];
    s.push_str(&format!(
        "forkscore eval: {} labelled lines, {} decided, {} label problems, failures {}\n",
        c["lines_labelled"],
        c["decided"],
        c["label_problems"].as_array().map_or(0, Vec::len),
        c["failures_by_kind"]
    ));
    s.push_str(&format!(
        "{:<20} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}\n",
        "field", "N", "acc", "macroF1", "brier", "logloss", "ECE(w)", "ECE(m)"
    ));
    if let Some(fields) = report["fields"].as_object() {
        for (name, f) in fields {
            s.push_str(&format!(
                "{:<20} {:>6} {:>8.4} {:>8.4} {:>8.4} {:>8.4} {:>9.4} {:>9.4}\n",
                name,
                f["n"].as_u64().unwrap_or(0),
                f["accuracy"].as_f64().unwrap_or(f64::NAN),
                f["macro_f1"].as_f64().unwrap_or(f64::NAN),
                f["brier"].as_f64().unwrap_or(f64::NAN),
                f["log_loss"].as_f64().unwrap_or(f64::NAN),
                f["ece_equal_width"].as_f64().unwrap_or(f64::NAN),
                f["ece_equal_mass"].as_f64().unwrap_or(f64::NAN),
            ));
        }
    }
    s.push_str(&format!(
        "ECE over {} bins of the chosen value's probability (w: equal width, m: equal mass)\n",
        report["bins"]
    ));
    let b = &report["baseline"];
    if !b.is_null() {
        s.push_str(&format!(
            "baseline generate: {} items, validity {:.4}, accuracy {:.4}, agreement with forkscore {:.4}, {:.3} items/s; speed ratio (forkscore decisions/s ÷ generate items/s) {}\n",
            b["items"],
            b["validity_rate"].as_f64().unwrap_or(f64::NAN),
            b["accuracy"].as_f64().unwrap_or(f64::NAN),
            b["agreement"].as_f64().unwrap_or(f64::NAN),
            b["items_per_s"].as_f64().unwrap_or(f64::NAN),
            b["speed_ratio"]
                .as_f64()
                .map_or("n/a (forkscore scored nothing in this run)".into(), |r| format!("{r:.2}"))
        ));
    }
    s
}

pub fn run(args: &EvalArgs) -> Result<()> {
    if args.bins == 0 {
        bail!("--bins must be at least 1");
    }
    args.job.read_labels()?;
    let loaded = load::open(&args.job.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(args.job.scoring.context_special_tokens);
    let eos = forkscore_engine::generate::eos_ids_from_folder(&engine.backend().checkpoint().dir);
    let report = run_eval(&engine, &loaded.provenance, args, eos)?;
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
