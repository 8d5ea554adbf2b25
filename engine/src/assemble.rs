//! Assembly: per row, the field's own candidate logits in; a typed value, per-choice
//! probabilities and logits out. softmax(logits / T) over the field's codes only, in f64;
//! argmax on the raw logits with a deterministic tie-break (the first choice wins), so the
//! temperature never changes the selection.

use crate::calibration::Temperature;
use crate::modes::{Mode, RunStats};
use crate::rows::{CompiledField, CompiledSchema};
use crate::schema::FieldKind;
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;

/// The decision for one context.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// Field name → selected typed value (booleans are JSON booleans).
    pub output: IndexMap<String, Value>,
    pub fields: IndexMap<String, FieldResult>,
    pub temperature: Temperature,
    pub telemetry: Telemetry,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<PromptDebug>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FieldResult {
    pub value: Value,
    #[serde(rename = "type")]
    pub kind: FieldKind,
    pub choices: Vec<Value>,
    pub codes: Vec<String>,
    /// Choice key → probability (softmax of logits / T over this field's codes).
    pub scores: IndexMap<String, f64>,
    /// Choice key → raw candidate logit.
    pub logits: IndexMap<String, f32>,
}

/// Where time and tokens went.
#[derive(Debug, Clone, Serialize)]
pub struct Telemetry {
    pub mode: Mode,
    pub rows: usize,
    pub field_batch_size: Option<usize>,
    pub prefix_tokens: usize,
    pub suffix_tokens: Vec<usize>,
    pub input_tokens: usize,
    pub candidate_ids: usize,
    pub prefill_calls: usize,
    pub score_calls: usize,
    pub forward_calls: usize,
    pub state_bytes: usize,
    /// Prefix tokens taken from a retained shared state instead of prefilled (batch serial /
    /// shared modes: one context prefilled once for many schemas); omitted when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reused_prefix_tokens: usize,
    pub timings_ms: StageTimings,
    /// The context group this decision was scored in (decide_many and batch jobs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::group::GroupTelemetry>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StageTimings {
    pub render: f64,
    pub split: f64,
    pub prefill: f64,
    pub score: f64,
    pub assemble: f64,
    pub total: f64,
}

/// The opt-in debug view: exactly what the model was fed.
#[derive(Debug, Clone, Serialize)]
pub struct PromptDebug {
    pub prefix_text: String,
    pub prefix_ids: Vec<u32>,
    pub rows: Vec<RowDebug>,
    pub candidate_ids: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RowDebug {
    pub field: String,
    pub selector: String,
    pub suffix_ids: Vec<u32>,
    pub code_ids: Vec<u32>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Index of the largest value; the first wins ties. NaN never wins.
pub fn argmax_first(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || (values[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

/// softmax(logits / t) in f64.
pub fn softmax_scaled(logits: &[f32], t: f64) -> Vec<f64> {
    // Subtract the max before dividing: logits / t can overflow for a tiny t (inf - inf = NaN).
    let max = logits
        .iter()
        .map(|&l| f64::from(l))
        .fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits
        .iter()
        .map(|&l| ((f64::from(l) - max) / t).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Assemble one field from the row's logits over the candidate union.
pub fn assemble_field(field: &CompiledField, row_logits: &[f32], temperature: f64) -> FieldResult {
    let own: Vec<f32> = field
        .candidate_index
        .iter()
        .map(|&i| row_logits[i])
        .collect();
    let probs = softmax_scaled(&own, temperature);
    let best = argmax_first(&own);
    let keys: Vec<String> = field.choices.iter().map(|c| c.key()).collect();
    FieldResult {
        value: field.choices[best].to_json(),
        kind: field.kind,
        choices: field.choices.iter().map(|c| c.to_json()).collect(),
        codes: field.codes.iter().map(char::to_string).collect(),
        scores: keys.iter().cloned().zip(probs).collect(),
        logits: keys.into_iter().zip(own).collect(),
    }
}

/// Assemble all fields of one context.
pub fn assemble_fields(
    compiled: &CompiledSchema,
    rows: &[Vec<f32>],
    temperature: f64,
) -> (IndexMap<String, Value>, IndexMap<String, FieldResult>) {
    let mut output = IndexMap::new();
    let mut fields = IndexMap::new();
    for (f, logits) in compiled.fields().iter().zip(rows) {
        let r = assemble_field(f, logits, temperature);
        output.insert(f.name.clone(), r.value.clone());
        fields.insert(f.name.clone(), r);
    }
    (output, fields)
}

/// Telemetry from run stats (timings other than prefill/score filled by the caller).
pub fn telemetry(
    mode: Mode,
    field_batch_size: Option<usize>,
    split_tokens: (usize, Vec<usize>),
    candidates: usize,
    stats: &RunStats,
) -> Telemetry {
    let (prefix_tokens, suffix_tokens) = split_tokens;
    let input_tokens = prefix_tokens + suffix_tokens.iter().copied().max().unwrap_or(0);
    Telemetry {
        mode,
        rows: suffix_tokens.len(),
        field_batch_size,
        prefix_tokens,
        suffix_tokens,
        input_tokens,
        candidate_ids: candidates,
        prefill_calls: stats.prefill_calls,
        score_calls: stats.score_calls,
        forward_calls: stats.forward_calls,
        state_bytes: stats.state_bytes,
        reused_prefix_tokens: stats.reused_prefix_tokens,
        timings_ms: StageTimings {
            prefill: stats.prefill_ms,
            score: stats.score_ms,
            ..StageTimings::default()
        },
        group: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_the_first_of_equal_values_and_skips_nan() {
        assert_eq!(argmax_first(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax_first(&[f32::NAN, 0.5, 0.5]), 1);
        assert_eq!(argmax_first(&[2.0]), 0);
    }

    #[test]
    fn softmax_is_normalised_and_temperature_flattens() {
        let p = softmax_scaled(&[1.0, 2.0, 3.0], 1.0);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let hot = softmax_scaled(&[1.0, 2.0, 3.0], 2.179);
        assert!(hot[2] < p[2] && hot[0] > p[0]);
        let big = softmax_scaled(&[1000.0, -1000.0], 1.0);
        assert_eq!(big, vec![1.0, 0.0]);
        // A tiny temperature is a hard argmax, never NaN.
        assert_eq!(
            softmax_scaled(&[1.0, 3.0, 2.0], 1e-310),
            vec![0.0, 1.0, 0.0]
        );
    }
}
