//! Provenance recorded with every result: which forkscore, which checkpoint (id, revision or
//! folder fingerprint), on which device and dtype, with which template, mode and temperature,
//! for which schema.

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
    /// `folder` or `hf_cache`.
    pub source: String,
    /// Hash of config, weight index/headers and tokenizer (local folders and snapshots alike).
    pub fingerprint: String,
    pub architecture: String,
    pub dtype: String,
    pub device: String,
    pub chat_template: TemplateOrigin,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_sha256: Option<String>,
}

/// Per-result provenance: the model side plus the request side.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance<'a> {
    #[serde(flatten)]
    pub model: &'a ModelProvenance,
    pub mode: forkscore_engine::Mode,
    pub temperature: f64,
    pub temperature_source: &'a forkscore_engine::TemperatureSource,
    pub schema_hash: &'a str,
}
