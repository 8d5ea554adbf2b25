//! Stage 6, assemble: per row, the field's own candidate logits in; a [`Decision`] out — the
//! typed value, per-choice probabilities and logits of every field, telemetry, and (opt-in) the
//! prompt exactly as the model was fed. softmax(logits / T) over the field's codes only, in f64;
//! argmax on the raw logits with a deterministic tie-break (the first choice wins), so the
//! temperature never changes the selection. One row of logits per field, or an error.
//! A field with its own calibration (`Temperature::fields`, from a calibration file) gets
//! softmax(s / T_field − ln p_cf) over its T = 1 log-scores instead, and the argmax of that as
//! its value (a content-free shift can move it; a temperature alone cannot).
//! With `ScoreOptions::allowed_mass`, each field also carries its [`AllowedMass`] (the
//! full-vocabulary view at its decision position, see `allowed_mass`); it never changes a
//! value, a score or a logit.
//!
//! A literal-scored field is assembled from its token tree's child logits instead
//! (`literal::assemble`): same output shape (`value`, `choices`, `scores`, `logits` — per choice
//! its method's log-score), no codes, plus `scoring` naming the method. Its value is the argmax
//! of its reported probabilities unless `ScoreOptions::literal_value` asks for the constrained
//! greedy choice. The allowed mass is reported for code fields only.

pub mod error;

use crate::allowed_mass::{allowed_mass, AllowedMass};
use crate::calibration::Temperature;
use crate::fork::RunStats;
use crate::literal::assemble::literal_scores;
use crate::literal::tree::NodeScores;
use crate::options::{Layout, LiteralValue, Mode, ScoreOptions};
use crate::prepare::PreparedContext;
use crate::rows::{CompiledField, CompiledSchema};
use crate::schema::FieldKind;
use crate::softmax::argmax_f64_first;
// defined in `softmax`; re-exported at their former paths
pub use crate::softmax::{argmax_first, softmax_scaled};
use crate::tokenizer::ChatTokenizer;
pub use error::AssembleError;
use forkscore_seam::VocabRow;
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;
use std::time::Instant;

/// The decision for one context.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldResult {
    pub value: Value,
    #[serde(rename = "type")]
    pub kind: FieldKind,
    pub choices: Vec<Value>,
    /// The code letters (empty for a literal-scored field).
    pub codes: Vec<String>,
    /// The literal scoring method (`"literal"`, …); absent for code scoring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scoring: Option<&'static str>,
    /// Choice key → probability (softmax of logits / T over this field's codes; for a literal
    /// field, its method's probability).
    pub scores: IndexMap<String, f64>,
    /// Choice key → raw candidate logit (for a literal field, its method's log-score).
    pub logits: IndexMap<String, f32>,
    /// The full-vocabulary view at the decision position (only with `allowed_mass`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_mass: Option<AllowedMass>,
}

/// Where time and tokens went.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// Prefix tokens taken from a retained shared state instead of prefilled (the cached prompt
    /// head of grouped work and `decide`; batch serial / shared modes: one context prefilled
    /// once for many schemas); omitted when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reused_prefix_tokens: usize,
    /// The prompt layout, omitted for the default context-first one.
    #[serde(skip_serializing_if = "is_context_first")]
    pub layout: Layout,
    /// Token-tree calls of literal fields, their nodes and projected nodes (omitted when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub tree_calls: usize,
    #[serde(skip_serializing_if = "is_zero")]
    pub tree_nodes: usize,
    #[serde(skip_serializing_if = "is_zero")]
    pub tree_projected: usize,
    /// How the backend evaluated those trees (`packed`, `row-per-leaf`, `row-per-node`);
    /// omitted without a tree call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_packing: Option<&'static str>,
    pub timings_ms: StageTimings,
    /// The context group this decision was scored in (decide_many and batch jobs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::group::GroupTelemetry>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PromptDebug {
    pub prefix_text: String,
    pub prefix_ids: Vec<u32>,
    pub rows: Vec<RowDebug>,
    pub candidate_ids: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RowDebug {
    pub field: String,
    pub selector: String,
    pub suffix_ids: Vec<u32>,
    pub code_ids: Vec<u32>,
    /// A literal field's choice paths after the selector (omitted for code fields).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub choice_ids: Vec<Vec<u32>>,
}

