//! Continuous batching on the model thread: requests join the next forward pass as soon as
//! there is room in its budget, instead of waiting for a whole merged call to finish.
//!
//! State: a FIFO of prepared contexts (each tagged with its request) and the requests still
//! waiting for some of their decisions. One step:
//! 1. take every request already queued (without waiting), check its options and take its
//!    prepared contexts — the handler prepared them (render, split, tokenize) on a blocking
//!    thread before queuing the job, so that this never holds the GPU idle between passes; a
//!    job queued without them is prepared here, in parallel — a context that fails to prepare
//!    is an error entry for itself only;
//! 2. the oldest prepared context names the bucket (schema hash + options); the contexts of that
//!    bucket, oldest first, are planned into groups under the [`GroupBudget`] (prefix tokens,
//!    rows, estimated bytes) and the FIRST group is decided: one packed prefill of its contexts
//!    and one scoring pass over all their rows ([`Engine::decide_group`]);
//! 3. every request whose contexts are all decided is answered.
//!
//! Why neither side starves: prefills and scoring passes are not separate queues — each step
//! runs one group's prefill and then its scoring pass, so a prefilled state never waits behind
//! other prefills; and steps always serve the oldest waiting context first, so a request is
//! decided after at most the groups formed ahead of it (a new arrival can only join a group
//! that starts after it arrived, never overtake an older context). A request whose requester
//! gave up (timeout, disconnect) is dropped before its contexts are scored.

use crate::job::Job;
use crate::metrics::Metrics;
use forkscore_engine::group::{plan_groups, GroupItem};
use forkscore_engine::{
    CompiledSchema, Decision, Engine, EngineError, GroupBudget, PreparedContext, ScoreOptions,
    Temperature,
};
use forkscore_seam::Backend;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::time::Instant;

/// A request being decided: its job and one slot per context.
struct Waiting {
    job: Job,
    temperature: Temperature,
    results: Vec<Option<Result<Decision, EngineError>>>,
}

impl Waiting {
    fn done(&self) -> bool {
        self.results.iter().all(Option::is_some)
    }
}

/// Prepare every context of a request (render, split, tokenize; in parallel), one entry per
/// context: what [`Scheduler::admit`] needs. The service's handlers call it before they queue a
/// job, on a blocking thread, so that preparing overlaps the model thread's passes instead of
/// holding the GPU idle between them.
pub fn prepare_contexts<B: Backend>(
    engine: &Engine<B>,
    contexts: &[String],
    compiled: &CompiledSchema,
    options: &ScoreOptions,
) -> Vec<Result<PreparedContext, EngineError>> {
    contexts
        .par_iter()
        .map(|c| engine.prepare_in(c, compiled, options.max_input_tokens, options.layout))
        .collect()
}

/// A prepared context waiting for its group: request id and context index in it.
struct Ready {
    request: u64,
    index: usize,
    prepared: PreparedContext,
}

/// The model thread's continuous-batching state.
pub struct Scheduler<'e, B: Backend> {
    engine: &'e Engine<B>,
    budget: GroupBudget,
    next_id: u64,
    waiting: Vec<(u64, Waiting)>,
    ready: VecDeque<Ready>,
}

