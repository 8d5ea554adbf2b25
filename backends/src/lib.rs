//! forkscore backends: the candle implementation of the seam ([`forkscore_seam::Backend`]).
//!
//! The engine never sees a tensor. It hands a backend token ids and gets back retained prefix
//! states and f32 logits over a candidate-id list. Everything about devices, dtypes, model
//! architectures and checkpoint layouts lives below the seam, here. The seam's types are
//! re-exported so callers that load a model need one import path.

pub mod candle;
pub mod error;
pub mod switches;

pub use candle::{
    BranchFootprint, CandleBackend, CandleState, CheckpointSource, ComputeDType, DeviceSpec,
    LoadOptions, ResolvedCheckpoint,
};
pub use error::CandleError;
pub use forkscore_seam::{
    score_tree_by_rows, Architecture, Backend, BackendError, CandidateLogits, DType, DecodeStep,
    Device, Family, ModelFacts, PositionVocab, PrefixState, Quantization, ScoreRequest, ScoreRow,
    TokenLogprob, TokenTree, TreeNode, TreePacking, TreeRequest, VocabRequest, VocabRow, MAX_TOP_K,
};
