//! `--resume` continues only the job that wrote the output.
//!
//! Every record carries its provenance. Before a resumed job appends anything, each existing
//! record's provenance is compared with this run's on the keys that decide the results:
//! [`RESUME_KEYS`] (model, revision, fingerprint, dtype, mode, temperature, the job's default
//! schema hash, its `--shard`, absent in unsharded jobs, the set `FORKSCORE_*` switches, the
//! prompt `--layout`, absent for the default one, the `--literal-value` rule, absent for the
//! default `argmax`, and where the temperature came from). A record that differs — or has no
//! provenance — refuses the resume, naming the record, the key and both values;
//! `--resume-any-provenance` overrides (the file then mixes runs, which its records still say).
//!
//! Every key but `temperature_source` must be equal as written (a key absent on both sides is
//! equal, so a record written before a key was recorded resumes against a run that leaves it
//! out). `temperature_source` is compared on what decides a result, [`calibration_identity`]:
//! its `kind` (`explicit`, `calibrated`, `default`), the SHA-256 of the calibration file the
//! entry came from (absent for the built-in registry), and the names of the fields with a
//! per-field calibration. The file's SHA-256 covers every temperature and content-free
//! probability in it, so a file with other calibrations under the same path is refused. The
//! file's path is left out (the same file may move or be named relative to another folder
//! between runs), and so is `matched_by` (how the entry was found: the checkpoint is already
//! compared through the model id, revision and fingerprint). The entry's temperature is the
//! `temperature` key.
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
    "literal_value",
    // compared on its calibration_identity only
    "temperature_source",
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
            if differs(key, mine, theirs) {
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

/// Whether the values of `key` in two provenances would give different results.
fn differs(key: &str, mine: &Value, theirs: &Value) -> bool {
    match key {
        "temperature_source" => calibration_identity(mine) != calibration_identity(theirs),
        _ => mine != theirs,
    }
}

/// The part of a `temperature_source` that decides results: `kind`, the calibration file's
/// `sha256` and the per-field calibrated `fields` (each null when absent). A value that is not
/// an object (an absent key: null) is compared as it is.
pub fn calibration_identity(source: &Value) -> Value {
    let Value::Object(m) = source else {
        return source.clone();
    };
    let get = |v: Option<&Value>| v.cloned().unwrap_or(Value::Null);
    serde_json::json!({
        "kind": get(m.get("kind")),
        "sha256": get(m.get("file").and_then(|f| f.get("sha256"))),
        "fields": get(m.get("fields")),
    })
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
        let run = run.as_object().expect("a provenance object").clone();
        let dir = tempfile::tempdir().expect("temporary folder");
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

    fn calibrated(file: &str, sha256: &str, fields: &[&str]) -> Value {
        json!({"kind": "calibrated", "model_id": "m", "matched_by": "model id (any revision)",
               "file": {"file": file, "sha256": sha256}, "fields": fields})
    }

    #[test]
    fn the_temperature_source_is_compared_on_what_decides_results_table() {
        let run_source = calibrated("/a/cal.json", "aa", &["topic"]);
        let cases: Vec<(&str, Value, bool)> = vec![
            ("the same", run_source.clone(), true),
            (
                "the same file content at another path",
                calibrated("/b/c.json", "aa", &["topic"]),
                true,
            ),
            (
                "matched another way",
                {
                    let mut v = run_source.clone();
                    v["matched_by"] = json!("model id + revision 0123");
                    v
                },
                true,
            ),
            (
                "another file content",
                calibrated("/a/cal.json", "bb", &["topic"]),
                false,
            ),
            (
                "other calibrated fields",
                calibrated("/a/cal.json", "aa", &["topic", "urgent"]),
                false,
            ),
            (
                "the built-in registry",
                json!({"kind": "calibrated", "model_id": "m",
                                             "matched_by": "model id (any revision)"}),
                false,
            ),
            (
                "an explicit temperature",
                json!({"kind": "explicit"}),
                false,
            ),
            ("no temperature source", Value::Null, false),
        ];
        let dir = tempfile::tempdir().expect("temporary folder");
        let p = dir.path().join("out.jsonl");
        let run = json!({"model_id": "m", "temperature_source": run_source});
        let run = run.as_object().expect("a provenance object").clone();
        for (name, found, resumes) in cases {
            let mut prov = run.clone();
            prov.insert("temperature_source".into(), found);
            let rec = json!({"id": 1, "line": 1, "provenance": prov});
            std::fs::write(&p, format!("{rec}\n")).expect("write the record");
            match check_resume(&p, &run) {
                Ok(()) => assert!(resumes, "{name}: resumed"),
                Err(e) => {
                    assert!(!resumes, "{name}: {e}");
                    let msg = e.to_string();
                    // the whole values are shown: the paths tell the user which files they were
                    assert!(msg.contains("temperature_source = "), "{name}: {msg}");
                    assert!(msg.contains("/a/cal.json"), "{name}: {msg}");
                }
            }
        }
    }

    #[test]
    fn keys_absent_on_both_sides_are_equal() {
        // a record of a default run written before literal_value was recorded (no key) and a
        // default run now (no key either)
        let run = json!({"model_id": "m", "temperature_source": {"kind": "default"}});
        let run = run.as_object().expect("a provenance object").clone();
        let dir = tempfile::tempdir().expect("temporary folder");
        let p = dir.path().join("out.jsonl");
        let rec = json!({"id": 1, "line": 1, "provenance": run});
        std::fs::write(&p, format!("{rec}\n")).expect("write the record");
        check_resume(&p, &run).expect("resumes");
        let mut greedy = run.clone();
        greedy.insert("literal_value".into(), json!("greedy"));
        let e = check_resume(&p, &greedy).unwrap_err().to_string();
        assert!(
            e.contains("literal_value = null") && e.contains("\"greedy\""),
            "{e}"
        );
    }
}
