//! The CPU and accelerator stages of a batch job.
//!
//! - [`Preparer`] (CPU, rayon): a chunk of raw lines in; per line, a [`Ready`] (validated,
//!   schema compiled — once per distinct schema, cached by schema hash — prompt rendered, split
//!   and tokenized) or a [`Failed`] out, in line order. Duplicate ids are found here, in order,
//!   so the first occurrence wins.
//! - [`Scorer`] (one thread, owns the backend's work): a chunk of items in; output lines out, in
//!   line order, handed to `emit` as soon as each group finishes (so the writer can flush per
//!   group). Per [`BatchMode`]: `grouped` plans bounded groups per schema within the chunk and
//!   runs each through `Engine::decide_group` (N prefills + one slot-merged pass); `direct` runs
//!   every line alone; `serial` answers consecutive lines with the same schema and context from
//!   one prefill and scoring pass; `shared` (one job-wide context) answers every line whose
//!   schema was already scored from that result.

use super::reader::RawLine;
use super::records::{
    decision_record, error_record, question_schema, ErrorKind, Failed, LineError,
    Request, SchemaRef,
};
use super::BatchMode;
use forkscore_backends::Backend;
use forkscore_engine::group::GroupItem;
use forkscore_engine::{
    CompiledSchema, ContextGroup, Decision, Engine, GroupBudget, GroupPlanner, PreparedContext,
    Schema, ScoreOptions, Temperature,
};
use rayon::prelude::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Distinct schemas kept compiled at once (the cache is cleared when it grows past this).
const SCHEMA_CACHE_ENTRIES: usize = 4_096;

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

/// One output line, serialized.
#[derive(Debug, Clone)]
pub struct OutLine {
    pub line: u64,
    pub text: String,
    pub is_error: bool,
    /// Rows scored for it (0 for errors and reused decisions).
    pub rows: usize,
}

/// Compiled schemas by schema hash, and schema files by path.
pub struct SchemaCache {
    default: Option<Result<Arc<CompiledSchema>, LineError>>,
    base_dir: PathBuf,
    compiled: Mutex<HashMap<String, Result<Arc<CompiledSchema>, LineError>>>,
    files: Mutex<HashMap<PathBuf, Result<Schema, LineError>>>,
}

impl SchemaCache {
    pub fn new<B: Backend>(
        engine: &Engine<B>,
        default: Option<&Schema>,
        base_dir: &Path,
    ) -> SchemaCache {
        SchemaCache {
            default: default.map(|s| {
                engine
                    .compile(s)
                    .map(Arc::new)
                    .map_err(|e| LineError::from_engine(&e))
            }),
            base_dir: base_dir.to_path_buf(),
            compiled: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
        }
    }

    fn compile<B: Backend>(
        &self,
        engine: &Engine<B>,
        schema: &Schema,
    ) -> Result<Arc<CompiledSchema>, LineError> {
        let hash = schema.hash();
        if let Some(hit) = self
            .compiled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
        {
            return hit.clone();
        }
        let made = engine
            .compile(schema)
            .map(Arc::new)
            .map_err(|e| LineError::from_engine(&e));
        let mut map = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= SCHEMA_CACHE_ENTRIES {
            map.clear();
        }
        map.entry(hash).or_insert(made).clone()
    }

    fn file(&self, path: &Path) -> Result<Schema, LineError> {
        let full = self.base_dir.join(path);
        if let Some(hit) = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&full)
        {
            return hit.clone();
        }
        let loaded = std::fs::read_to_string(&full)
            .map_err(|e| {
                LineError::new(
                    ErrorKind::SchemaFile,
                    format!("cannot read schema file {}: {e}", full.display()),
                )
            })
            .and_then(|text| {
                Schema::from_json_str(&text).map_err(|e| {
                    LineError::new(
                        ErrorKind::InvalidSchema,
                        format!("invalid schema file {}: {e}", full.display()),
                    )
                })
            });
        let mut map = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= SCHEMA_CACHE_ENTRIES {
            map.clear();
        }
        map.entry(full).or_insert(loaded).clone()
    }

    /// The compiled schema a line asks for.
    pub fn resolve<B: Backend>(
        &self,
        engine: &Engine<B>,
        r: &SchemaRef,
    ) -> Result<Arc<CompiledSchema>, LineError> {
        let invalid = |e: forkscore_engine::SchemaError| {
            LineError::new(ErrorKind::InvalidSchema, format!("invalid schema: {e}"))
        };
        match r {
            SchemaRef::Default => self.default.clone().unwrap_or_else(|| {
                Err(LineError::new(
                    ErrorKind::MissingSchema,
                    "line has no \"schema\", \"schema_file\" or \"question\" and the job has no default --schema-file",
                ))
            }),
            SchemaRef::Inline(v) => self.compile(engine, &Schema::from_value(v).map_err(invalid)?),
            SchemaRef::Question(q) => self.compile(engine, &Schema::from_value(&question_schema(q)).map_err(invalid)?),
            SchemaRef::File(p) => self.compile(engine, &self.file(p)?),
        }
    }
}

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

