//! The candle backend's own error: everything loading or running a model on candle can fail
//! with. Loading returns it whole ([`CandleError`]: files, config, tensors, device); calls
//! through the seam convert it into the backend-neutral [`forkscore_seam::BackendError`], so
//! nothing above the seam sees a candle type.

use std::path::PathBuf;

use forkscore_seam::BackendError;

#[derive(Debug, thiserror::Error)]
pub enum CandleError {
    #[error("invalid scoring request: {reason}")]
    InvalidRequest { reason: String },
    #[error("token id {id} is outside the model's embedding ({vocab_size} rows)")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("missing file {path}: {reason}")]
    MissingFile { path: PathBuf, reason: String },
    #[error("invalid config {path}: {reason}")]
    InvalidConfig { path: PathBuf, reason: String },
    #[error("unsupported architecture `{name}` (supported: {supported})")]
    UnsupportedArchitecture { name: String, supported: String },
    #[error("checkpoint is missing tensor `{name}` (looked in {path})")]
    MissingTensor { name: String, path: PathBuf },
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("tensor `{name}` has dtype {actual}, expected one of {expected}")]
    WrongDtype {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("invalid checkpoint {path}: {reason}")]
    InvalidCheckpoint { path: PathBuf, reason: String },
    #[error("invalid model reference: {reason}")]
    InvalidModelRef { reason: String },
    #[error("device error: {reason}")]
    Device { reason: String },
    #[error("the model produced a non-finite logit at position {position}: {logit}")]
    NonFiniteLogit {
        position: usize,
        logit: forkscore_seam::NonFiniteLogit,
    },
    #[error("tensor operation `{op}` failed: {source}")]
    Tensor {
        op: &'static str,
        #[source]
        source: candle_core::Error,
    },
    #[error("cannot quantize tensor `{name}`: {reason}")]
    Quantize { name: String, reason: String },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl CandleError {
    /// Wrap a candle error with the name of the operation that failed.
    pub fn tensor(op: &'static str) -> impl FnOnce(candle_core::Error) -> CandleError {
        move |source| CandleError::Tensor { op, source }
    }
}

impl From<BackendError> for CandleError {
    /// Seam-level errors (e.g. a parse error of a device name) seen by loading code.
    fn from(e: BackendError) -> CandleError {
        match e {
            BackendError::InvalidRequest { reason } => CandleError::InvalidRequest { reason },
            BackendError::TokenOutOfRange { id, vocab_size } => {
                CandleError::TokenOutOfRange { id, vocab_size }
            }
            BackendError::Device { reason } => CandleError::Device { reason },
            BackendError::NonFiniteLogit { position, logit } => {
                CandleError::NonFiniteLogit { position, logit }
            }
            BackendError::Compute { op, message } => CandleError::InvalidRequest {
                reason: format!("`{op}` failed: {message}"),
            },
        }
    }
}

impl From<CandleError> for BackendError {
    /// Run-time errors keep their kind; a tensor error becomes [`BackendError::Compute`] with
    /// candle's message; a load-time variant (not produced by a run-time call) keeps its text.
    fn from(e: CandleError) -> BackendError {
        match e {
            CandleError::InvalidRequest { reason } => BackendError::InvalidRequest { reason },
            CandleError::TokenOutOfRange { id, vocab_size } => {
                BackendError::TokenOutOfRange { id, vocab_size }
            }
            CandleError::Device { reason } => BackendError::Device { reason },
            CandleError::NonFiniteLogit { position, logit } => {
                BackendError::NonFiniteLogit { position, logit }
            }
            CandleError::Tensor { op, source } => BackendError::Compute {
                op,
                message: source.to_string(),
            },
            other @ (CandleError::MissingFile { .. }
            | CandleError::InvalidConfig { .. }
            | CandleError::UnsupportedArchitecture { .. }
            | CandleError::MissingTensor { .. }
            | CandleError::WrongShape { .. }
            | CandleError::WrongDtype { .. }
            | CandleError::InvalidCheckpoint { .. }
            | CandleError::InvalidModelRef { .. }
            | CandleError::Quantize { .. }
            | CandleError::Io { .. }) => BackendError::Compute {
                op: "load",
                message: other.to_string(),
            },
        }
    }
}
