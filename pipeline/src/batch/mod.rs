//! `forkscore batch`: a JSONL file of decisions in, a JSONL file of results out (one line per
//! input line, same id, input order). See docs/batch.md for the formats.
//!
//! The job is a pipeline of threads on bounded crossbeam channels, so memory stays bounded for
//! any input size and the accelerator never waits on the CPU:
//!
//! ```text
//! reader ──chunks of raw lines──► prepare (rayon: parse, ids, schemas, render+split+tokenize)
//!        ──chunks of items──► score (group → N prefills → one slot-merged pass → assemble)
//!        ──output lines per group──► writer (append, flush per group, progress)
//! ```
//!
//! Prefill and scoring share one stage: they use the same device one after the other, and
//! `Engine::decide_group` runs them back to back over a group's retained states.
//! Module map, by job: [`records`] (line formats), [`reader`], [`schema_cache`] (each distinct
//! schema compiled once), [`prepare`] (the CPU stage), [`score`] (the accelerator stage),
//! [`reuse`] (serial / shared reuse of decisions and prefix states), [`writer`], [`resume`]
//! (output side and input side of `--resume`), [`done`] (the completion marker `merge` needs),
//! [`openai`] (`--format openai`: OpenAI Batch API lines in, batch output lines out),
//! [`interrupt`] (Ctrl-C stops after the group in flight), [`report`] (the end-of-job stderr).
//! `--input -` / `--output -` read stdin / write stdout (no lock, no resume, no marker).

mod args;
pub mod done;
pub mod interrupt;
pub mod lock;
pub mod precheck;
pub mod provenance_check;
pub mod reader;
pub mod report;
pub mod resume;
pub mod writer;

pub use args::{BatchArgs, BatchModeArg, JobInputs, LineFormatArg};
// the batch core every front end shares, under the paths the CLI has always used
pub use forkscore_frontend::batch::{
    lines, openai, prepare, records, reuse, schema_cache, score, shard, BatchMode,
};

use crate::load;
use anyhow::{bail, Context, Result};
use forkscore_backends::Backend;
use forkscore_engine::{Engine, GroupBudget, Schema, ScoreOptions};
use forkscore_frontend::batch::prepare::{OutLine, Preparer, ResumeCheck, StageError};
use forkscore_frontend::bounds::{check_context_len, check_flags, max_line_bytes, progress_total};
use forkscore_frontend::provenance::{BatchProvenance, ModelProvenance};
use resume::{open_output, OutputPolicy, ResumePoint};
use schema_cache::SchemaCache;
use score::Scorer;
use std::collections::HashSet;
use std::io::BufReader;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// A validated batch job.
#[derive(Debug, Clone)]
pub struct Job {
    /// The input file (`-`: stdin).
    pub input: PathBuf,
    /// The output file (`-`: stdout).
    pub output: PathBuf,
    /// How lines are read and records written.
    pub format: openai::LineFormat,
    pub batch_mode: BatchMode,
    pub options: ScoreOptions,
    pub budget: GroupBudget,
    pub default_schema: Option<Schema>,
    pub shared_context: Option<String>,
    pub policy: OutputPolicy,
    pub fail_fast: bool,
    pub quiet: bool,
    pub window: usize,
    /// Resume even when the existing records' provenance differs from this run's.
    pub resume_any_provenance: bool,
    /// `--shard`: this job's share of the input (`None`: all of it).
    pub shard: Option<shard::Shard>,
}

/// What a job did.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSummary {
    pub written: writer::Written,
    pub resumed: Option<ResumePoint>,
    /// True when --fail-fast stopped the job at an error record.
    pub stopped_at_error: bool,
    pub seconds: f64,
    /// The completion marker written ([`done`]); `None` when the job stopped at an error
    /// record or the output is not a regular file (a pipe, `/dev/stdout`).
    pub marker: Option<PathBuf>,
    /// True when Ctrl-C stopped the job ([`interrupt`]): the output ends on a complete record
    /// and `--resume` continues it.
    pub interrupted: bool,
}

/// True for `-` (stdin as --input, stdout as --output).
pub fn is_stdio(path: &std::path::Path) -> bool {
    path.as_os_str() == "-"
}

/// True when both paths name the same existing file (also through links or `..`).
pub(crate) fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    !is_stdio(a) && !is_stdio(b) && lock::same_file(a, b)
}

