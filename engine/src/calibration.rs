//! Temperature policy: which temperature a decision uses, and where it comes from.
//!
//! Unspecified temperature → the checkpoint's calibrated default when the registry knows the
//! checkpoint, else 1. The registry (engine/data/calibration.json, extendable with a user file)
//! matches a model id plus the exact 40-hex revision (or any revision where the entry says so),
//! or an adapter SHA-256 recorded in a local merge's READY.json. A short hash never matches.
//! An explicit T = 1 on a calibrated checkpoint is refused unless the caller allows it.
//! Temperature scales candidate logits once, before softmax; raw logits and argmax never change.
//!
//! An entry may also carry per-field calibrations (`fields`, written by `forkscore calibrate`):
//! for a field listed there, its probabilities are softmax(s / T_field − ln p_cf) over its
//! choices, where `s` are the field's log-scores at T = 1 (a code field's raw logits, a literal
//! field's method log-scores) and `p_cf` the optional content-free probabilities of contextual
//! calibration (Zhao et al. 2021); the field's value is then the argmax of those probabilities.
//! Fields not listed use the entry's `temperature`. An explicit request temperature replaces all
//! of it. Entries read from a file carry the file's path and SHA-256, which provenance names.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

const BUILT_IN: &str = include_str!("../data/calibration.json");

/// One registry entry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct CalibrationEntry {
    pub model_id: String,
    /// Exact 40-hex revision, or `null` for any revision of this model id.
    #[serde(default)]
    pub revision: Option<String>,
    /// Adapter SHA-256 digests (64 hex) that select this entry from a local merge's READY.json.
    #[serde(default)]
    pub adapter_sha256: Vec<String>,
    pub temperature: f64,
    /// Per-field calibrations by field name (absent in older files: every field uses
    /// `temperature`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub fields: IndexMap<String, FieldCalibration>,
    #[serde(default)]
    pub note: Option<String>,
    /// The file this entry was read from (None for the built-in registry).
    #[serde(skip)]
    pub origin: Option<CalibrationOrigin>,
}

/// One field's calibration: its temperature and, optionally, the content-free probabilities of
/// contextual calibration per choice key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldCalibration {
    pub temperature: f64,
    /// Choice key → mean probability of that choice on content-free inputs; the calibrated
    /// probabilities are divided by it and renormalised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_free: Option<IndexMap<String, f64>>,
}

impl FieldCalibration {
    /// Calibrated probabilities from the field's log-scores at T = 1 (`keys[i]` names `s[i]`):
    /// softmax(s / T − ln p_cf) in f64. A key without a content-free probability gets no shift.
    pub fn probabilities(&self, keys: &[String], s: &[f32]) -> Vec<f64> {
        let shifted: Vec<f64> = keys
            .iter()
            .zip(s)
            .map(|(k, &v)| {
                let bias = self
                    .content_free
                    .as_ref()
                    .and_then(|cf| cf.get(k))
                    .map_or(0.0, |p| p.ln());
                f64::from(v) / self.temperature - bias
            })
            .collect();
        let max = shifted.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = shifted.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.into_iter().map(|v| v / sum).collect()
    }
}

/// Where a calibration entry came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CalibrationOrigin {
    pub file: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct CalibrationRegistry {
    pub entries: Vec<CalibrationEntry>,
}

/// What identifies a checkpoint for calibration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckpointIdentity {
    pub model_id: Option<String>,
    pub revision: Option<String>,
    /// From READY.json of a local merge, when present.
    pub adapter_sha256: Option<String>,
}

/// Where the temperature in use came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum TemperatureSource {
    /// The caller set it.
    Explicit,
    /// The registry's calibrated default for this checkpoint.
    Calibrated {
        model_id: String,
        matched_by: String,
        /// The calibration file and its SHA-256 (absent for the built-in registry).
        #[serde(skip_serializing_if = "Option::is_none")]
        file: Option<CalibrationOrigin>,
        /// The fields with their own calibration (absent when none).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        fields: Vec<String>,
    },
    /// No calibration known: T = 1.
    Default,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Temperature {
    pub value: f64,
    pub source: TemperatureSource,
    /// Per-field calibrations that replace `value` for their fields (empty unless a calibrated
    /// entry has some and no explicit temperature was asked).
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    pub fields: IndexMap<String, FieldCalibration>,
}