fn is_context_first(layout: &Layout) -> bool {
    *layout == Layout::ContextFirst
}

fn is_zero(n: &usize) -> bool {
    *n == 0
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
        scoring: None,
        scores: keys.iter().cloned().zip(probs).collect(),
        logits: keys.into_iter().zip(own).collect(),
        allowed_mass: None,
    }
}

/// Assemble a literal field from its tree logits.
pub fn assemble_literal_field(
    field: &CompiledField,
    scores: &NodeScores,
    temperature: f64,
    rule: LiteralValue,
) -> Result<FieldResult, AssembleError> {
    let Some(lit) = &field.literal else {
        return Err(AssembleError::NotLiteral {
            field: field.name.clone(),
        });
    };
    let s = literal_scores(lit, scores, temperature, rule).map_err(|source| {
        AssembleError::Literal {
            field: field.name.clone(),
            source,
        }
    })?;
    let keys: Vec<String> = field.choices.iter().map(|c| c.key()).collect();
    Ok(FieldResult {
        value: field.choices[s.value].to_json(),
        kind: field.kind,
        choices: field.choices.iter().map(|c| c.to_json()).collect(),
        codes: Vec::new(),
        scoring: Some(field.scoring.name()),
        scores: keys.iter().cloned().zip(s.probabilities).collect(),
        logits: keys.into_iter().zip(s.log_scores).collect(),
        allowed_mass: None,
    })
}

/// The selected value and the full result of every field, in schema order.
pub type AssembledFields = (IndexMap<String, Value>, IndexMap<String, FieldResult>);

/// Assemble all fields of one context: `rows[i]` are the logits of code field `i`,
/// `literal[i]` the tree logits of literal field `i` (None for a code field; an empty slice when
/// the schema has no literal field). A field with its own calibration in `temperature.fields`
/// gets that calibration's probabilities (see `calibration`) and their argmax as its value
/// (a literal field under [`LiteralValue::Greedy`] keeps its greedy value).
pub fn assemble_fields(
    compiled: &CompiledSchema,
    rows: &[Vec<f32>],
    literal: &[Option<NodeScores>],
    temperature: &Temperature,
    rule: LiteralValue,
) -> Result<AssembledFields, AssembleError> {
    if rows.len() != compiled.fields().len() {
        return Err(AssembleError::RowCount {
            fields: compiled.fields().len(),
            rows: rows.len(),
        });
    }
    let mut output = IndexMap::new();
    let mut fields = IndexMap::new();
    for (i, (f, logits)) in compiled.fields().iter().zip(rows).enumerate() {
        let own = temperature.fields.get(&f.name);
        // a field with its own calibration starts from its log-scores at T = 1
        let t = if own.is_some() {
            1.0
        } else {
            temperature.value
        };
        let mut r = match (&f.literal, literal.get(i).and_then(Option::as_ref)) {
            (None, None) => assemble_field(f, logits, t),
            (Some(_), Some(scores)) => assemble_literal_field(f, scores, t, rule)?,
            _ => {
                return Err(AssembleError::NotLiteral {
                    field: f.name.clone(),
                })
            }
        };
        if let Some(cal) = own {
            let keys: Vec<String> = r.scores.keys().cloned().collect();
            let s: Vec<f32> = r.logits.values().copied().collect();
            let p = cal.probabilities(&keys, &s);
            let greedy = f.literal.is_some() && rule == LiteralValue::Greedy;
            if !greedy {
                r.value = r.choices[argmax_f64_first(&p)].clone();
            }
            r.scores = keys.into_iter().zip(p).collect();
        }
        output.insert(f.name.clone(), r.value.clone());
        fields.insert(f.name.clone(), r);
    }
    Ok((output, fields))
}

