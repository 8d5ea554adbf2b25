//! [`AssembleError`]: what stage 6 (assembly) refuses. Its own module so that `EngineError` can
//! name it without depending on the assembly stage itself.

use crate::literal::assemble::LiteralScoreError;

/// What assembly refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    #[error("{rows} rows of logits for a schema of {fields} fields")]
    RowCount { fields: usize, rows: usize },
    #[error("{summaries} vocabulary summaries for a schema of {fields} code fields")]
    VocabCount { fields: usize, summaries: usize },
    #[error("field `{field}` is literal-scored but has no tree logits (or the reverse)")]
    NotLiteral { field: String },
    #[error("field `{field}`: {source}")]
    Literal {
        field: String,
        #[source]
        source: LiteralScoreError,
    },
}
