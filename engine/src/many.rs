//! Many contexts, one schema: `Engine::decide_many` and the per-group step batch jobs drive.
//!
//! In: contexts (any number, input order), one compiled schema, options and a [`GroupBudget`].
//! Out: one `Result<Decision, EngineError>` per context, in input order.
//!
//! Flow: render + split + tokenize every context in parallel (rayon, through
//! [`Engine::prepare`]) → bounded groups ([`plan_groups`]) over the contexts that prepared →
//! per group, N prefills then ONE slot-merged scoring pass over all N × R rows
//! (`fork::score_group` with the request's mode; `field_batch_size` still splits that pass) →
//! assemble each decision and attach its group telemetry.
//!
//! Invariants:
//! - decisions equal separate [`Engine::decide`] calls (bit-identical on deterministic backends;
//!   within f32 summation order on real ones): rows, prompts and candidates are the same,
//!   only the batching differs; a backend whose `contexts_alone` is true gets each member in
//!   calls of its own, so there they are bit-identical by construction;
//! - a context that fails to prepare (empty, over the token limit) yields an `Err` entry for
//!   that context only; a group whose backend call fails is retried member by member, so one
//!   failing context never takes its group down with it;
//! - for a grouped decision, the call counts, `state_bytes` and prefill/score timings in its
//!   telemetry are those of its whole group, and `telemetry.group` says the group's size.

use crate::assemble::{Assembly, Decision};
use crate::calibration::Temperature;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::fork::{GroupScores, SharedPrefix};
use crate::group::{
    plan_groups, ContextGroup, GroupBudget, GroupItem, GroupTelemetry, MemoryModel,
};
use crate::options::ScoreOptions;
use crate::prepare::PreparedContext;
use crate::rows::CompiledSchema;
use forkscore_seam::Backend;
use rayon::prelude::*;
use std::time::Instant;

impl<B: Backend> Engine<B> {
    /// The memory model of this engine's backend (for sizing groups).
    pub fn memory_model(&self) -> MemoryModel {
        MemoryModel::from_facts(self.backend().facts())
    }

    /// Decide every context against `compiled`, in bounded groups. Results are in input order;
    /// an empty input gives an empty output.
    pub fn decide_many<S: AsRef<str> + Sync>(
        &self,
        contexts: &[S],
        compiled: &CompiledSchema,
        opts: &ScoreOptions,
        budget: &GroupBudget,
    ) -> Vec<Result<Decision, EngineError>> {
        self.decide_many_observed(contexts, compiled, opts, budget, |_, _| {})
    }

    /// [`Engine::decide_many`], calling `progress(done, total)` as contexts finish: once after
    /// preparation (`done` = the contexts that failed to prepare) and after each group. The
    /// groups are those `decide_many` plans, so the decisions are the same; only the caller
    /// learns how far the call is (a progress bar over a long call).
    pub fn decide_many_observed<S: AsRef<str> + Sync>(
        &self,
        contexts: &[S],
        compiled: &CompiledSchema,
        opts: &ScoreOptions,
        budget: &GroupBudget,
        mut progress: impl FnMut(usize, usize),
    ) -> Vec<Result<Decision, EngineError>> {
        let start = Instant::now();
        if contexts.is_empty() {
            return Vec::new();
        }
        let temperature = match self.check_request(opts) {
            Ok(t) => t,
            Err(e) => {
                let mut out: Vec<Result<Decision, EngineError>> = (1..contexts.len())
                    .map(|_| Err(repeat_option_error(&e)))
                    .collect();
                out.insert(0, Err(e));
                return out;
            }
        };
        let prepared: Vec<Result<PreparedContext, EngineError>> = contexts
            .par_iter()
            .map(|c| self.prepare_in(c.as_ref(), compiled, opts.max_input_tokens, opts.layout))
            .collect();
        let items = prepared
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().ok().map(|p| GroupItem::of(i, p.split())));
        let groups = plan_groups(items, budget, &self.memory_model());

