//! forkscore backends: the one seam the engine calls ([`Backend`]) and its candle implementation.
//!
//! The engine never sees a tensor. It hands a backend token ids and gets back retained prefix
//! states and f32 logits over a candidate-id list. Everything about devices, dtypes, model
//! architectures and checkpoint layouts lives below this seam.

pub mod candle;
pub mod error;
pub mod seam;

pub use candle::{
    CandleBackend, CandleState, CheckpointSource, ComputeDType, DeviceSpec, LoadOptions,
    ResolvedCheckpoint,
};
pub use error::BackendError;
pub use seam::{Backend, CandidateLogits, ModelFacts, PrefixState, ScoreRow};