/// Run `job` with `engine`; `model` is what provenance records about it. This is the whole
/// batch pipeline; the CLI only loads the model and builds the [`Job`].
pub fn run_job<B: Backend>(
    engine: &Engine<B>,
    model: &ModelProvenance,
    job: &Job,
) -> Result<JobSummary> {
    let start = std::time::Instant::now();
    check_flags(&[
        ("--window", Some(job.window)),
        ("--max-input-tokens", Some(job.options.max_input_tokens)),
        ("--field-batch-size", job.options.field_batch_size),
    ])?;
    match (job.batch_mode, &job.shared_context) {
        (BatchMode::Shared, None) => bail!("--batch-mode shared needs --context or --context-file"),
        (BatchMode::Shared, Some(c)) if c.trim().is_empty() => {
            bail!("--batch-mode shared: the shared context is empty")
        }
        (m, Some(_)) if m != BatchMode::Shared => {
            bail!("--context/--context-file is for --batch-mode shared")
        }
        _ => {}
    }
    if job.batch_mode == BatchMode::Shared && job.format == openai::LineFormat::Openai {
        bail!("--format openai: each line brings its own messages, so --batch-mode shared (one job-wide context) does not apply");
    }
    let to_stdout = is_stdio(&job.output);
    if to_stdout && job.policy == OutputPolicy::Resume {
        bail!("--resume needs an output file: with --output - the records go to stdout, which cannot be continued (write to a file to be able to resume)");
    }
    let temperature = engine.check_request(&job.options)?;
    if same_file(&job.input, &job.output) {
        bail!(
            "--output {} is the input file: choose another output path",
            job.output.display()
        );
    }
    if let Some(c) = &job.shared_context {
        check_context_len(c, job.options.max_input_tokens)?;
    }
    // a shard's share of the lines is known only as they are read: no total then (nor for stdin)
    let (input, total): (Box<dyn std::io::Read + Send>, _) = if is_stdio(&job.input) {
        (Box::new(std::io::stdin()), None)
    } else {
        let mut file = std::fs::File::open(&job.input)
            .with_context(|| format!("cannot open input {}", job.input.display()))?;
        let total = progress_total(
            &mut file,
            writer::progress_shown(job.quiet) && job.shard.is_none(),
        );
        (Box::new(file), total)
    };
    let (_lock, out_file, resumed, regular) = if to_stdout {
        (None, writer::Sink::Stdout(std::io::stdout()), None, false)
    } else {
        // held until the job returns: a second job on this output is refused
        let lock = lock::OutputLock::acquire(&job.output)?;
        // the lock created the output if it was missing: only a pipe or a device is not a file
        let regular = std::fs::metadata(&job.output).is_ok_and(|m| m.is_file());
        if regular && job.policy == OutputPolicy::Force {
            // --force truncates the output in open_output: its marker goes first
            done::invalidate(&job.output)?;
        }
        // Fresh: refuses a non-empty output and changes nothing; Resume: may cut a torn last
        // line, which a marker still present would not cover (its recorded size no longer
        // matches)
        let (file, resumed) = open_output(&job.output, job.policy)?;
        (Some(lock), writer::Sink::File(file), resumed, regular)
    };

    let provenance = BatchProvenance {
        model,
        mode: job.options.mode,
        batch_mode: job.batch_mode,
        temperature: temperature.value,
        temperature_source: &temperature.source,
        default_schema_hash: job.default_schema.as_ref().map(|s| s.hash()),
        shard: job.shard,
        layout: job.options.layout,
        literal_value: job.options.literal_value,
    }
    .record()?;
    if resumed.is_some() && !job.resume_any_provenance {
        provenance_check::check_resume(&job.output, provenance.base())?;
    }
    if regular {
        // before anything is appended: a job interrupted from here on leaves no marker
        done::invalidate(&job.output)?;
    }

    // a line's relative schema_file is read from the input's folder (stdin: the working one)
    let base_dir = job.input.parent().map(PathBuf::from).unwrap_or_default();
    let schemas = SchemaCache::new(engine, job.default_schema.as_ref(), &base_dir);
    let done_through = resumed.as_ref().map_or(0, |r| r.last_line);
    let mut preparer = Preparer {
        engine,
        schemas: &schemas,
        options: &job.options,
        shared_context: job.shared_context.as_deref(),
        format: job.format,
        seen_ids: HashSet::new(),
        resume: resumed.as_ref().map(|r| ResumeCheck {
            last_line: r.last_line,
            last_id: r.last_id.clone(),
            seen: false,
        }),
        shard: job.shard,
        owned: 0,
    };
    let mut scorer = Scorer::new(
        engine,
        &job.options,
        &temperature,
        job.budget,
        job.batch_mode,
        &provenance,
    )
    .with_format(job.format);
    let bar = writer::progress_bar(job.quiet, total, resumed.as_ref().map_or(0, |r| r.records));
    let stopped = AtomicBool::new(false);

    let (raw_tx, raw_rx) = crossbeam_channel::bounded::<Vec<reader::RawLine>>(2);
    let (item_tx, item_rx) = crossbeam_channel::bounded::<Vec<prepare::Item>>(2);
    let (out_tx, out_rx) = crossbeam_channel::bounded::<Vec<OutLine>>(8);

    let (read, prepared, written) = std::thread::scope(|s| {
        let read = s.spawn(move || {
            // every byte the job reads is hashed: the marker names the input it finished
            let mut input = BufReader::with_capacity(1 << 20, done::HashingReader::new(input));
            let end = reader::read_input(
                &mut input,
                job.window,
                done_through,
                max_line_bytes(job.options.max_input_tokens),
                &raw_tx,
            )?;
            Ok::<_, std::io::Error>((end, input.into_inner().finish().0))
        });
        let prepare = s.spawn(move || -> Result<(Option<ResumeCheck>, u64), StageError> {
            for chunk in raw_rx {
                let items = preparer.prepare_chunk(chunk)?;
                if !items.is_empty() && item_tx.send(items).is_err() {
                    break;
                }
            }
            Ok((preparer.resume, preparer.owned))
        });
        let write = s.spawn(move || {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, out_file);
            let written = writer::write_all(&out_rx, &mut out, &bar)?;
            let sink = out.into_inner().map_err(|e| e.into_error())?;
            if regular {
                // the records reach the disk before a marker can vouch for them
                sink.sync()?;
            }
            Ok::<_, std::io::Error>(written)
        });
        let stopped = &stopped;
        let mut emit = |mut lines: Vec<OutLine>| -> bool {
            if job.fail_fast {
                if let Some(i) = lines.iter().position(OutLine::is_error) {
                    lines.truncate(i + 1);
                    stopped.store(true, Ordering::SeqCst);
                    let _ = out_tx.send(lines);
                    return false;
                }
            }
            // after Ctrl-C the group just scored is still written, then the job stops
            out_tx.send(lines).is_ok() && !interrupt::requested()
        };
        for items in item_rx {
            if interrupt::requested() || !scorer.score_chunk(items, &mut emit) {
                break;
            }
        }
        drop(out_tx);
        (read.join(), prepare.join(), write.join())
    });
    let written = written
        .map_err(|_| anyhow::anyhow!("the writer thread panicked"))?
        .with_context(|| format!("cannot write {}", job.output.display()))?;
    let (check, owned) = prepared.map_err(|_| anyhow::anyhow!("the prepare thread panicked"))??;
    let (end, input_sha256) = read
        .map_err(|_| anyhow::anyhow!("the reader thread panicked"))?
        .with_context(|| format!("cannot read {}", job.input.display()))?;
    if interrupt::requested() {
        return Ok(JobSummary {
            written,
            resumed,
            stopped_at_error: stopped.load(Ordering::SeqCst),
            seconds: start.elapsed().as_secs_f64(),
            marker: None,
            interrupted: true,
        });
    }
    if let Some(c) = check.filter(|c| !c.seen) {
        bail!("--resume: the output ends at input line {} but the input has no such line; the output belongs to another input", c.last_line);
    }
    let stopped_at_error = stopped.load(Ordering::SeqCst);
    let marker = if stopped_at_error {
        None
    } else {
        let finished = Finished {
            end,
            input_sha256,
            owned,
            records: resumed.as_ref().map_or(0, |r| r.records) + written.lines,
        };
        finished.check(job)?;
        if regular {
            Some(finished.write_marker(job, provenance.base())?)
        } else {
            None
        }
    };
    Ok(JobSummary {
        written,
        resumed,
        stopped_at_error,
        seconds: start.elapsed().as_secs_f64(),
        marker,
        interrupted: false,
    })
}