/// Everything one decision is assembled from.
pub(crate) struct Assembly<'a> {
    pub compiled: &'a CompiledSchema,
    pub prepared: &'a PreparedContext,
    /// One row of candidate logits per field (empty for a literal field).
    pub rows: Vec<Vec<f32>>,
    /// Per field, the tree logits of a literal field (None for a code field).
    pub literal: Vec<Option<NodeScores>>,
    /// One full-vocabulary summary per code field when `opts.allowed_mass` asked, else empty.
    pub vocab: Vec<VocabRow>,
    /// Decodes the top tokens of the allowed-mass view.
    pub tokenizer: &'a ChatTokenizer,
    /// What the prefill + score run did (a whole group's counts when grouped).
    pub stats: &'a RunStats,
    pub temperature: Temperature,
    pub opts: &'a ScoreOptions,
    /// When `timings_ms.total` starts counting.
    pub start: Instant,
}

impl Assembly<'_> {
    /// The decision, with telemetry and (when asked for) the debug prompt.
    pub fn decision(self) -> Result<Decision, AssembleError> {
        let t = Instant::now();
        let (output, mut fields) = assemble_fields(
            self.compiled,
            &self.rows,
            &self.literal,
            &self.temperature,
            self.opts.literal_value,
        )?;
        if self.opts.allowed_mass.is_some() {
            let code_fields = self
                .compiled
                .fields()
                .iter()
                .filter(|f| f.literal.is_none())
                .count();
            if self.vocab.len() != code_fields {
                return Err(AssembleError::VocabCount {
                    fields: code_fields,
                    summaries: self.vocab.len(),
                });
            }
            let code_results = self
                .compiled
                .fields()
                .iter()
                .zip(fields.values_mut())
                .filter(|(f, _)| f.literal.is_none());
            for ((field, result), vocab) in code_results.zip(&self.vocab) {
                let own: Vec<f32> = result.logits.values().copied().collect();
                debug_assert_eq!(own.len(), field.codes.len());
                result.allowed_mass = Some(allowed_mass(&own, vocab, self.tokenizer));
            }
        }
        let split = self.prepared.split();
        let mut tel = telemetry(
            self.opts.mode,
            self.opts.field_batch_size,
            (
                split.prefix_ids.len(),
                split.suffix_ids.iter().map(Vec::len).collect(),
            ),
            self.compiled.candidates().len(),
            self.stats,
        );
        tel.layout = self.prepared.layout();
        tel.timings_ms.render = self.prepared.render_ms();
        tel.timings_ms.split = self.prepared.split_ms();
        tel.timings_ms.assemble = t.elapsed().as_secs_f64() * 1e3;
        tel.timings_ms.total = self.start.elapsed().as_secs_f64() * 1e3;
        let prompt = self.opts.include_prompt.then(|| PromptDebug {
            prefix_text: split.prefix_text.clone(),
            prefix_ids: split.prefix_ids.clone(),
            // one suffix per field by construction of the split (checked above via the rows)
            rows: self
                .compiled
                .fields()
                .iter()
                .zip(&split.suffix_ids)
                .map(|(f, s)| RowDebug {
                    field: f.name.clone(),
                    selector: f.selector.clone(),
                    suffix_ids: s.clone(),
                    code_ids: f.code_ids.clone(),
                    choice_ids: f
                        .literal
                        .as_ref()
                        .map(|l| l.paths.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            candidate_ids: self.compiled.candidates().to_vec(),
        });
        Ok(Decision {
            output,
            fields,
            temperature: self.temperature,
            telemetry: tel,
            prompt,
        })
    }
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
        layout: Layout::ContextFirst,
        tree_calls: stats.tree_calls,
        tree_nodes: stats.tree_nodes,
        tree_projected: stats.tree_projected,
        tree_packing: stats.tree_packing,
        timings_ms: StageTimings {
            prefill: stats.prefill_ms,
            score: stats.score_ms,
            ..StageTimings::default()
        },
        group: None,
    }
}
