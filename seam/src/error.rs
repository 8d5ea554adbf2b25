//! The backend-neutral run-time error. A backend converts its own errors (tensor library,
//! device) into these variants; loading a model is backend-specific and has its own error type
//! in the backend's crate.

/// What a call through the seam can fail with. Variants carry named fields.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The request breaks a rule of the seam (empty prompt, unknown state, wrong state shape).
    #[error("invalid scoring request: {reason}")]
    InvalidRequest { reason: String },
    /// A token id the model's embedding does not have.
    #[error("token id {id} is outside the model's embedding ({vocab_size} rows)")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    /// A computation failed inside the backend (`op` names it; `message` is the backend's text).
    #[error("tensor operation `{op}` failed: {message}")]
    Compute { op: &'static str, message: String },
    /// A full-vocabulary logit the model produced is NaN or +inf (overflowing weights or dtype).
    #[error("the model produced a non-finite logit at position {position}: {logit}")]
    NonFiniteLogit {
        position: usize,
        logit: NonFiniteLogit,
    },
    /// The device failed or is unavailable.
    #[error("device error: {reason}")]
    Device { reason: String },
}

/// A logit the top-K selection cannot order: NaN, or +inf (whose log-probability is NaN).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("token id {id} has the non-finite logit {value}")]
pub struct NonFiniteLogit {
    pub id: u32,
    pub value: f32,
}
