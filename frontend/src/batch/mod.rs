//! The core of a batch job that every front end shares: lines in, output records out, with no
//! files, threads or flags (those are the CLI's `forkscore batch`, in the pipeline crate).
//!
//! Module map, by job: [`item`] (raw lines, validated lines, failed lines), [`records`] (the
//! native line format and its records), [`openai`] (OpenAI Batch API lines in, batch output
//! lines out), [`shard`] (`--shard INDEX/COUNT`), [`schema_cache`] (each distinct schema
//! compiled once), [`prepare`] (the CPU stage: parse, ids, schemas, prompts), [`score`] (the
//! accelerator stage), [`reuse`] (serial / shared reuse of decisions and prefix states),
//! [`lines`] (a whole batch over lines held in memory: the Python package's `batch_records`).

pub mod item;
pub mod lines;
pub mod openai;
pub mod prepare;
pub mod records;
pub mod reuse;
pub mod schema_cache;
pub mod score;
pub mod shard;

/// How lines are batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchMode {
    /// Contexts that share a schema go through bounded groups: N prefills + one scoring pass.
    Grouped,
    /// Every line on its own (one prefill + one scoring pass per line).
    Direct,
    /// Consecutive lines with the same context and schema share one prefill and scoring pass.
    Serial,
    /// One job-wide context (--context/--context-file); each line brings its schema or question.
    Shared,
}
