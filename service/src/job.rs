//! The work a handler hands the model thread (through the [`crate::queue::Queue`]), with the
//! channel its reply comes back on.

use forkscore_engine::{
    Baseline, CompiledSchema, Decision, EngineError, GenerateError, GenerateOptions,
    PreparedContext, ScoreOptions,
};
use std::sync::Arc;
use tokio::sync::oneshot;

/// One request's work.
pub struct Job {
    pub compiled: Arc<CompiledSchema>,
    pub contexts: Vec<String>,
    pub options: ScoreOptions,
    /// The contexts already prepared (rendered, split, tokenized) by the handler, one entry per
    /// context in order ([`crate::scheduler::prepare_contexts`]), so that the model thread
    /// spends no time on them between passes; `None`: the model thread prepares them.
    pub prepared: Option<Vec<Result<PreparedContext, EngineError>>>,
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
