//! The arguments of `forkscore batch` and the [`Job`] they describe.

use super::resume::OutputPolicy;
use super::{openai::LineFormat, shard, BatchMode, Job};
use crate::load::ModelArgs;
use crate::score_cmd::{ContextArgs, SchemaArgs, ScoringArgs};
use anyhow::{bail, Result};
use std::path::PathBuf;

/// How lines are batched (`--batch-mode`; the command line's name for [`BatchMode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BatchModeArg {
    /// Contexts that share a schema go through bounded groups: N prefills + one scoring pass.
    Grouped,
    /// Every line on its own (one prefill + one scoring pass per line).
    Direct,
    /// Consecutive lines with the same context and schema share one prefill and scoring pass.
    Serial,
    /// One job-wide context (--context/--context-file); each line brings its schema or question.
    Shared,
}

impl From<BatchModeArg> for BatchMode {
    fn from(m: BatchModeArg) -> BatchMode {
        match m {
            BatchModeArg::Grouped => BatchMode::Grouped,
            BatchModeArg::Direct => BatchMode::Direct,
            BatchModeArg::Serial => BatchMode::Serial,
            BatchModeArg::Shared => BatchMode::Shared,
        }
    }
}

/// Which line format a batch job reads and writes (`--format`; the command line's name for
/// [`LineFormat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LineFormatArg {
    /// forkscore's own lines (`id`, `context`, `schema` …) and records.
    #[default]
    Native,
    /// OpenAI Batch API lines in (`custom_id`, `body` with a chat request), OpenAI batch
    /// output lines out (`custom_id`, `response`, `error`).
    Openai,
}

impl From<LineFormatArg> for LineFormat {
    fn from(f: LineFormatArg) -> LineFormat {
        match f {
            LineFormatArg::Native => LineFormat::Native,
            LineFormatArg::Openai => LineFormat::Openai,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct BatchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Input JSONL: one {"id", "context", "schema" | "schema_file" | "question"} object per line
    /// (with --format openai: OpenAI Batch API lines). `-` reads stdin.
    #[arg(long)]
    pub input: PathBuf,
    /// Output JSONL (append-only; refused if it exists, unless --resume or --force). A job that
    /// finishes cleanly writes its completion marker OUTPUT.done.json next to it (what
    /// `forkscore merge` requires of each shard). `-` writes stdout (no --resume, no marker;
    /// progress and the summary stay on stderr).
    #[arg(long)]
    pub output: PathBuf,
    /// Line format: `native` (forkscore's lines and records) or `openai` (OpenAI Batch API
    /// input lines in, OpenAI batch output lines out; see docs/batch.md).
    #[arg(long, value_enum, default_value = "native")]
    pub format: LineFormatArg,
    /// The default schema for lines without one.
    #[command(flatten)]
    pub schema: SchemaArgs,
    #[arg(long, value_enum, default_value = "grouped")]
    pub batch_mode: BatchModeArg,
    /// The shared context of --batch-mode shared (--context TEXT or --context-file FILE).
    #[command(flatten)]
    pub context: ContextArgs,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    /// Continue an interrupted job after the output's last complete record.
    #[arg(long)]
    pub resume: bool,
    /// Overwrite an existing output.
    #[arg(long, conflicts_with = "resume")]
    pub force: bool,
    /// With --resume: continue even when the output's records come from another model,
    /// revision, dtype, mode, temperature or default schema (the file then mixes runs).
    #[arg(long, requires = "resume")]
    pub resume_any_provenance: bool,
    /// Stop at the first line that fails (after writing its error record); exit non-zero.
    #[arg(long)]
    pub fail_fast: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Lines read, prepared and grouped together (groups never span two windows).
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    #[command(flatten)]
    pub group: crate::group_args::GroupBudgetArgs,
    /// Take only shard INDEX of COUNT of the input (e.g. 0/4; one process per shard, each with
    /// its own --output, then `forkscore merge`). Lines are split by id, deterministically.
    #[arg(long, value_name = "INDEX/COUNT")]
    pub shard: Option<shard::Shard>,
}

/// What a job reads from the files its arguments name (shared context, default schema), read
/// before the model loads: a missing schema file or an endless `--context-file /dev/zero` is
/// refused at once, not after the minutes a large checkpoint takes to load.
pub struct JobInputs {
    shared_context: Option<String>,
    default_schema: Option<forkscore_engine::Schema>,
}

impl BatchArgs {
    /// `--batch-mode`.
    pub fn batch_mode(&self) -> BatchMode {
        self.batch_mode.into()
    }

    /// Read the files the arguments name; see [`JobInputs`].
    pub fn read_inputs(&self) -> Result<JobInputs> {
        if self.format == LineFormatArg::Openai && self.batch_mode == BatchModeArg::Shared {
            bail!("--format openai: each line brings its own messages, so --batch-mode shared (one job-wide context) does not apply");
        }
        Ok(JobInputs {
            shared_context: self.context.read(self.scoring.max_input_tokens)?,
            default_schema: self.schema.load()?,
        })
    }

    /// The job these arguments describe, for an engine whose memory model is `model`.
    pub fn job(&self, memory: &forkscore_engine::MemoryModel, inputs: JobInputs) -> Result<Job> {
        let JobInputs {
            shared_context,
            default_schema,
        } = inputs;
        let budget = self.group.budget(self.model.device, memory)?;
        Ok(Job {
            input: self.input.clone(),
            output: self.output.clone(),
            format: self.format.into(),
            batch_mode: self.batch_mode.into(),
            options: self.scoring.options(),
            budget,
            default_schema,
            shared_context,
            policy: match (self.resume, self.force) {
                (true, _) => OutputPolicy::Resume,
                (false, true) => OutputPolicy::Force,
                (false, false) => OutputPolicy::Fresh,
            },
            fail_fast: self.fail_fast,
            quiet: self.quiet,
            window: self.window,
            resume_any_provenance: self.resume_any_provenance,
            shard: self.shard,
        })
    }
}
