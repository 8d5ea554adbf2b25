//! Provenance recorded with every result: which forkscore, which checkpoint (id, revision or
//! folder fingerprint), on which device and dtype, with which template, mode and temperature,
//! for which schema.

use forkscore_backends::{Architecture, DType, Device, Quantization};
use forkscore_engine::template::TemplateOrigin;
use serde::Serialize;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const GIT_COMMIT: &str = env!("FORKSCORE_GIT_COMMIT");

/// What identifies the model side of a run (fixed for a loaded model).
#[derive(Debug, Clone, Serialize)]
pub struct ModelProvenance {
    pub forkscore_version: &'static str,
    pub forkscore_commit: &'static str,
    pub model_id: String,
    pub revision: String,
    /// `folder`, `hf_cache` or `gguf`.
    pub source: String,
    /// Hash of config, weight index/headers and tokenizer (local folders and snapshots alike);
    /// for a GGUF file, of its header and tensor infos, its size, and the tokenizer files
    /// beside it.
    pub fingerprint: String,
    pub architecture: Architecture,
    pub dtype: DType,
    pub device: Device,
    /// In-memory quantization of the linear weights (`q8_0`, `q4k`, `bf16`, `int8`); absent when unquantized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// `--deterministic` on a GPU (every context prefilled and scored in calls of its own):
    /// present, `true`, only when it applied.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deterministic: bool,
    pub chat_template: TemplateOrigin,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_sha256: Option<String>,
    /// GGUF checkpoints only: where the text side came from and what the load converted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gguf: Option<GgufProvenance>,
    /// The set `FORKSCORE_*` switches that can change a result (name → value; the switchboard's
    /// compute-path and tuning switches); absent when none is set.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub switches: std::collections::BTreeMap<String, String>,
}

impl ModelProvenance {
    /// The provenance as the JSON object every result's `provenance` starts from (see
    /// [`crate::result::decision_provenance`]).
    pub fn object(&self) -> serde_json::Result<serde_json::Map<String, serde_json::Value>> {
        match serde_json::to_value(self)? {
            serde_json::Value::Object(m) => Ok(m),
            other => Err(serde::ser::Error::custom(format!(
                "model provenance serialized to {other}, not an object"
            ))),
        }
    }
}

/// What provenance records about a GGUF checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct GgufProvenance {
    /// `gguf_metadata` or `tokenizer_json` (a tokenizer.json beside the file wins).
    pub tokenizer: crate::gguf_tokenizer::TextSource,
    /// `beside_file`, `gguf_metadata` or `built_in`.
    pub chat_template: crate::gguf_tokenizer::TextSource,
    /// Stored tensors per ggml type.
    pub stored_types: std::collections::BTreeMap<String, usize>,
    /// Tensors stored in a block format and held dense in the compute dtype (embedding, output
    /// head, …), per stored type; the linear weights of a block format stay in it.
    pub dequantized_at_load: std::collections::BTreeMap<String, usize>,
}

/// Per-record provenance of a batch job: the model side plus the job's request side (typed;
/// serialized once per job by [`BatchProvenance::record`]).
#[derive(Debug, Clone, Serialize)]
pub struct BatchProvenance<'a> {
    #[serde(flatten)]
    pub model: &'a ModelProvenance,
    pub mode: forkscore_engine::Mode,
    pub batch_mode: crate::batch::BatchMode,
    pub temperature: f64,
    pub temperature_source: &'a forkscore_engine::TemperatureSource,
    /// Hash of the job's default schema (`--schema`), null without one; `--resume` compares it.
    pub default_schema_hash: Option<String>,
    /// `--shard INDEX/COUNT` as `"i/n"`; absent in unsharded jobs. `--resume` compares it, and
    /// `forkscore merge` removes it from the merged records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::batch::shard::Shard>,
    /// The prompt layout (`--layout`), absent for the default context-first one; `--resume`
    /// compares it.
    #[serde(skip_serializing_if = "is_context_first")]
    pub layout: forkscore_engine::Layout,
    /// How a literal field's value is selected (`--literal-value`), absent for the default
    /// `argmax`; `--resume` compares it.
    #[serde(skip_serializing_if = "is_argmax")]
    pub literal_value: forkscore_engine::LiteralValue,
}

fn is_context_first(layout: &forkscore_engine::Layout) -> bool {
    *layout == forkscore_engine::Layout::ContextFirst
}

/// The default literal-value rule is not written, so default runs keep the provenance they had
/// before the rule was recorded (and resume against it).
pub(crate) fn is_argmax(rule: &forkscore_engine::LiteralValue) -> bool {
    *rule == forkscore_engine::LiteralValue::Argmax
}

impl BatchProvenance<'_> {
    /// The JSON object every record of the job starts from.
    pub fn record(&self) -> serde_json::Result<RecordProvenance> {
        match serde_json::to_value(self)? {
            serde_json::Value::Object(base) => Ok(RecordProvenance { base }),
            other => Err(serde::ser::Error::custom(format!(
                "batch provenance serialized to {other}, not an object"
            ))),
        }
    }
}

/// [`BatchProvenance`] serialized, ready to take each record's schema hash.
#[derive(Debug, Clone)]
pub struct RecordProvenance {
    base: serde_json::Map<String, serde_json::Value>,
}

impl RecordProvenance {
    /// The job-wide keys (what `--resume` compares with the existing records).
    pub fn base(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.base
    }
    /// The provenance object of one record (`schema_hash` null when the line had no schema).
    pub fn with_schema(&self, schema_hash: Option<&str>) -> serde_json::Value {
        let mut m = self.base.clone();
        m.insert(
            "schema_hash".into(),
            schema_hash.map_or(serde_json::Value::Null, |h| h.into()),
        );
        serde_json::Value::Object(m)
    }
}