/// What a job that ran to its end read and wrote.
struct Finished {
    end: reader::ReadEnd,
    input_sha256: String,
    /// Input lines the job owns (done ones included).
    owned: u64,
    /// Records in the output (kept ones included).
    records: u64,
}

impl Finished {
    /// The input was read to its end and the output holds one record per owned line.
    fn check(&self, job: &Job) -> Result<()> {
        if !self.end.complete {
            bail!(
                "the job stopped before the end of {} (line {}); no completion marker was written",
                job.input.display(),
                self.end.lines
            );
        }
        if self.owned != self.records {
            bail!(
                "--output {}: the job owns {} input lines but the output holds {} records, so it is not this input's complete output; no completion marker was written (start it again with --force)",
                job.output.display(),
                self.owned,
                self.records
            );
        }
        Ok(())
    }

    /// Write the output's completion marker.
    fn write_marker(
        &self,
        job: &Job,
        base: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<PathBuf> {
        let output_bytes = std::fs::metadata(&job.output)
            .with_context(|| format!("cannot read {}", job.output.display()))?
            .len();
        let mut provenance = base.clone();
        provenance.remove("shard");
        let marker = done::DoneMarker {
            format: done::FORMAT.into(),
            output: job
                .output
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            output_bytes,
            records: self.records,
            shard: job.shard,
            input: done::InputFacts {
                path: job.input.display().to_string(),
                sha256: self.input_sha256.clone(),
                lines: self.end.lines,
                records: self.end.records,
            },
            provenance,
        };
        Ok(done::write(&job.output, &marker)?)
    }
}

/// `forkscore batch`.
pub fn run(args: &BatchArgs) -> Result<()> {
    precheck::precheck(args)?;
    let inputs = args.read_inputs()?;
    let loaded = load::open(&args.model)?;
    let engine = loaded
        .engine
        .with_context_special_tokens(args.scoring.context_special_tokens);
    let job = args.job(&engine.memory_model(), inputs)?;
    // from here on Ctrl-C stops after the group in flight, and says how to continue
    interrupt::install();
    let summary = run_job(&engine, &loaded.provenance, &job)?;
    report::report(&args.output, job.quiet, &summary)
}
