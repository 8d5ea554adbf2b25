//! The bounded job queue and the one model thread behind it.
//!
//! Handlers [`Queue::submit`] a [`Job`] (contexts + a compiled schema + options) and await its
//! reply. The model thread blocks on the queue; when a job arrives it also takes every job
//! already waiting (up to `max_merged_contexts` contexts), buckets them by (schema hash,
//! options), and decides each bucket with ONE `Engine::decide_many` call over all its contexts:
//! the engine plans the context groups under the configured `GroupBudget` (the batch budget),
//! prefills each group's contexts and scores all their rows in one slot-merged pass. Results are
//! split back per job in order. Merging only changes batching, never rows or prompts, so a
//! merged decision equals the single-request one (`tests/api.rs`).
//!
//! A generation job (`/v1/generate`: the autoregressive baseline beside forkscore's decision) runs
//! alone, in its arrival order: it is one context decoded token by token, nothing to merge.
//!
//! A full queue refuses at once (503). A job whose requester gave up (timeout, disconnect) is
//! dropped unscored. The thread ends when every sender is gone (graceful shutdown: in-flight
//! jobs are answered first).

use crate::error::ApiError;
use crate::metrics::Metrics;
use axum::http::StatusCode;
use forkscore_engine::{
    Baseline, CompiledSchema, Decision, Engine, EngineError, GenerateError, GenerateOptions,
    GroupBudget, ScoreOptions,
};
use forkscore_seam::Backend;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// One request's work.
pub struct Job {
    pub compiled: Arc<CompiledSchema>,
    pub contexts: Vec<String>,
    pub options: ScoreOptions,
    pub reply: oneshot::Sender<Vec<Result<Decision, EngineError>>>,
}

/// One `/v1/generate` request's work: forkscore's decision and the greedy generation of the same
/// context ([`Engine::generate_baseline`]).
pub struct GenerateJob {
    pub compiled: Arc<CompiledSchema>,
    pub context: String,
    pub options: ScoreOptions,
    pub generate: GenerateOptions,
    pub reply: oneshot::Sender<Result<Baseline, GenerateError>>,
}

/// What the model thread takes from the queue.
enum Task {
    Decide(Job),
    Generate(GenerateJob),
}

#[derive(Clone)]
pub struct Queue {
    tx: mpsc::Sender<Task>,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// Start the model thread. It ends when the last `Queue` clone is dropped. Fails only if
    /// the operating system refuses a new thread.
    pub fn start<B: Backend + 'static>(
        engine: Arc<Engine<B>>,
        capacity: usize,
        max_merged_contexts: usize,
        budget: GroupBudget,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<(Queue, std::thread::JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let m = metrics.clone();
        let handle = std::thread::Builder::new()
            .name("forkscore-model".into())
            .spawn(move || run(&engine, rx, max_merged_contexts.max(1), &budget, &m))?;
        Ok((Queue { tx, metrics }, handle))
    }

    /// Enqueue without waiting: a full queue is 503 `queue_full`.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.send(Task::Decide(job))
    }

    /// Enqueue a generation without waiting (as [`Queue::submit`]).
    pub fn submit_generate(&self, job: GenerateJob) -> Result<(), ApiError> {
        self.send(Task::Generate(job))
    }

    fn send(&self, task: Task) -> Result<(), ApiError> {
        self.metrics.queue_add(1);
        self.tx.try_send(task).map_err(|e| {
            self.metrics.queue_add(-1);
            let message = match e {
                mpsc::error::TrySendError::Full(_) => "the scoring queue is full; retry later",
                mpsc::error::TrySendError::Closed(_) => "the server is shutting down",
            };
            ApiError::bad("queue_full", "<root>", message)
                .with_status(StatusCode::SERVICE_UNAVAILABLE)
        })
    }
}

fn run<B: Backend>(
    engine: &Engine<B>,
    mut rx: mpsc::Receiver<Task>,
    max_merged: usize,
    budget: &GroupBudget,
    metrics: &Metrics,
) {
    // a generation met while merging decisions waits here for its turn
    let mut held: Option<Task> = None;
    while let Some(first) = held.take().or_else(|| rx.blocking_recv()) {
        metrics.queue_add(-1);
        let first = match first {
            Task::Generate(job) => {
                if !job.reply.is_closed() {
                    let result = engine.generate_baseline(
                        &job.context,
                        &job.compiled,
                        &job.options,
                        &job.generate,
                    );
                    let _ = job.reply.send(result);
                }
                continue;
            }
            Task::Decide(job) => job,
        };
        let mut taken = first.contexts.len();
        let mut jobs = vec![first];
        while taken < max_merged {
            match rx.try_recv() {
                Ok(Task::Decide(job)) => {
                    metrics.queue_add(-1);
                    taken += job.contexts.len();
                    jobs.push(job);
                }
                Ok(task) => {
                    // counted off the queue when its turn comes
                    held = Some(task);
                    break;
                }
                Err(_) => break,
            }
        }
        jobs.retain(|j| !j.reply.is_closed());
        for bucket in buckets(jobs) {
            decide_bucket(engine, bucket, budget, metrics);
        }
    }
}

/// Jobs with the same compiled schema and options, in arrival order.
pub fn buckets(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut out: Vec<Vec<Job>> = Vec::new();
    for job in jobs {
        match out.iter_mut().find(|b| {
            b[0].compiled.schema_hash() == job.compiled.schema_hash() && b[0].options == job.options
        }) {
            Some(b) => b.push(job),
            None => out.push(vec![job]),
        }
    }
    out
}

fn decide_bucket<B: Backend>(
    engine: &Engine<B>,
    jobs: Vec<Job>,
    budget: &GroupBudget,
    metrics: &Metrics,
) {
    let contexts: Vec<&str> = jobs
        .iter()
        .flat_map(|j| j.contexts.iter().map(String::as_str))
        .collect();
    metrics.merged_call(contexts.len());
    let mut results = engine
        .decide_many(&contexts, &jobs[0].compiled, &jobs[0].options, budget)
        .into_iter();
    for d in results.as_slice().iter().flatten() {
        let opens_group = d
            .telemetry
            .group
            .as_ref()
            .filter(|g| g.slot == 0)
            .map(|g| g.size);
        metrics.decision(d.telemetry.prefix_tokens, d.telemetry.rows, opens_group);
    }
    for job in jobs {
        let mine: Vec<_> = results.by_ref().take(job.contexts.len()).collect();
        // the requester may have timed out meanwhile; its result is then dropped
        let _ = job.reply.send(mine);
    }
}
