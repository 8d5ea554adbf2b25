//! Temperature policy: which temperature a decision uses, and where it comes from.
//!
//! Unspecified temperature → the checkpoint's calibrated default when the registry knows the
//! checkpoint, else 1. The registry (engine/data/calibration.json, extendable with a user file)
//! matches a model id plus the exact 40-hex revision (or any revision where the entry says so),
//! or an adapter SHA-256 recorded in a local merge's READY.json. A short hash never matches.
//! An explicit T = 1 on a calibrated checkpoint is refused unless the caller allows it.
//! Temperature scales candidate logits once, before softmax; raw logits and argmax never change.

use serde::{Deserialize, Serialize};
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
    #[serde(default)]
    pub note: Option<String>,
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
pub enum TemperatureSource {
    /// The caller set it.
    Explicit,
    /// The registry's calibrated default for this checkpoint.
    Calibrated {
        model_id: String,
        matched_by: String,
    },
    /// No calibration known: T = 1.
    Default,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Temperature {
    pub value: f64,
    pub source: TemperatureSource,
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
        let extra: CalibrationRegistry =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        for e in &extra.entries {
            if !(e.temperature.is_finite() && e.temperature > 0.0) {
                return Err(bad(format!(
                    "entry {} has temperature {}",
                    e.model_id, e.temperature
                )));
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

    /// The calibrated default for `id`, with what matched.
    pub fn lookup(&self, id: &CheckpointIdentity) -> Option<(f64, TemperatureSource)> {
        self.entries.iter().find_map(|e| {
            let calibrated = |how: String| {
                Some((
                    e.temperature,
                    TemperatureSource::Calibrated {
                        model_id: e.model_id.clone(),
                        matched_by: how,
                    },
                ))
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
        let calibrated = self.lookup(id);
        match requested {
            None => Ok(match calibrated {
                Some((value, source)) => Temperature { value, source },
                None => Temperature {
                    value: 1.0,
                    source: TemperatureSource::Default,
                },
            }),
            Some(value) if !(value.is_finite() && value > 0.0) => {
                Err(CalibrationError::NotPositive { value })
            }
            Some(value) => {
                if let (Some((cal, TemperatureSource::Calibrated { model_id, .. })), false) =
                    (&calibrated, allow_uncalibrated)
                {
                    if value == 1.0 {
                        return Err(CalibrationError::UncalibratedRefused {
                            model_id: model_id.clone(),
                            calibrated: *cal,
                        });
                    }
                }
                Ok(Temperature {
                    value,
                    source: TemperatureSource::Explicit,
                })
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
