//! `--resume` continues only the job that wrote the output.
//!
//! Every record carries its provenance. Before a resumed job appends anything, each existing
//! record's provenance is compared with this run's on the keys that decide the results:
//! [`RESUME_KEYS`] (model, revision, fingerprint, dtype, mode, temperature, the job's default
//! schema hash, its `--shard`, absent in unsharded jobs, the set `FORKSCORE_*` switches, and
//! the prompt `--layout`, absent for the default one). A record that differs — or has no provenance — refuses the resume, naming the
//! record, the key and both values; `--resume-any-provenance` overrides (the file then mixes
//! runs, which its records still say).

use serde_json::{Map, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Provenance keys a resumed job must share with the records it continues.
pub const RESUME_KEYS: &[&str] = &[
    "model_id",
    "revision",
    "fingerprint",
    "dtype",
    "mode",
    "temperature",
    "default_schema_hash",
    "shard",
    "switches",
    "layout",
];

#[derive(Debug, thiserror::Error)]
pub enum ProvenanceMismatch {
    #[error("--resume: record {record} of {path} was written with {key} = {found}, this run has {key} = {run}; resuming would mix two runs in one file (use another --output, or --resume-any-provenance to continue anyway)")]
    Differs {
        path: PathBuf,
        record: u64,
        key: &'static str,
        found: String,
        run: String,
    },
    #[error("--resume: record {record} of {path} has no provenance, so it cannot be shown to come from this run (use --resume-any-provenance to continue anyway)")]
    Missing { path: PathBuf, record: u64 },
    #[error("--resume: cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Compare every record of `path` with this run's provenance `run` on [`RESUME_KEYS`].
/// Streams the file (one record in memory at a time).
pub fn check_resume(path: &Path, run: &Map<String, Value>) -> Result<(), ProvenanceMismatch> {
    let io = |source| ProvenanceMismatch::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    for (i, line) in BufReader::new(file).split(b'\n').enumerate() {
        let line = line.map_err(io)?;
        let record = i as u64 + 1;
        // resume.rs has already checked that every record is a JSON object with a line number
        let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
        let Some(found) = super::openai::record_provenance(&v) else {
            return Err(ProvenanceMismatch::Missing {
                path: path.to_path_buf(),
                record,
            });
        };
        for &key in RESUME_KEYS {
            let mine = run.get(key).unwrap_or(&Value::Null);
            let theirs = found.get(key).unwrap_or(&Value::Null);
            if mine != theirs {
                return Err(ProvenanceMismatch::Differs {
                    path: path.to_path_buf(),
                    record,
                    key,
                    found: theirs.to_string(),
                    run: mine.to_string(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_resume_key_is_compared_table() {
        let run = json!({"model_id": "m", "revision": "r", "fingerprint": "f", "dtype": "f32",
                         "mode": "parallel", "temperature": 1.0, "default_schema_hash": "s",
                         "device": "cpu"});
        let run = run.as_object().unwrap().clone();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let mut cases: Vec<(Value, Option<&str>)> = vec![
            (Value::Object(run.clone()), None),
            // the device may change between runs: results do not depend on it
            (json!({"device": "cuda:0"}), None),
        ];
        for key in RESUME_KEYS {
            cases.push((json!({ *key: "other" }), Some(key)));
        }
        for (edit, want) in cases {
            let mut prov = run.clone();
            for (k, v) in edit.as_object().unwrap() {
                prov.insert(k.clone(), v.clone());
            }
            let rec = json!({"id": 1, "line": 1, "provenance": prov});
            std::fs::write(&p, format!("{rec}\n{rec}\n")).unwrap();
            let got = check_resume(&p, &run);
            match want {
                None => assert!(got.is_ok(), "{edit}: {got:?}"),
                Some(k) => {
                    let msg = got.err().map(|e| e.to_string()).unwrap_or_default();
                    assert!(msg.contains(&format!("{k} = ")), "{edit}: {msg}");
                }
            }
        }
        std::fs::write(&p, "{\"id\":1,\"line\":1}\n").unwrap();
        assert!(matches!(
            check_resume(&p, &run),
            Err(ProvenanceMismatch::Missing { record: 1, .. })
        ));
    }
}
