//! [`ApiError`]: every way a request can fail, as an HTTP status and a JSON body
//! `{"error": {"kind", "path", "message"}}`. Bad input is always a 4xx naming the JSON path and
//! the rule; 5xx only for the server's own trouble (backend failure, full queue, timeout).
//! Engine errors map to the same `kind` names as `forkscore batch` error records.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use forkscore_engine::{EngineError, GenerateError};
use forkscore_seam::BackendError;
use serde_json::json;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind} at `{path}`: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    /// JSON path in the request body (`<root>` for the whole body).
    pub path: String,
    pub message: String,
}

impl ApiError {
    pub fn bad(kind: &'static str, path: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind,
            path: path.into(),
            message: message.into(),
        }
    }
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The kind and status of an engine error for the context at `path` (exhaustive, no
    /// wildcard: a new engine error cannot be silently mis-mapped).
    pub fn from_engine(e: &EngineError, path: &str) -> ApiError {
        use StatusCode as S;
        let (status, kind) = match e {
            EngineError::Compile(_) => (S::UNPROCESSABLE_ENTITY, "compile"),
            EngineError::ForeignSchema | EngineError::ForeignPrepared => {
                (S::INTERNAL_SERVER_ERROR, "compile")
            }
            EngineError::Template(_) | EngineError::ContextNotInPrompt => {
                (S::UNPROCESSABLE_ENTITY, "template")
            }
            EngineError::NonFiniteLogits { .. }
            | EngineError::Backend(BackendError::NonFiniteLogit { .. }) => {
                (S::INTERNAL_SERVER_ERROR, "non_finite_logits")
            }
            EngineError::Split(_) => (S::UNPROCESSABLE_ENTITY, "split"),
            EngineError::Backend(_)
            | EngineError::Assemble(_)
            | EngineError::MissingMember { .. } => (S::INTERNAL_SERVER_ERROR, "backend"),
            EngineError::Calibration(_)
            | EngineError::ZeroFieldBatch
            | EngineError::ZeroMaxInputTokens
            | EngineError::TopKTooLarge { .. } => (S::BAD_REQUEST, "options"),
            EngineError::TokenizerLargerThanEmbedding { .. } => {
                (S::INTERNAL_SERVER_ERROR, "options")
            }
            EngineError::EmptyContext
            | EngineError::EmptyText
            | EngineError::TooFewTokens { .. } => (S::BAD_REQUEST, "empty_context"),
            EngineError::TooManyTokens { .. }
            | EngineError::TextTooLong { .. }
            | EngineError::TextOverModelLimit { .. } => (S::PAYLOAD_TOO_LARGE, "too_many_tokens"),
        };
        ApiError {
            status,
            kind,
            path: path.to_string(),
            message: e.to_string(),
        }
    }

    /// The kind and status of a `/v1/generate` failure (exhaustive, as [`ApiError::from_engine`]).
    pub fn from_generate(e: &GenerateError) -> ApiError {
        use StatusCode as S;
        let (status, kind, path) = match e {
            GenerateError::Engine(e) => return ApiError::from_engine(e, "context"),
            GenerateError::Backend(_) | GenerateError::Tokenizer(_) => {
                (S::INTERNAL_SERVER_ERROR, "backend", "<root>")
            }
            GenerateError::NoFields => (S::BAD_REQUEST, "invalid_schema", "schema"),
            GenerateError::MaxNewTokens(_) => (S::BAD_REQUEST, "invalid_field", "max_new_tokens"),
            GenerateError::PromptTooShort { .. } => (S::BAD_REQUEST, "empty_context", "context"),
            GenerateError::PromptTooLong { .. } | GenerateError::OverModelLimit { .. } => {
                (S::PAYLOAD_TOO_LARGE, "too_many_tokens", "context")
            }
        };
        ApiError {
            status,
            kind,
            path: path.to_string(),
            message: e.to_string(),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"kind": self.kind, "path": self.path, "message": self.message}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
