//! The request and response types of the HTTP surface as `utoipa` schemas.
//!
//! The result types themselves (`Decision`, `FieldResult`, `Temperature`, `Telemetry`,
//! `Baseline`, …) are the engine's, which derive `ToSchema` under its `openapi` feature: the
//! document describes exactly what is serialized. The types here are the wrappers the service
//! adds (provenance, error bodies, the OpenAI shapes) and the request bodies. Request bodies are
//! parsed by hand ([`crate::request`], [`crate::openai::request`]: strict JSON, errors naming
//! the path), so their types here only describe them; tests check that their property names
//! are the keys those parsers accept, and that real responses validate against the schemas.

pub mod openai;

use forkscore_engine::generate::Baseline;
use forkscore_engine::{Decision, Mode, TemperatureSource};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Scoring options, the same names and rules as the CLI's flags (the engine's
/// `request_options::OPTIONS`). Every key may be left out
/// (null is not accepted).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// How rows are evaluated (as `--mode`).
    #[schema(nullable = false)]
    pub mode: Option<Mode>,
    /// Probability temperature, finite and > 0 (default: the calibrated one, else 1).
    #[schema(nullable = false, exclusive_minimum = 0.0)]
    pub temperature: Option<f64>,
    #[schema(nullable = false)]
    pub allow_uncalibrated: Option<bool>,
    /// Add the prompt the model read to the result.
    #[schema(nullable = false)]
    pub include_prompt: Option<bool>,
    /// Token bound of the prompt, up to the server's bound.
    #[schema(nullable = false, minimum = 1)]
    pub max_input_tokens: Option<u64>,
    #[schema(nullable = false, minimum = 1, maximum = 65536)]
    pub field_batch_size: Option<u64>,
    /// Per field, the full-vocabulary mass on its allowed codes and the top-K tokens (as
    /// `--allowed-mass`).
    #[schema(nullable = false)]
    pub allowed_mass: Option<bool>,
    /// With `allowed_mass`: tokens listed per field (default 5).
    #[schema(nullable = false, minimum = 0, maximum = 1024)]
    pub top_k: Option<u64>,
    /// How the schema's fields that name no scoring of their own are scored (as `--scoring`;
    /// default `code`).
    #[schema(nullable = false)]
    pub scoring: Option<ScoringName>,
    /// How a literal field's value is chosen (as `--literal-value`; default `argmax`).
    #[schema(nullable = false)]
    pub literal_value: Option<LiteralValueName>,
    /// Where the context sits in the prompt (as `--layout`; default `context-first`):
    /// `fields-first` puts the catalogue of fields first, so the server prefills it once per
    /// schema and each request only its context.
    #[schema(nullable = false)]
    pub layout: Option<LayoutName>,
}

/// Where the context sits in the prompt.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutName {
    /// The context, then the catalogue of fields.
    ContextFirst,
    /// The catalogue of fields, then the context.
    FieldsFirst,
}

/// How a literal field's value is chosen.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LiteralValueName {
    /// The choice with the largest reported probability.
    Argmax,
    /// The constrained greedy decoder's choice.
    Greedy,
}

/// The scoring methods a request may name.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ScoringName {
    Code,
    Literal,
    LiteralFirstToken,
    LiteralSumLoglik,
    LiteralMeanLoglik,
    Json,
}

impl ScoringName {
    pub const ALL: [ScoringName; 6] = [
        ScoringName::Code,
        ScoringName::Literal,
        ScoringName::LiteralFirstToken,
        ScoringName::LiteralSumLoglik,
        ScoringName::LiteralMeanLoglik,
        ScoringName::Json,
    ];
}

/// `POST /v1/score`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScoreRequest {
    pub context: String,
    /// A forkscore schema: the flat form (`{"field": {"type": "enum", "choices": [...]}}`) or
    /// the JSON Schema form (an object whose properties are enums or booleans).
    pub schema: BTreeMap<String, Value>,
    #[schema(nullable = false)]
    pub options: Option<Options>,
}

/// `POST /v1/decide_many`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideManyRequest {
    /// At most the server's `--max-contexts-per-request`.
    #[schema(min_items = 1)]
    pub contexts: Vec<String>,
    /// A forkscore schema: the flat form (`{"field": {"type": "enum", "choices": [...]}}`) or
    /// the JSON Schema form (an object whose properties are enums or booleans).
    pub schema: BTreeMap<String, Value>,
    #[schema(nullable = false)]
    pub options: Option<Options>,
}

/// `POST /v1/ask`: scored as one boolean field `answer` described by the question.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AskRequest {
    pub context: String,
    pub question: String,
    #[schema(nullable = false)]
    pub options: Option<Options>,
}

/// `POST /v1/generate`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub context: String,
    /// A forkscore schema: the flat form (`{"field": {"type": "enum", "choices": [...]}}`) or
    /// the JSON Schema form (an object whose properties are enums or booleans).
    pub schema: BTreeMap<String, Value>,
    #[schema(nullable = false)]
    pub options: Option<Options>,
    /// Most tokens generated (default: the schema's longest answer + 16).
    #[schema(nullable = false, minimum = 1, maximum = 4096)]
    pub max_new_tokens: Option<u64>,
}

/// Where a result came from: the loaded model's provenance (`model_id`, `revision`, the
/// checkpoint's fingerprint, … as `forkscore score` records it), then the request's side.
#[derive(Debug, Serialize, ToSchema)]
pub struct Provenance {
    pub mode: Mode,
    /// The temperature the decision used.
    pub temperature: f64,
    pub temperature_source: TemperatureSource,
    /// How the literal fields' values were chosen: present, `greedy`, only when the options
    /// asked `literal_value: greedy` (absent under the default `argmax`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub literal_value: Option<LiteralValueName>,
    /// SHA-256 of the compiled schema.
    pub schema_hash: String,
    /// The loaded model's provenance keys.
    #[serde(flatten)]
    pub model: BTreeMap<String, Value>,
}

/// One decision: what `forkscore score` prints. `output` holds the chosen value per field,
/// `fields.<name>` its choices, per-choice probabilities (`scores`) and logits.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScoreResult {
    #[serde(flatten)]
    pub decision: Decision,
    pub provenance: Provenance,
}

/// What is wrong and where.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// The rule broken (`invalid_json`, `missing_schema`, `timeout`, …).
    pub kind: String,
    /// The JSON path in the request (`<root>` for the whole body).
    pub path: String,
    pub message: String,
}

/// One context's result, or the error of that context alone.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ResultOrError {
    Result(Box<ScoreResult>),
    Error(ErrorBody),
}

/// `POST /v1/decide_many`: one entry per context, in input order.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecideManyResponse {
    pub results: Vec<ResultOrError>,
}

/// `POST /v1/generate`: forkscore's decision beside a greedy generation of the JSON answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct GenerateResult {
    #[serde(flatten)]
    pub baseline: Baseline,
    /// How the generation decoded (greedy).
    pub decoding: String,
    pub provenance: Provenance,
}

/// `GET /health`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// The served model's id (null when the checkpoint names none).
    pub model: Option<String>,
    pub revision: Option<String>,
    /// Jobs waiting for the model thread.
    pub queue_depth: i64,
}

/// `GET /v1/presets`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Presets {
    pub presets: Vec<Preset>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Preset {
    pub name: String,
    /// A forkscore schema: the flat form (`{"field": {"type": "enum", "choices": [...]}}`) or
    /// the JSON Schema form (an object whose properties are enums or booleans).
    pub schema: BTreeMap<String, Value>,
}
