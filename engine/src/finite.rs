//! Non-finite logits are an error, never a decision.
//!
//! A NaN or infinity in the weights (or an overflow in a low-precision dtype) turns logits into
//! NaN/Inf; softmax of those is NaN and argmax would still "select" a value. [`check_rows`]
//! refuses such a context before assembly, naming the field and the value. In batch jobs this
//! is an error record for that line only; in `score` the command fails.

use crate::error::EngineError;
use crate::literal::tree::NodeScores;
use crate::rows::CompiledSchema;

/// Every field's own code logits in `rows` (one row per field, over the candidate union) are
/// finite.
pub fn check_rows(compiled: &CompiledSchema, rows: &[Vec<f32>]) -> Result<(), EngineError> {
    for (field, row) in compiled.fields().iter().zip(rows) {
        let bad = field
            .candidate_index
            .iter()
            .filter_map(|&i| row.get(i).copied())
            .find(|v| !v.is_finite());
        if let Some(value) = bad {
            return Err(EngineError::NonFiniteLogits {
                field: field.name.clone(),
                value: value.to_string(),
            });
        }
    }
    Ok(())
}

/// Every literal field's child logits (and logsumexps, when present) are finite.
pub fn check_literal(
    compiled: &CompiledSchema,
    literal: &[Option<NodeScores>],
) -> Result<(), EngineError> {
    for (field, scores) in compiled.fields().iter().zip(literal) {
        let Some(scores) = scores else { continue };
        let bad = scores
            .logits
            .iter()
            .flatten()
            .chain(scores.logsumexp.iter().flatten())
            .find(|v| !v.is_finite());
        if let Some(value) = bad {
            return Err(EngineError::NonFiniteLogits {
                field: field.name.clone(),
                value: value.to_string(),
            });
        }
    }
    Ok(())
}