impl<'e, B: Backend> Scheduler<'e, B> {
    pub fn new(engine: &'e Engine<B>, budget: GroupBudget) -> Self {
        Scheduler {
            engine,
            budget,
            next_id: 0,
            waiting: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    /// Contexts admitted and not yet decided.
    pub fn pending_contexts(&self) -> usize {
        self.ready.len()
    }

    /// Whether nothing is admitted.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Admit one request: check its options, prepare its contexts (in parallel). Requests whose
    /// options are refused, or whose every context fails to prepare, are answered at once.
    pub fn admit(&mut self, mut job: Job) {
        let engine = self.engine;
        let temperature = match engine.check_request(&job.options) {
            Ok(t) => t,
            Err(_) => {
                // the engine's own per-context error entries for refused options
                let out =
                    engine.decide_many(&job.contexts, &job.compiled, &job.options, &self.budget);
                let _ = job.reply.send(out);
                return;
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let prepared = match job.prepared.take() {
            Some(p) if p.len() == job.contexts.len() => p,
            _ => prepare_contexts(engine, &job.contexts, &job.compiled, &job.options),
        };
        let mut results = Vec::with_capacity(prepared.len());
        for (index, p) in prepared.into_iter().enumerate() {
            match p {
                Ok(prepared) => {
                    results.push(None);
                    self.ready.push_back(Ready {
                        request: id,
                        index,
                        prepared,
                    });
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        self.waiting.push((
            id,
            Waiting {
                job,
                temperature,
                results,
            },
        ));
        self.answer_finished();
    }

    /// Decide one group: the oldest waiting context's bucket, planned under the budget, its
    /// first group. Returns the number of contexts decided (0 when nothing is waiting).
    pub fn step(&mut self, metrics: &Metrics) -> usize {
        self.drop_abandoned();
        let Some(head) = self.ready.front() else {
            self.answer_finished();
            return 0;
        };
        let Some((compiled, options, temperature)) = self.request(head.request).map(|w| {
            (
                w.job.compiled.clone(),
                w.job.options.clone(),
                w.temperature.clone(),
            )
        }) else {
            // cannot happen: a ready context's request is waiting; drop it rather than spin
            self.ready.pop_front();
            return 0;
        };
        // the bucket: same schema and options, oldest first (positions in `self.ready`)
        let bucket: Vec<usize> = self
            .ready
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                self.request(r.request).is_some_and(|w| {
                    w.job.compiled.schema_hash() == compiled.schema_hash()
                        && same_options(&w.job.options, &options)
                })
            })
            .map(|(pos, _)| pos)
            .collect();
        let items = bucket
            .iter()
            .enumerate()
            .map(|(i, &pos)| GroupItem::of(i, self.ready[pos].prepared.split()));
        let groups = plan_groups(items, &self.budget, &self.engine.memory_model());
        let Some(group) = groups.into_iter().next() else {
            return 0;
        };
        let start = Instant::now();
        let decided = self.engine.decide_group(
            &compiled,
            &group,
            |i| bucket.get(i).map(|&pos| &self.ready[pos].prepared),
            &options,
            &temperature,
            start,
        );
        metrics.merged_call(group.len());
        let mut taken: Vec<usize> = group.members().iter().map(|&i| bucket[i]).collect();
        for (&pos, d) in taken.iter().zip(decided) {
            if let Ok(d) = &d {
                let opens_group = d
                    .telemetry
                    .group
                    .as_ref()
                    .filter(|g| g.slot == 0)
                    .map(|g| g.size);
                metrics.decision(d.telemetry.prefix_tokens, d.telemetry.rows, opens_group);
            }
            let (request, index) = (self.ready[pos].request, self.ready[pos].index);
            if let Some(w) = self.request_mut(request) {
                w.results[index] = Some(d);
            }
        }
        // remove the decided contexts, back to front so positions stay valid
        taken.sort_unstable_by(|a, b| b.cmp(a));
        for pos in &taken {
            self.ready.remove(*pos);
        }
        self.answer_finished();
        taken.len()
    }

    fn request(&self, id: u64) -> Option<&Waiting> {
        self.waiting.iter().find(|(i, _)| *i == id).map(|(_, w)| w)
    }

    fn request_mut(&mut self, id: u64) -> Option<&mut Waiting> {
        self.waiting
            .iter_mut()
            .find(|(i, _)| *i == id)
            .map(|(_, w)| w)
    }

    /// Forget requests whose requester is gone, and their contexts.
    fn drop_abandoned(&mut self) {
        let gone: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.job.reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        if gone.is_empty() {
            return;
        }
        self.waiting.retain(|(id, _)| !gone.contains(id));
        self.ready.retain(|r| !gone.contains(&r.request));
    }

    /// Answer every request whose contexts are all decided, in admission order.
    fn answer_finished(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].1.done() {
                let (_, w) = self.waiting.remove(i);
                let out = w.results.into_iter().flatten().collect();
                // the requester may have timed out meanwhile; its result is then dropped
                let _ = w.job.reply.send(out);
            } else {
                i += 1;
            }
        }
    }
}

fn same_options(a: &ScoreOptions, b: &ScoreOptions) -> bool {
    a == b
}
