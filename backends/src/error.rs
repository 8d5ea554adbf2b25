//! Typed backend errors. Variants name what failed and carry named fields.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
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
    #[error("tensor operation `{op}` failed: {source}")]
    Tensor {
        op: &'static str,
        #[source]
        source: candle_core::Error,
    },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl BackendError {
    /// Wrap a candle error with the name of the operation that failed.
    pub fn tensor(op: &'static str) -> impl FnOnce(candle_core::Error) -> BackendError {
        move |source| BackendError::Tensor { op, source }
    }
}
