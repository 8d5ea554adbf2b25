//! Opening the output file: never overwrite by accident, and continue an interrupted job.
//!
//! In: the output path and a policy (fresh / `--force` / `--resume`). Out: the file opened for
//! append and, when resuming, the [`ResumePoint`] — the input line number and id of the last
//! complete record.
//!
//! Invariants: a fresh job refuses an existing non-empty output; `--force` truncates it;
//! `--resume` first cuts a torn last line (a record without its newline, left by a crash),
//! then checks that every kept record is a JSON object with a `line` number, in increasing
//! order. Because records are written in input order, one per line, "lines up to the last
//! record's `line`" is exactly the done set: resuming continues right after it, so no id is
//! duplicated or skipped. The input side of the same check ([`forkscore_frontend::batch::prepare::ResumeCheck`]: the input's line
//! at the output's last record carries the same id) runs in the prepare stage.

use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// What to do with an existing output file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputPolicy {
    /// Refuse an existing non-empty file.
    Fresh,
    /// Truncate an existing file.
    Force,
    /// Continue after its last complete record.
    Resume,
}

/// Where an interrupted job stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePoint {
    /// Input line number of the last complete record.
    pub last_line: u64,
    /// Its id (null for a line that had none).
    pub last_id: Value,
    /// Complete records kept.
    pub records: u64,
    /// Bytes of a torn last line that were cut.
    pub truncated_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("{path} already exists and is not empty; pass --resume to continue it or --force to overwrite it")]
    Exists { path: PathBuf },
    #[error("cannot use output {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot resume {path}: record {record} is not a batch output record ({reason})")]
    NotARecord {
        path: PathBuf,
        record: u64,
        reason: String,
    },
}

/// Open `path` for appending under `policy`.
pub fn open_output(
    path: &Path,
    policy: OutputPolicy,
) -> Result<(File, Option<ResumePoint>), ResumeError> {
    let io = |source| ResumeError::Io {
        path: path.to_path_buf(),
        source,
    };
    let existing = std::fs::metadata(path).map(|m| m.len()).ok();
    match (policy, existing) {
        (OutputPolicy::Fresh, Some(len)) if len > 0 => {
            return Err(ResumeError::Exists {
                path: path.to_path_buf(),
            })
        }
        (OutputPolicy::Force, Some(_)) => {
            File::create(path).map_err(io)?;
        }
        _ => {}
    }
    let point = match (policy, existing) {
        (OutputPolicy::Resume, Some(len)) if len > 0 => scan(path)?,
        _ => None,
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    Ok((file, point))
}

/// Cut a torn last line, then read the last complete record.
fn scan(path: &Path) -> Result<Option<ResumePoint>, ResumeError> {
    let io = |source| ResumeError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let keep = complete_len(&mut file, len).map_err(io)?;
    if keep < len {
        file.set_len(keep).map_err(io)?;
        file.sync_data().map_err(io)?;
    }
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut last: Option<(u64, Value)> = None;
    let mut records = 0u64;
    for line in BufReader::new(file).split(b'\n') {
        let line = line.map_err(io)?;
        records += 1;
        let bad = |reason: String| ResumeError::NotARecord {
            path: path.to_path_buf(),
            record: records,
            reason,
        };
        let v: Value = serde_json::from_slice(&line).map_err(|e| bad(e.to_string()))?;
        // native records hold `line` and `id`; OpenAI-shaped ones `forkscore.line`, `custom_id`
        let n = forkscore_frontend::batch::openai::record_line(&v)
            .ok_or_else(|| bad("no \"line\" number".into()))?;
        if let Some((prev, _)) = &last {
            if n <= *prev {
                return Err(bad(format!("line {n} follows line {prev}")));
            }
        }
        last = Some((n, forkscore_frontend::batch::openai::record_id(&v)));
    }
    Ok(last.map(|(last_line, last_id)| ResumePoint {
        last_line,
        last_id,
        records,
        truncated_bytes: len - keep,
    }))
}

/// Length of the file up to and including its last newline.
fn complete_len(file: &mut File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_lines_are_cut_and_existing_outputs_are_protected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        std::fs::write(
            &p,
            "{\"id\":\"a\",\"line\":1}\n{\"id\":7,\"line\":3}\n{\"id\":\"c\",\"li",
        )
        .unwrap();
        assert!(matches!(
            open_output(&p, OutputPolicy::Fresh),
            Err(ResumeError::Exists { .. })
        ));
        let (_, point) = open_output(&p, OutputPolicy::Resume).unwrap();
        let point = point.unwrap();
        assert_eq!(
            (point.last_line, point.last_id, point.records),
            (3, serde_json::json!(7), 2)
        );
        assert_eq!(point.truncated_bytes, "{\"id\":\"c\",\"li".len() as u64);
        assert!(std::fs::read_to_string(&p)
            .unwrap()
            .ends_with("\"line\":3}\n"));
        let (_, none) = open_output(&p, OutputPolicy::Force).unwrap();
        assert!(none.is_none() && std::fs::read_to_string(&p).unwrap().is_empty());
        let (_, none) = open_output(&dir.path().join("new.jsonl"), OutputPolicy::Resume).unwrap();
        assert!(none.is_none());
        std::fs::write(&p, "{\"line\":2}\n{\"line\":1}\n").unwrap();
        assert!(matches!(
            open_output(&p, OutputPolicy::Resume),
            Err(ResumeError::NotARecord { record: 2, .. })
        ));
    }
}
