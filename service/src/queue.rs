//! The bounded job queue and the one model thread behind it.
//!
//! Handlers [`Queue::submit`] a [`Job`] (contexts + a compiled schema + options) and await its
//! reply. The model thread runs the continuous-batching [`Scheduler`]: between two forward
//! passes it admits every request already queued (up to `max_merged_contexts` waiting
//! contexts), and each pass decides the next context group of the oldest waiting context's
//! bucket (schema hash + options) under the configured `GroupBudget` — one packed prefill and
//! one slot-merged scoring pass — so a request joins the next pass with room rather than waiting
//! for a whole merged call. Results go back per job in order. Batching never changes rows or
//! prompts, and a context's result does not depend on its group (batch invariance), so a merged
//! decision equals the single-request one (`tests/api.rs`).
//!
//! A generation job (`/v1/generate`: the autoregressive baseline beside forkscore's decision) runs
//! alone, in its arrival order: it is one context decoded token by token, nothing to merge.
//!
//! A full queue refuses at once (503). A job whose requester gave up (timeout, disconnect) is
//! dropped unscored. The thread ends when every sender is gone (graceful shutdown: in-flight
//! jobs are answered first).

use crate::error::ApiError;
pub use crate::job::{GenerateJob, Job};
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use axum::http::StatusCode;
use forkscore_engine::{Engine, GroupBudget};
use forkscore_seam::Backend;
use std::sync::Arc;
use tokio::sync::mpsc;

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

    /// Take a place in the queue without waiting (a full queue is 503 `queue_full`), before
    /// the work of a job is done: a handler reserves, prepares its contexts, then
    /// [`Slot::submit`]s, so a full queue refuses at once and nothing is prepared in vain.
    pub fn reserve(&self) -> Result<Slot<'_>, ApiError> {
        match self.tx.try_reserve() {
            Ok(permit) => Ok(Slot {
                permit,
                metrics: &self.metrics,
            }),
            Err(e) => Err(refused(matches!(e, mpsc::error::TrySendError::Full(_)))),
        }
    }

    fn send(&self, task: Task) -> Result<(), ApiError> {
        self.metrics.queue_add(1);
        self.tx.try_send(task).map_err(|e| {
            self.metrics.queue_add(-1);
            refused(matches!(e, mpsc::error::TrySendError::Full(_)))
        })
    }
}

/// A place reserved in the queue ([`Queue::reserve`]); dropping it unused frees it.
pub struct Slot<'q> {
    permit: mpsc::Permit<'q, Task>,
    metrics: &'q Metrics,
}

impl Slot<'_> {
    /// Queue `job` in the reserved place (never refused).
    pub fn submit(self, job: Job) {
        self.metrics.queue_add(1);
        self.permit.send(Task::Decide(job));
    }
}

/// The 503 of a queue that is full (or closing).
fn refused(full: bool) -> ApiError {
    let message = if full {
        "the scoring queue is full; retry later"
    } else {
        "the server is shutting down"
    };
    ApiError::bad("queue_full", "<root>", message).with_status(StatusCode::SERVICE_UNAVAILABLE)
}

fn run<B: Backend>(
    engine: &Engine<B>,
    mut rx: mpsc::Receiver<Task>,
    max_merged: usize,
    budget: &GroupBudget,
    metrics: &Metrics,
) {
    let mut scheduler = Scheduler::new(engine, *budget);
    // a generation waits here until every context admitted before it is decided; nothing is
    // admitted meanwhile, so arrival order holds across both kinds of work
    let mut held: Option<GenerateJob> = None;
    let mut open = true;
    loop {
        if scheduler.is_idle() {
            if let Some(job) = held.take() {
                metrics.queue_add(-1);
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
            if !open {
                return;
            }
            // nothing to do: wait for the next request
            match rx.blocking_recv() {
                Some(task) => admit(&mut scheduler, &mut held, task, metrics),
                None => return,
            }
        }
        // every request already queued joins now, up to `max_merged` waiting contexts
        while open && held.is_none() && scheduler.pending_contexts() < max_merged {
            match rx.try_recv() {
                Ok(task) => admit(&mut scheduler, &mut held, task, metrics),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        scheduler.step(metrics);
    }
}

/// A decision request joins the scheduler; a generation is held for its turn (counted off the
/// queue when it runs).
fn admit<B: Backend>(
    scheduler: &mut Scheduler<'_, B>,
    held: &mut Option<GenerateJob>,
    task: Task,
    metrics: &Metrics,
) {
    match task {
        Task::Decide(job) => {
            metrics.queue_add(-1);
            if !job.reply.is_closed() {
                scheduler.admit(job);
            }
        }
        Task::Generate(job) => *held = Some(job),
    }
}