/// The CPU stage.
pub struct Preparer<'a, B: Backend> {
    pub engine: &'a Engine<B>,
    pub schemas: &'a SchemaCache,
    pub options: &'a ScoreOptions,
    pub shared_context: Option<&'a str>,
    pub seen_ids: HashSet<u128>,
    pub resume: Option<ResumeCheck>,
}

fn id_key(id: &Value) -> u128 {
    let d = Sha256::digest(id.to_string().as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    u128::from_le_bytes(b)
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
            .map(|raw| (raw.done, crate::input_bounds::parse_bounded(raw, shared)))
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
        match self
            .engine
            .prepare(context, &compiled, self.options.max_input_tokens)
        {
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

/// Builds the provenance object of each record.
pub struct ProvenanceBase {
    pub base: serde_json::Map<String, Value>,
}

impl ProvenanceBase {
    pub fn with_schema(&self, schema_hash: Option<&str>) -> Value {
        let mut m = self.base.clone();
        m.insert(
            "schema_hash".into(),
            schema_hash.map_or(Value::Null, |h| Value::String(h.into())),
        );
        Value::Object(m)
    }
}

/// The accelerator stage.
pub struct Scorer<'a, B: Backend> {
    pub engine: &'a Engine<B>,
    pub options: &'a ScoreOptions,
    pub temperature: &'a Temperature,
    pub budget: GroupBudget,
    pub mode: BatchMode,
    pub provenance: &'a ProvenanceBase,
    /// serial: the last decision, keyed by (schema hash, context hash); shared: by schema hash.
    reuse: HashMap<(String, u64), (u64, Decision)>,
    /// serial / shared: the retained state of the token prefix that lines with the same
    /// context share whatever their schema (context hash, its ids, its state).
    base: Option<(u64, Vec<u32>, B::State)>,
}

/// Shortest shared prefix worth a separate prefill.
const MIN_SHARED_PREFIX: usize = 16;

impl<'a, B: Backend> Scorer<'a, B> {
    pub fn new(
        engine: &'a Engine<B>,
        options: &'a ScoreOptions,
        temperature: &'a Temperature,
        budget: GroupBudget,
        mode: BatchMode,
        provenance: &'a ProvenanceBase,
    ) -> Self {
        Scorer {
            engine,
            options,
            temperature,
            budget,
            mode,
            provenance,
            reuse: HashMap::new(),
            base: None,
        }
    }

    fn failed(&self, f: &Failed, schema_hash: Option<&str>) -> OutLine {
        OutLine {
            line: f.line,
            text: error_record(f, self.provenance.with_schema(schema_hash)),
            is_error: true,
            rows: 0,
        }
    }

    fn decided(
        &self,
        r: &Ready,
        d: Result<Decision, forkscore_engine::EngineError>,
        reused_from: Option<u64>,
    ) -> OutLine {
        let hash = r.compiled.schema_hash();
        match d {
            Ok(d) => OutLine {
                line: r.line,
                text: decision_record(
                    &r.id,
                    r.line,
                    &d,
                    self.provenance.with_schema(Some(hash)),
                    reused_from.map(|l| ("reused_from_line", Value::from(l))),
                ),
                is_error: false,
                rows: if reused_from.is_some() {
                    0
                } else {
                    r.compiled.fields().len()
                },
            },
            Err(e) => {
                let f = Failed {
                    line: r.line,
                    id: Some(r.id.clone()),
                    error: LineError::from_engine(&e),
                };
                self.failed(&f, Some(hash))
            }
        }
    }

    /// Score one chunk; `emit` receives output lines in line order (false = stop).
    pub fn score_chunk(
        &mut self,
        items: Vec<Item>,
        emit: &mut dyn FnMut(Vec<OutLine>) -> bool,
    ) -> bool {
        let mut slots: Vec<Option<OutLine>> = items
            .iter()
            .map(|it| match it {
                Item::Failed(f) => Some(self.failed(f, None)),
                Item::Ready(_) => None,
            })
            .collect();
        let mut emitted = 0usize;
        let mut flush = |slots: &mut Vec<Option<OutLine>>, emitted: &mut usize| -> bool {
            let mut out = Vec::new();
            while *emitted < slots.len() {
                match slots[*emitted].take() {
                    Some(o) => out.push(o),
                    None => break,
                }
                *emitted += 1;
            }
            out.is_empty() || emit(out)
        };
        for run in self.plan(&items) {
            let start = Instant::now();
            let members: Vec<&Ready> = run
                .members()
                .iter()
                .filter_map(|&i| ready(&items[i]))
                .collect();
            let Some(first) = members.first() else {
                continue;
            };
            match self.mode {
                BatchMode::Serial | BatchMode::Shared => {
                    let key = (
                        first.compiled.schema_hash().to_string(),
                        if self.mode == BatchMode::Serial {
                            first.context_hash
                        } else {
                            0
                        },
                    );
                    let out = match self.reuse.get(&key) {
                        Some((line, d)) => self.decided(first, Ok(d.clone()), Some(*line)),
                        None => {
                            self.refresh_base(first, key.1, &items);
                            let d = match &self.base {
                                Some((_, ids, state)) => self.engine.decide_from(
                                    Some((ids.as_slice(), state)),
                                    &first.compiled,
                                    &first.prepared,
                                    self.options,
                                    self.temperature,
                                ),
                                None => self
                                    .decide(&run, &members, start)
                                    .pop()
                                    .unwrap_or_else(unreachable_group),
                            };
                            if let Ok(d) = &d {
                                if self.mode == BatchMode::Serial || self.reuse.len() >= 4_096 {
                                    self.reuse.clear();
                                }
                                self.reuse.insert(key, (first.line, d.clone()));
                            }
                            self.decided(first, d, None)
                        }
                    };
                    slots[run.members()[0]] = Some(out);
                }
                BatchMode::Grouped | BatchMode::Direct => {
                    let decided = self.decide(&run, &members, start);
                    for ((&i, r), d) in run.members().iter().zip(&members).zip(decided) {
                        slots[i] = Some(self.decided(r, d, None));
                    }
                }
            }
            if !flush(&mut slots, &mut emitted) {
                return false;
            }
        }
        flush(&mut slots, &mut emitted)
    }

    fn decide(
        &self,
        group: &ContextGroup,
        members: &[&Ready],
        start: Instant,
    ) -> Vec<Result<Decision, forkscore_engine::EngineError>> {
        let prepared: Vec<&PreparedContext> = members.iter().map(|r| &r.prepared).collect();
        self.engine.decide_group(
            &members[0].compiled,
            group,
            &prepared,
            self.options,
            self.temperature,
            start,
        )
    }

    /// The runs of this chunk, ordered by their first line: bounded groups per schema
    /// (grouped) or one run per line (every other mode).
    /// Keep (or build) the retained state of the prefix that `first` shares with the other
    /// lines of its context (`ctx`): the longest common token prefix of their prompts, less
    /// one token so every line still extends it. Serial: the lines of the same context in this
    /// chunk; shared: every line. Without a second line (or a long enough common prefix) there
    /// is nothing to share and no base is kept.
    fn refresh_base(&mut self, first: &Ready, ctx: u64, items: &[Item]) {
        let ids = &first.prepared.split.prefix_ids;
        if let Some((h, b, _)) = &self.base {
            if *h == ctx && ids.len() > b.len() && ids.starts_with(b) {
                return;
            }
        }
        self.base = None;
        let mut common = ids.len();
        let mut others = 0;
        for r in items.iter().filter_map(ready) {
            if r.line == first.line || (self.mode == BatchMode::Serial && r.context_hash != ctx) {
                continue;
            }
            let other = &r.prepared.split.prefix_ids;
            let lcp = ids.iter().zip(other).take_while(|(a, b)| a == b).count();
            common = common.min(lcp).min(other.len().saturating_sub(1));
            others += 1;
        }
        common = common.min(ids.len().saturating_sub(1));
        if others == 0 || common < MIN_SHARED_PREFIX {
            return;
        }
        let base_ids = ids[..common].to_vec();
        // A failed prefill only means no sharing: each line then prefills on its own.
        if let Ok(state) = self.engine.backend().prefill(&base_ids) {
            self.base = Some((ctx, base_ids, state));
        }
    }

    fn plan(&self, items: &[Item]) -> Vec<ContextGroup> {
        let model = self.engine.memory_model();
        let grouped = self.mode == BatchMode::Grouped;
        let mut planners: Vec<(String, GroupPlanner)> = Vec::new();
        let mut runs: Vec<ContextGroup> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let Some(r) = ready(item) else { continue };
            let gi = GroupItem::of(i, &r.prepared.split);
            if !grouped {
                let mut p = GroupPlanner::new(
                    GroupBudget {
                        max_prefix_tokens: 0,
                        max_rows: 0,
                        max_state_bytes: 0,
                    },
                    model,
                );
                runs.extend(p.push(gi));
                runs.extend(p.flush());
                continue;
            }
            let hash = r.compiled.schema_hash();
            let pos = match planners.iter().position(|(h, _)| h == hash) {
                Some(p) => p,
                None => {
                    planners.push((hash.to_string(), GroupPlanner::new(self.budget, model)));
                    planners.len() - 1
                }
            };
            runs.extend(planners[pos].1.push(gi));
        }
        runs.extend(planners.iter_mut().filter_map(|(_, p)| p.flush()));
        runs.sort_by_key(|g| g.members()[0]);
        runs
    }
}

fn ready(item: &Item) -> Option<&Ready> {
    match item {
        Item::Ready(r) => Some(r),
        Item::Failed(_) => None,
    }
}

fn unreachable_group() -> Result<Decision, forkscore_engine::EngineError> {
    unreachable!("decide_group returns one result per member and the run has one member")
}
