//! The accelerator stage of a batch job (one thread, owns the backend's work): a chunk of
//! prepared items in; output lines out, in line order, handed to `emit` as soon as each group
//! finishes (so the writer can flush per group). All scoring goes through the engine.
//!
//! Per [`BatchMode`]: `grouped` plans bounded groups per schema within the chunk and runs each
//! through `Engine::decide_group` (N prefills + one slot-merged pass); `direct` runs every line
//! alone (a group of one); `serial` and `shared` reuse decisions and a shared prefix state
//! ([`super::reuse`]).

use super::openai::LineFormat;
use super::prepare::{ready, Item, OutLine, Ready};
use super::records::{decision_value, error_value, Failed, LineError};
use super::reuse::Reuse;
use super::BatchMode;
use crate::provenance::RecordProvenance;
use forkscore_backends::Backend;
use forkscore_engine::group::GroupItem;
use forkscore_engine::{
    ContextGroup, Decision, Engine, EngineError, GroupBudget, GroupPlanner, ScoreOptions,
    Temperature,
};
use serde_json::Value;
use std::time::Instant;

/// The accelerator stage.
pub struct Scorer<'a, B: Backend> {
    pub engine: &'a Engine<B>,
    pub options: &'a ScoreOptions,
    pub temperature: &'a Temperature,
    pub budget: GroupBudget,
    pub mode: BatchMode,
    pub provenance: &'a RecordProvenance,
    /// serial / shared: decisions and the shared prefix state lines reuse.
    reuse: Reuse<B::State>,
    /// The output line format ([`Scorer::with_format`]).
    format: LineFormat,
    /// The Unix time OpenAI-shaped completions are stamped with (one per job).
    created: u64,
}

impl<'a, B: Backend> Scorer<'a, B> {
    pub fn new(
        engine: &'a Engine<B>,
        options: &'a ScoreOptions,
        temperature: &'a Temperature,
        budget: GroupBudget,
        mode: BatchMode,
        provenance: &'a RecordProvenance,
    ) -> Self {
        Scorer {
            engine,
            options,
            temperature,
            budget,
            mode,
            provenance,
            reuse: Reuse::new(mode),
            format: LineFormat::Native,
            created: 0,
        }
    }

    /// Write output lines in `format` (native records by default).
    pub fn with_format(mut self, format: LineFormat) -> Self {
        self.format = format;
        self.created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self
    }

    /// A native record as an output line of the job's format.
    fn text(&self, record: Value) -> String {
        match self.format {
            LineFormat::Native => record.to_string(),
            LineFormat::Openai => super::openai::output_line(record, self.created).to_string(),
        }
    }

    fn failed(&self, f: &Failed, schema_hash: Option<&str>) -> OutLine {
        OutLine {
            line: f.line,
            text: self.text(error_value(f, self.provenance.with_schema(schema_hash))),
            error_kind: Some(f.error.kind),
            rows: 0,
            allowed_masses: Vec::new(),
        }
    }

    fn decided(
        &self,
        r: &Ready,
        d: Result<Decision, EngineError>,
        reused_from: Option<u64>,
    ) -> OutLine {
        let hash = r.compiled.schema_hash();
        match d {
            Ok(d) => OutLine {
                line: r.line,
                text: self.text(decision_value(
                    &r.id,
                    r.line,
                    &d,
                    self.provenance.with_schema(Some(hash)),
                    reused_from.map(|l| ("reused_from_line", Value::from(l))),
                )),
                error_kind: None,
                rows: if reused_from.is_some() {
                    0
                } else {
                    r.compiled.fields().len()
                },
                allowed_masses: if reused_from.is_some() {
                    Vec::new()
                } else {
                    d.fields
                        .values()
                        .filter_map(|f| f.allowed_mass.as_ref().map(|a| a.mass))
                        .collect()
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
                    let out = self.decide_reusing(&run, first, &items, start);
                    slots[run.members()[0]] = Some(out);
                }
                BatchMode::Grouped | BatchMode::Direct => {
                    let decided = self.decide(&run, &items, start);
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

    /// serial / shared: reuse an earlier decision of the same key, else decide `first` (the
    /// only member of `run`), extending the shared prefix state when one is kept.
    fn decide_reusing(
        &mut self,
        run: &ContextGroup,
        first: &Ready,
        items: &[Item],
        start: Instant,
    ) -> OutLine {
        let key = self.reuse.key(first);
        if let Some((line, d)) = self.reuse.lookup(&key) {
            return self.decided(first, Ok(d.clone()), Some(line));
        }
        self.reuse.refresh_shared(self.engine, first, key.1, items);
        let d = match self.reuse.shared() {
            Some(shared) => self.engine.decide_prepared(
                Some(shared),
                &first.compiled,
                &first.prepared,
                self.options,
                self.temperature,
            ),
            None => self
                .decide(run, items, start)
                .into_iter()
                .next()
                .unwrap_or(Err(EngineError::MissingMember {
                    index: run.members()[0],
                })),
        };
        if let Ok(d) = &d {
            self.reuse.remember(key, first.line, d);
        }
        self.decided(first, d, None)
    }

    /// Decide the members of `group` (indices into `items`) through the engine.
    fn decide(
        &self,
        group: &ContextGroup,
        items: &[Item],
        start: Instant,
    ) -> Vec<Result<Decision, EngineError>> {
        let Some(first) = group.members().first().and_then(|&i| ready(&items[i])) else {
            return Vec::new();
        };
        self.engine.decide_group(
            &first.compiled,
            group,
            |i| ready(&items[i]).map(|r| &r.prepared),
            self.options,
            self.temperature,
            start,
        )
    }

    /// The runs of this chunk, ordered by their first line: bounded groups per schema
    /// (grouped) or one run per line (every other mode).
    fn plan(&self, items: &[Item]) -> Vec<ContextGroup> {
        let model = self.engine.memory_model();
        let grouped = self.mode == BatchMode::Grouped;
        let mut planners: Vec<(String, GroupPlanner)> = Vec::new();
        let mut runs: Vec<ContextGroup> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let Some(r) = ready(item) else { continue };
            let gi = GroupItem::of(i, r.prepared.split());
            if !grouped {
                runs.push(ContextGroup::single(gi, &model));
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
