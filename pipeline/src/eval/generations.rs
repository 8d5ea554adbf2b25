//! The generation baseline's own file, `<predictions>.generate.jsonl`, so that
//! `forkscore eval --baseline generate --resume` continues where an interrupted run stopped
//! instead of generating every item again.
//!
//! Line 1 is a header naming what the generations depend on (model, revision, fingerprint,
//! dtype, quantization, the token budget, the prompt layout and the input file); then one
//! [`Generated`] record per labelled item, in input order, appended and flushed as each item
//! finishes. A resumed run reads the records back, cuts a torn last line (a record cut short by
//! the interruption), refuses a file whose header differs from this run's (naming both), and
//! generates only the labelled lines that have no record. The report is computed from all the
//! records, old and new alike; each record keeps its own generation time, so the throughput is
//! the items over the seconds spent generating them, whichever run did it.

use anyhow::{bail, Context, Result};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What generation gave for one labelled line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Generated {
    /// The line of the labelled input.
    pub line: u64,
    pub id: Value,
    /// Whether generation ran (false: the line's request or schema failed before it).
    pub ran: bool,
    /// Why the item has no generated answer.
    pub error: Option<String>,
    pub valid: bool,
    pub generated_tokens: usize,
    /// Seconds spent generating this item.
    pub seconds: f64,
    /// Per labelled field, the generated value (null: missing or invalid).
    pub fields: IndexMap<String, Option<Value>>,
}

/// `<predictions>.generate.jsonl`.
pub fn path_for(predictions: &Path) -> PathBuf {
    let mut name = predictions.as_os_str().to_owned();
    name.push(".generate.jsonl");
    PathBuf::from(name)
}

/// The open generations file: the records already there (by line) and an appender.
pub struct GenerationsFile {
    path: PathBuf,
    file: File,
    pub done: HashMap<u64, Generated>,
}

impl GenerationsFile {
    /// Open `path` for this run's `header`: with `resume`, keep the records of a file written
    /// under the same header (a torn last line is cut; any other unreadable line is an error
    /// naming it); otherwise, or where there is no file yet, start a new one.
    pub fn open(path: &Path, header: &Value, resume: bool) -> Result<Self> {
        let header_line = serde_json::to_string(header)?;
        let mut done = HashMap::new();
        if resume && path.exists() {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let mut keep = 0usize;
            for (i, line) in text.split_inclusive('\n').enumerate() {
                let complete = line.ends_with('\n');
                let body = line.trim_end_matches('\n');
                if !complete {
                    // the interrupted run's last line, cut short: a header means nothing was
                    // generated yet, a record is generated again
                    break;
                }
                if i == 0 {
                    let found: Value = serde_json::from_str(body).with_context(|| {
                        format!("{}: line 1 is not the generations header", path.display())
                    })?;
                    if &found != header {
                        bail!(
                            "--resume: {} was generated under {found}, this run is {header}; use --force to start over",
                            path.display()
                        );
                    }
                    keep += line.len();
                    continue;
                }
                let g: Generated = serde_json::from_str(body).with_context(|| {
                    format!(
                        "{}: line {} is not a generation record",
                        path.display(),
                        i + 1
                    )
                })?;
                done.insert(g.line, g);
                keep += line.len();
            }
            if keep > 0 {
                let file = OpenOptions::new()
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                // appends go to the (new) end
                file.set_len(keep as u64)
                    .with_context(|| format!("cannot cut {}", path.display()))?;
                return Ok(GenerationsFile {
                    path: path.to_path_buf(),
                    file,
                    done,
                });
            }
        }
        let mut file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        writeln!(file, "{header_line}")
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(GenerationsFile {
            path: path.to_path_buf(),
            file,
            done: HashMap::new(),
        })
    }

    /// Append one record and flush it.
    pub fn append(&mut self, g: &Generated) -> Result<()> {
        let line = serde_json::to_string(g)?;
        writeln!(self.file, "{line}")
            .and_then(|_| self.file.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }
}
