//! A batch job over lines held in memory: no files, no threads, one chunk. The same parse
//! ([`super::records`], with the byte bound of `--max-input-tokens`), duplicate-id check,
//! schema cache, grouping, scoring and record serializer as the CLI's file job (the pipeline
//! crate's `batch::run_job`), so each output line is exactly the record `forkscore batch` writes
//! for that input line. The Python package's `Scorer.batch_records` (and through it the Ray
//! recipe, `forkscore.ray`) runs on it.

use super::item::RawLine;
use super::prepare::Preparer;
use super::prepare::StageError;
use super::schema_cache::SchemaCache;
use super::score::Scorer;
use super::BatchMode;
use crate::bounds::{check_flags, max_line_bytes, FlagRangeError, LEADING_BYTES};
use crate::provenance::{BatchProvenance, ModelProvenance};
use forkscore_backends::Backend;
use forkscore_engine::{Engine, EngineError, GroupBudget, Schema, ScoreOptions};
use std::collections::HashSet;
use std::path::Path;

/// What an in-memory batch is scored with (the in-memory half of the CLI's batch `Job`).
#[derive(Debug, Clone)]
pub struct LinesJob<'a> {
    /// `grouped`, `direct` or `serial`; `shared` needs a job-wide context and is refused.
    pub batch_mode: BatchMode,
    pub options: &'a ScoreOptions,
    pub budget: GroupBudget,
    /// The schema of lines that bring none (`--schema-file`).
    pub default_schema: Option<&'a Schema>,
    /// The folder a line's relative `schema_file` is read from (the input file's folder in
    /// `forkscore batch`).
    pub base_dir: &'a Path,
}

/// Why a whole in-memory batch could not run (one line's problem is its error record instead).
#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    #[error("batch mode `shared` needs a job-wide context; in-memory batches are grouped, direct or serial")]
    SharedMode,
    #[error(transparent)]
    Flag(#[from] FlagRangeError),
    #[error(transparent)]
    Options(#[from] EngineError),
    #[error("cannot serialize the batch provenance: {0}")]
    Provenance(#[from] serde_json::Error),
    #[error(transparent)]
    Stage(#[from] StageError),
}

/// Score `lines` (1-based line number, the line's bytes without its newline) and return the
/// output records, in the order of `lines`. Blank lines are skipped, as in a file; ids must be
/// unique within `lines` (a repeat is a `duplicate_id` error record).
pub fn score_lines<B: Backend>(
    engine: &Engine<B>,
    model: &ModelProvenance,
    job: &LinesJob<'_>,
    lines: Vec<(u64, Vec<u8>)>,
) -> Result<Vec<String>, LinesError> {
    if job.batch_mode == BatchMode::Shared {
        return Err(LinesError::SharedMode);
    }
    check_flags(&[
        ("--max-input-tokens", Some(job.options.max_input_tokens)),
        ("--field-batch-size", job.options.field_batch_size),
    ])?;
    let temperature = engine.check_request(job.options)?;
    let provenance = BatchProvenance {
        model,
        mode: job.options.mode,
        batch_mode: job.batch_mode,
        temperature: temperature.value,
        temperature_source: &temperature.source,
        default_schema_hash: job.default_schema.map(|s| s.hash()),
        shard: None,
        layout: job.options.layout,
        literal_value: job.options.literal_value,
    }
    .record()?;
    let max_bytes = max_line_bytes(job.options.max_input_tokens);
    let raw: Vec<RawLine> = lines
        .into_iter()
        .filter_map(|(line, mut bytes)| {
            while matches!(bytes.last(), Some(b'\n' | b'\r')) {
                bytes.pop();
            }
            let too_long = (bytes.len() as u64 > max_bytes).then_some(bytes.len() as u64);
            if too_long.is_some() {
                bytes.truncate(LEADING_BYTES);
            } else if bytes.iter().all(u8::is_ascii_whitespace) {
                return None;
            }
            Some(RawLine {
                line,
                bytes,
                done: false,
                too_long,
            })
        })
        .collect();
    let schemas = SchemaCache::new(engine, job.default_schema, job.base_dir);
    let mut preparer = Preparer {
        engine,
        schemas: &schemas,
        options: job.options,
        shared_context: None,
        format: super::openai::LineFormat::Native,
        seen_ids: HashSet::new(),
        resume: None,
        shard: None,
        owned: 0,
    };
    let items = preparer.prepare_chunk(raw)?;
    let mut scorer = Scorer::new(
        engine,
        job.options,
        &temperature,
        job.budget,
        job.batch_mode,
        &provenance,
    );
    let mut out = Vec::with_capacity(items.len());
    scorer.score_chunk(items, &mut |lines| {
        out.extend(lines.into_iter().map(|l| l.text));
        true
    });
    Ok(out)
}