        let mut slots: Vec<Option<Result<Decision, EngineError>>> =
            Vec::with_capacity(contexts.len());
        let mut ready: Vec<Option<PreparedContext>> = Vec::with_capacity(contexts.len());
        for p in prepared {
            match p {
                Ok(p) => {
                    slots.push(None);
                    ready.push(Some(p));
                }
                Err(e) => {
                    slots.push(Some(Err(e)));
                    ready.push(None);
                }
            }
        }
        let total = contexts.len();
        let mut done = slots.iter().filter(|s| s.is_some()).count();
        progress(done, total);
        for group in &groups {
            let decided = self.decide_group(
                compiled,
                group,
                |i| ready[i].as_ref(),
                opts,
                &temperature,
                start,
            );
            for (&i, d) in group.members().iter().zip(decided) {
                slots[i] = Some(d);
            }
            done += group.len();
            progress(done, total);
        }
        slots
            .into_iter()
            .map(|s| s.expect("plan_groups puts every prepared context in exactly one group"))
            .collect()
    }

    /// Stages 4–6 for one group: prefill each member, score all rows in one slot-merged pass
    /// (per `opts.mode`), assemble each decision. `prepared(i)` is the prepared context of the
    /// group member with index `i` (the index the group was planned with). Results are in member
    /// order, one per member. `start` is when the decisions' `timings_ms.total` starts counting.
    pub fn decide_group<'p>(
        &self,
        compiled: &CompiledSchema,
        group: &ContextGroup,
        prepared: impl Fn(usize) -> Option<&'p PreparedContext>,
        opts: &ScoreOptions,
        temperature: &Temperature,
        start: Instant,
    ) -> Vec<Result<Decision, EngineError>> {
        let mut members: Vec<&PreparedContext> = Vec::with_capacity(group.len());
        for &index in group.members() {
            match prepared(index) {
                Some(p) => members.push(p),
                None => {
                    return group
                        .members()
                        .iter()
                        .map(|_| Err(EngineError::MissingMember { index }))
                        .collect()
                }
            }
        }
        let cost = group.cost();
        let tel = |slot: usize| GroupTelemetry {
            size: members.len(),
            slot,
            rows: cost.rows,
            prefix_tokens: cost.prefix_tokens,
            estimated_bytes: cost.estimated_bytes,
        };
        // A backend that keeps contexts apart (`Backend::contexts_alone`) gets each member in
        // calls of its own: the same calls `decide` makes for it.
        // the prompt head every member starts with, prefilled once per process (`head`)
        let head = self.group_head(compiled, opts);
        let head = head.as_deref();
        let decided = if self.backend().contexts_alone() {
            self.decide_each(head, compiled, &members, opts, temperature, start)
        } else {
            self.decide_members(head, compiled, &members, opts, temperature, start)
        };
        decided
            .into_iter()
            .enumerate()
            .map(|(slot, d)| {
                d.map(|mut d| {
                    d.telemetry.group = Some(tel(slot));
                    d
                })
            })
            .collect()
    }

    /// Prefill + score + assemble `members` together; on a backend error, each member alone.
    fn decide_members(
        &self,
        head: Option<&SharedPrefix<B::State>>,
        compiled: &CompiledSchema,
        members: &[&PreparedContext],
        opts: &ScoreOptions,
        temperature: &Temperature,
        start: Instant,
    ) -> Vec<Result<Decision, EngineError>> {
        match self.fork(head, compiled, members, opts) {
            Ok(GroupScores {
                logits,
                vocab,
                literal,
                stats,
            }) => logits
                .into_iter()
                .zip(vocab)
                .zip(literal)
                .zip(members)
                .map(|(((rows, vocab), literal), &prepared)| {
                    crate::finite::check_rows(compiled, &rows)?;
                    crate::finite::check_literal(compiled, &literal)?;
                    Ok(Assembly {
                        compiled,
                        prepared,
                        rows,
                        literal,
                        vocab,
                        tokenizer: self.tokenizer(),
                        stats: &stats,
                        temperature: temperature.clone(),
                        opts,
                        start,
                    }
                    .decision()?)
                })
                .collect(),
            Err(e) if members.len() == 1 => vec![Err(e)],
            Err(_) => self.decide_each(head, compiled, members, opts, temperature, start),
        }
    }

    /// [`Self::decide_members`] for each member alone, in member order.
    fn decide_each(
        &self,
        head: Option<&SharedPrefix<B::State>>,
        compiled: &CompiledSchema,
        members: &[&PreparedContext],
        opts: &ScoreOptions,
        temperature: &Temperature,
        start: Instant,
    ) -> Vec<Result<Decision, EngineError>> {
        members
            .iter()
            .flat_map(|p| {
                self.decide_members(
                    head,
                    compiled,
                    std::slice::from_ref(p),
                    opts,
                    temperature,
                    start,
                )
            })
            .collect()
    }
}

/// The same option error for every entry (engine errors are not `Clone`; `check_request` only
/// returns a calibration error, `TopKTooLarge` or `ZeroFieldBatch`).
fn repeat_option_error(e: &EngineError) -> EngineError {
    match e {
        EngineError::Calibration(c) => EngineError::Calibration(c.clone()),
        EngineError::TopKTooLarge { top_k, max } => EngineError::TopKTooLarge {
            top_k: *top_k,
            max: *max,
        },
        _ => EngineError::ZeroFieldBatch,
    }
}
