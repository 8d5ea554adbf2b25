//! The item types of a batch: a raw input line ([`RawLine`]), a validated line ([`Request`]),
//! a line that failed ([`Failed`], with its [`LineError`]). The native ([`super::records`]) and
//! OpenAI ([`super::openai`]) line formats both parse into these.

use forkscore_engine::EngineError;
use serde_json::Value;
use std::path::PathBuf;

/// One physical input line.
#[derive(Debug, Clone)]
pub struct RawLine {
    pub line: u64,
    pub bytes: Vec<u8>,
    /// Already in the output (resume): parse its id, score nothing.
    pub done: bool,
    /// The line was this many bytes, over the line bound: `bytes` keeps only its first
    /// [`crate::bounds::LEADING_BYTES`] (where a leading `"id"` is looked for) and the line
    /// becomes an error record (see [`super::records::parse_bounded`]).
    pub too_long: Option<u64>,
}

/// Where a line's schema comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaRef {
    Inline(Value),
    File(PathBuf),
    Question(String),
    Default,
}

/// A validated input line.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub line: u64,
    pub id: Value,
    pub context: Option<String>,
    pub schema: SchemaRef,
}

/// What went wrong with one line (the `error.kind` of its output record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    InvalidUtf8,
    InvalidJson,
    NotAnObject,
    MissingId,
    InvalidId,
    DuplicateId,
    UnknownKey,
    InvalidField,
    MissingContext,
    UnexpectedContext,
    ConflictingSchema,
    MissingSchema,
    InvalidSchema,
    SchemaFile,
    EmptyContext,
    TooManyTokens,
    Compile,
    Template,
    Split,
    Backend,
    Options,
    /// The model produced NaN/Inf logits for this line: no decision.
    NonFiniteLogits,
    /// The line is longer than the byte bound derived from --max-input-tokens.
    LineTooLong,
}

impl ErrorKind {
    /// The kind as error records spell it (`invalid_json`).
    pub fn as_str(self) -> String {
        match serde_json::to_value(self) {
            Ok(Value::String(s)) => s,
            _ => format!("{self:?}"),
        }
    }
}

/// A line's error: kind + human message.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub kind: ErrorKind,
    pub message: String,
}

impl LineError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> LineError {
        LineError {
            kind,
            message: message.into(),
        }
    }

    /// The error record kind of an engine error.
    pub fn from_engine(e: &EngineError) -> LineError {
        let kind = match e {
            EngineError::Compile(_) | EngineError::ForeignSchema | EngineError::ForeignPrepared => {
                ErrorKind::Compile
            }
            EngineError::Template(_) | EngineError::ContextNotInPrompt => ErrorKind::Template,
            EngineError::NonFiniteLogits { .. }
            | EngineError::Backend(forkscore_backends::BackendError::NonFiniteLogit { .. }) => {
                ErrorKind::NonFiniteLogits
            }
            EngineError::Split(_) => ErrorKind::Split,
            // the scoring stage: the backend, or what it returned not fitting the request
            EngineError::Backend(_)
            | EngineError::Assemble(_)
            | EngineError::MissingMember { .. } => ErrorKind::Backend,
            EngineError::Calibration(_)
            | EngineError::ZeroFieldBatch
            | EngineError::ZeroMaxInputTokens
            | EngineError::TopKTooLarge { .. }
            | EngineError::TokenizerLargerThanEmbedding { .. } => ErrorKind::Options,
            EngineError::EmptyContext
            | EngineError::EmptyText
            | EngineError::TooFewTokens { .. } => ErrorKind::EmptyContext,
            EngineError::TooManyTokens { .. }
            | EngineError::TextTooLong { .. }
            | EngineError::TextOverModelLimit { .. } => ErrorKind::TooManyTokens,
        };
        LineError::new(kind, e.to_string())
    }
}

/// A line that failed before (or during) scoring: its number and, when it had one, its id.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    pub line: u64,
    pub id: Option<Value>,
    pub error: LineError,
}
