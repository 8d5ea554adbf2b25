//! The CPU stage of a batch job: a chunk of raw lines in; per line, a [`Ready`] (validated,
//! schema compiled through the [`SchemaCache`], prompt rendered, split and tokenized) or a
//! [`Failed`] out, in line order. Duplicate ids are found here, in order, so the first
//! occurrence wins; a resumed job's last output line is checked against the input here
//! ([`ResumeCheck`]).

use super::item::{ErrorKind, Failed, LineError, RawLine, Request};
use super::records::parse_bounded;
use super::schema_cache::SchemaCache;
use super::shard::{id_key, Shard};
use forkscore_backends::Backend;
use forkscore_engine::{CompiledSchema, Engine, PreparedContext, ScoreOptions};
use rayon::prelude::*;
use serde_json::Value;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Where a resumed job stopped (checked against the input).
#[derive(Debug, Clone)]
pub struct ResumeCheck {
    pub last_line: u64,
    pub last_id: Value,
    pub seen: bool,
}

/// Errors that stop the whole job (not one line).
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("--resume: the output's last record is line {line} with id {output_id}, but input line {line} has id {input_id}; the output belongs to another input")]
    ResumeMismatch {
        line: u64,
        output_id: String,
        input_id: String,
    },
    #[error("--resume: the output ends at input line {line} but the input has no record on that line; the output belongs to another input")]
    ResumeLineMissing { line: u64 },
}

/// A line ready for the accelerator.
pub struct Ready {
    pub line: u64,
    pub id: Value,
    pub compiled: Arc<CompiledSchema>,
    pub prepared: PreparedContext,
    /// Hash of the context text (serial reuse compares it).
    pub context_hash: u64,
}

/// A line after the CPU stage.
pub enum Item {
    Ready(Box<Ready>),
    Failed(Failed),
}

/// The line's ready item, if it prepared.
pub fn ready(item: &Item) -> Option<&Ready> {
    match item {
        Item::Ready(r) => Some(r),
        Item::Failed(_) => None,
    }
}

/// One output line, serialized.
#[derive(Debug, Clone)]
pub struct OutLine {
    pub line: u64,
    pub text: String,
    /// The error record's kind (`None` for a decision).
    pub error_kind: Option<ErrorKind>,
    /// Rows scored for it (0 for errors and reused decisions).
    pub rows: usize,
    /// The allowed mass of each field scored for it (only with `--allowed-mass`; empty for
    /// errors and reused decisions), for the job's summary.
    pub allowed_masses: Vec<f64>,
}

impl OutLine {
    pub fn is_error(&self) -> bool {
        self.error_kind.is_some()
    }
}

/// The CPU stage.
pub struct Preparer<'a, B: Backend> {
    pub engine: &'a Engine<B>,
    pub schemas: &'a SchemaCache,
    pub options: &'a ScoreOptions,
    pub shared_context: Option<&'a str>,
    /// How lines are read (native or OpenAI Batch API).
    pub format: super::openai::LineFormat,
    pub seen_ids: HashSet<u128>,
    pub resume: Option<ResumeCheck>,
    /// `--shard`: lines other shards own are skipped (after the resume check).
    pub shard: Option<Shard>,
    /// Lines this job owns so far (all non-blank lines without `--shard`), already done ones
    /// included: a finished job's output must hold exactly this many records.
    pub owned: u64,
}

fn context_hash(text: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl<B: Backend> Preparer<'_, B> {
    /// Parse, check ids, compile schemas and prepare prompts for one chunk.
    pub fn prepare_chunk(&mut self, chunk: Vec<RawLine>) -> Result<Vec<Item>, StageError> {
        let shared = self.shared_context.is_some();
        let parsed: Vec<(bool, Result<Request, Failed>)> = chunk
            .par_iter()
            .map(|raw| (raw.done, parse_bounded(raw, shared, self.format)))
            .collect();
        let mut todo: Vec<Result<Request, Failed>> = Vec::with_capacity(parsed.len());
        for (done, p) in parsed {
            let (line, id) = match &p {
                Ok(r) => (r.line, Some(&r.id)),
                Err(f) => (f.line, f.id.as_ref()),
            };
            if let Some(check) = &mut self.resume {
                if line == check.last_line {
                    check.seen = true;
                    let input_id = id.cloned().unwrap_or(Value::Null);
                    if input_id != check.last_id {
                        return Err(StageError::ResumeMismatch {
                            line,
                            output_id: check.last_id.to_string(),
                            input_id: input_id.to_string(),
                        });
                    }
                }
            }
            if self.shard.is_some_and(|s| !s.owns(line, id)) {
                continue;
            }
            self.owned += 1;
            let fresh = id.is_none_or(|id| self.seen_ids.insert(id_key(id)));
            if done {
                continue;
            }
            // The first line still to do comes after the output's last line: that line must
            // have been seen by now, before anything new is scored and appended.
            if let Some(check) = &self.resume {
                if !check.seen {
                    return Err(StageError::ResumeLineMissing {
                        line: check.last_line,
                    });
                }
            }
            todo.push(match (p, fresh) {
                (Ok(r), false) => Err(Failed {
                    line: r.line,
                    error: LineError::new(
                        ErrorKind::DuplicateId,
                        format!("id {} already appeared on an earlier line", r.id),
                    ),
                    id: Some(r.id),
                }),
                (p, _) => p,
            });
        }
        Ok(todo
            .into_par_iter()
            .map(|p| p.map_or_else(Item::Failed, |r| self.prepare_one(r)))
            .collect())
    }

    fn prepare_one(&self, r: Request) -> Item {
        let fail = |error: LineError| {
            Item::Failed(Failed {
                line: r.line,
                id: Some(r.id.clone()),
                error,
            })
        };
        let compiled = match self.schemas.resolve(self.engine, &r.schema) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let context = r
            .context
            .as_deref()
            .or(self.shared_context)
            .unwrap_or_default();
        match self.engine.prepare_in(
            context,
            &compiled,
            self.options.max_input_tokens,
            self.options.layout,
        ) {
            Ok(prepared) => Item::Ready(Box::new(Ready {
                line: r.line,
                context_hash: context_hash(context),
                id: r.id,
                compiled,
                prepared,
            })),
            Err(e) => fail(LineError::from_engine(&e)),
        }
    }
}