impl Temperature {
    /// A plain temperature for every field.
    pub fn uniform(value: f64, source: TemperatureSource) -> Temperature {
        Temperature {
            value,
            source,
            fields: IndexMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    #[error("temperature must be a finite number > 0, got {value}")]
    NotPositive { value: f64 },
    #[error("checkpoint {model_id} has a calibrated temperature of {calibrated}; an explicit temperature of 1.0 gives uncalibrated raw probabilities — pass --allow-uncalibrated (API: allow_uncalibrated) if that is intended")]
    UncalibratedRefused { model_id: String, calibrated: f64 },
    #[error("invalid calibration file {path}: {reason}")]
    InvalidFile { path: String, reason: String },
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl CalibrationRegistry {
    /// The registry shipped with forkscore.
    pub fn built_in() -> CalibrationRegistry {
        serde_json::from_str(BUILT_IN)
            .unwrap_or_else(|e| unreachable!("built-in registry is valid JSON: {e}"))
    }

    /// Add the entries of a user calibration file (same format as the built-in one); user
    /// entries are consulted first.
    pub fn extend_from_file(&mut self, path: &Path) -> Result<(), CalibrationError> {
        let bad = |reason: String| CalibrationError::InvalidFile {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut extra: CalibrationRegistry =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let origin = CalibrationOrigin {
            file: path.display().to_string(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
        };
        for e in &mut extra.entries {
            e.origin = Some(origin.clone());
            if !(e.temperature.is_finite() && e.temperature > 0.0) {
                return Err(bad(format!(
                    "entry {} has temperature {}",
                    e.model_id, e.temperature
                )));
            }
            for (name, f) in &e.fields {
                if !(f.temperature.is_finite() && f.temperature > 0.0) {
                    return Err(bad(format!(
                        "entry {} field {name:?} has temperature {}",
                        e.model_id, f.temperature
                    )));
                }
                if let Some((key, p)) = f
                    .content_free
                    .iter()
                    .flatten()
                    .find(|(_, p)| !(p.is_finite() && **p > 0.0 && **p <= 1.0))
                {
                    return Err(bad(format!(
                        "entry {} field {name:?} has content-free probability {p} for {key:?} (must be in (0, 1])",
                        e.model_id
                    )));
                }
            }
            if let Some(r) = &e.revision {
                if !is_hex(r, 40) {
                    return Err(bad(format!(
                        "entry {} revision {r:?} is not 40 hex characters",
                        e.model_id
                    )));
                }
            }
            if let Some(a) = e.adapter_sha256.iter().find(|a| !is_hex(a, 64)) {
                return Err(bad(format!(
                    "entry {} adapter digest {a:?} is not 64 hex characters",
                    e.model_id
                )));
            }
        }
        let mut entries = extra.entries;
        entries.append(&mut self.entries);
        self.entries = entries;
        Ok(())
    }

    /// The calibrated default for `id` (the entry's temperature, its per-field calibrations),
    /// with what matched.
    pub fn lookup(&self, id: &CheckpointIdentity) -> Option<(f64, TemperatureSource)> {
        self.lookup_entry(id).map(|t| (t.value, t.source))
    }

    fn lookup_entry(&self, id: &CheckpointIdentity) -> Option<Temperature> {
        self.entries.iter().find_map(|e| {
            let calibrated = |how: String| {
                Some(Temperature {
                    value: e.temperature,
                    source: TemperatureSource::Calibrated {
                        model_id: e.model_id.clone(),
                        matched_by: how,
                        file: e.origin.clone(),
                        fields: e.fields.keys().cloned().collect(),
                    },
                    fields: e.fields.clone(),
                })
            };
            if let Some(a) = &id.adapter_sha256 {
                if e.adapter_sha256.iter().any(|x| x.eq_ignore_ascii_case(a)) {
                    return calibrated(format!("adapter_sha256 {a}"));
                }
            }
            if id.model_id.as_deref() != Some(e.model_id.as_str()) {
                return None;
            }
            match (&e.revision, &id.revision) {
                (None, _) => calibrated("model id (any revision)".to_string()),
                (Some(want), Some(got)) if is_hex(got, 40) && want.eq_ignore_ascii_case(got) => {
                    calibrated(format!("model id + revision {got}"))
                }
                _ => None,
            }
        })
    }

    /// Resolve the temperature for a request.
    pub fn resolve(
        &self,
        requested: Option<f64>,
        allow_uncalibrated: bool,
        id: &CheckpointIdentity,
    ) -> Result<Temperature, CalibrationError> {
        let calibrated = self.lookup_entry(id);
        match requested {
            None => Ok(match calibrated {
                Some(t) => t,
                None => Temperature::uniform(1.0, TemperatureSource::Default),
            }),
            Some(value) if !(value.is_finite() && value > 0.0) => {
                Err(CalibrationError::NotPositive { value })
            }
            Some(value) => {
                if let (Some(cal), false) = (&calibrated, allow_uncalibrated) {
                    if let (TemperatureSource::Calibrated { model_id, .. }, true) =
                        (&cal.source, value == 1.0)
                    {
                        return Err(CalibrationError::UncalibratedRefused {
                            model_id: model_id.clone(),
                            calibrated: cal.value,
                        });
                    }
                }
                Ok(Temperature::uniform(value, TemperatureSource::Explicit))
            }
        }
    }
}

/// Read the adapter digest from a local merge's `READY.json` (`{"adapter_sha256": "…"}`), if any.
pub fn adapter_sha256_from_ready(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("READY.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("adapter_sha256")?
        .as_str()
        .filter(|s| is_hex(s, 64))
        .map(str::to_ascii_lowercase)
}
