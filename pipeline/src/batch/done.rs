//! The completion marker of a batch job: `OUTPUT.done.json`, a small JSON file next to the
//! output that exists only while the output is the complete result of one finished job.
//!
//! - Written ([`write`]) after the job has read its input to the end, written and flushed (and
//!   synced) its last record, and checked that the output holds one record per input line it
//!   owns; atomically: a fixed temporary name next to it (the job holds the output's lock, so no
//!   other job uses that name), synced, then renamed over the marker.
//! - Removed ([`invalidate`]) by every job before it touches the output (`--force` truncating,
//!   `--resume` cutting a torn line or appending, a fresh job creating it): a job interrupted
//!   after that point leaves no marker, whatever the output ends on.
//! - Read ([`read`]) by `forkscore merge`, which refuses a shard without a valid one.
//!
//! A sidecar, not a trailer record, so the output stays the documented one-record-per-input-line
//! JSONL for every reader (`--resume`, `merge`, the Python package, users' own tools).
//! Outputs that are not regular files (a pipe, `/dev/stdout`) get no marker: nothing can be
//! written next to them. See [`DoneMarker`] for the content.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::shard::Shard;

/// The `format` of a marker this version writes and accepts.
pub const FORMAT: &str = "forkscore-batch-done/1";

/// The suffix appended to the output's file name: `out.jsonl` → `out.jsonl.done.json`.
pub const SUFFIX: &str = ".done.json";

/// A marker larger than this is not one (a marker is a few KiB: mostly the provenance).
const MAX_MARKER_BYTES: u64 = 1 << 20;

/// What a finished job vouches for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoneMarker {
    /// Always [`FORMAT`].
    pub format: String,
    /// The output's file name when the marker was written (for people reading the marker).
    pub output: String,
    /// The output's size in bytes when the job finished: `merge` refuses a file of another size
    /// (appended to or cut after the job finished).
    pub output_bytes: u64,
    /// Records in the output: one per input line the job owns (all non-blank lines for an
    /// unsharded job, its share for `--shard`).
    pub records: u64,
    /// `--shard INDEX/COUNT`, null for an unsharded job.
    pub shard: Option<Shard>,
    /// The input as the job read it.
    pub input: InputFacts,
    /// The job's provenance (the keys every record carries but `schema_hash` and `shard`).
    pub provenance: Map<String, Value>,
}

/// The input of a finished job, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFacts {
    /// `--input` as given (for people; shards on different machines may name it differently).
    pub path: String,
    /// SHA-256 (hex) of every byte read from the input, read to its end.
    pub sha256: String,
    /// Physical lines (a last line without a newline counts).
    pub lines: u64,
    /// Non-blank lines: the records an unsharded job writes, the sum of all shards' records.
    pub records: u64,
}

/// Why a marker could not be removed, written or read.
#[derive(Debug, thiserror::Error)]
pub enum DoneError {
    #[error("{output} has no completion marker ({marker} is missing): the batch job that wrote it did not finish — it was interrupted (killed, out of memory, --fail-fast) or is still running; finish it by running the same `forkscore batch` command with --resume, then merge again")]
    Missing { output: PathBuf, marker: PathBuf },
    #[error("{marker} is not a valid completion marker ({reason}); finish the job by running the same `forkscore batch` command with --resume, which writes a new one")]
    Invalid { marker: PathBuf, reason: String },
    #[error("completion marker {marker}: {source}")]
    Io {
        marker: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The marker path of `output`: its path with [`SUFFIX`] appended.
pub fn marker_path(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(SUFFIX);
    PathBuf::from(s)
}

/// The temporary name a marker is written under before its rename: `.NAME.done.json.tmp` in
/// the same folder.
fn temp_path(marker: &Path) -> PathBuf {
    let name = marker
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    marker.with_file_name(format!(".{name}.tmp"))
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Sync the folder holding `path`, so a rename or removal in it survives a power cut. Best
/// effort: some filesystems refuse to sync a directory.
fn sync_parent(path: &Path) {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Remove `output`'s marker (and a temporary one a killed job left). Call with the output's
/// lock held, before anything changes the output.
pub fn invalidate(output: &Path) -> Result<(), DoneError> {
    let marker = marker_path(output);
    let io = |source| DoneError::Io {
        marker: marker.clone(),
        source,
    };
    remove_if_present(&marker).map_err(io)?;
    remove_if_present(&temp_path(&marker)).map_err(io)?;
    sync_parent(&marker);
    Ok(())
}

/// Write `done` as `output`'s marker (temporary file, sync, rename). Call with the output's
/// lock held, after the output's last record is synced. Returns the marker's path.
pub fn write(output: &Path, done: &DoneMarker) -> Result<PathBuf, DoneError> {
    let marker = marker_path(output);
    let tmp = temp_path(&marker);
    let io = |source| DoneError::Io {
        marker: marker.clone(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(done).map_err(|e| DoneError::Invalid {
        marker: marker.clone(),
        reason: e.to_string(),
    })?;
    text.push(b'\n');
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&text).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &marker).map_err(io)?;
    sync_parent(&marker);
    Ok(marker)
}

/// Read and check `output`'s marker: present, at most 1 MiB, JSON of this [`FORMAT`] with
/// exactly the keys of [`DoneMarker`] and a 64-hex-digit input hash.
pub fn read(output: &Path) -> Result<DoneMarker, DoneError> {
    let marker = marker_path(output);
    let file = match std::fs::File::open(&marker) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DoneError::Missing {
                output: output.to_path_buf(),
                marker,
            })
        }
        Err(source) => return Err(DoneError::Io { marker, source }),
    };
    let mut bytes = Vec::new();
    file.take(MAX_MARKER_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| DoneError::Io {
            marker: marker.clone(),
            source,
        })?;
    let invalid = |reason: String| DoneError::Invalid {
        marker: marker.clone(),
        reason,
    };
    if bytes.len() as u64 > MAX_MARKER_BYTES {
        return Err(invalid(format!("larger than {MAX_MARKER_BYTES} bytes")));
    }
    let done: DoneMarker = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if done.format != FORMAT {
        return Err(invalid(format!(
            "format {:?}, expected {FORMAT:?}",
            done.format
        )));
    }
    let hex_ok = done.input.sha256.len() == 64
        && done
            .input
            .sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex_ok {
        return Err(invalid(format!(
            "input.sha256 {:?} is not a SHA-256",
            done.input.sha256
        )));
    }
    if done.input.records > done.input.lines {
        return Err(invalid(format!(
            "input.records {} exceeds input.lines {}",
            done.input.records, done.input.lines
        )));
    }
    Ok(done)
}

/// A reader that hashes every byte it passes on (SHA-256) and counts them.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The hex SHA-256 of the bytes read so far, and their count.
    pub fn finish(self) -> (String, u64) {
        (hex::encode(self.hasher.finalize()), self.bytes)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DoneMarker {
        DoneMarker {
            format: FORMAT.into(),
            output: "out.jsonl".into(),
            output_bytes: 10,
            records: 2,
            shard: Some(Shard::new(1, 3).unwrap()),
            input: InputFacts {
                path: "in.jsonl".into(),
                sha256: hex::encode(Sha256::digest(b"x")),
                lines: 3,
                records: 2,
            },
            provenance: Map::new(),
        }
    }

    #[test]
    fn written_markers_read_back_and_invalidate_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        assert!(matches!(read(&out), Err(DoneError::Missing { .. })));
        let path = write(&out, &sample()).unwrap();
        assert_eq!(path, dir.path().join("out.jsonl.done.json"));
        assert_eq!(read(&out).unwrap(), sample());
        assert!(
            !temp_path(&path).exists(),
            "the temporary name is renamed away"
        );
        std::fs::write(temp_path(&path), b"half").unwrap();
        invalidate(&out).unwrap();
        assert!(!path.exists() && !temp_path(&path).exists());
        invalidate(&out).unwrap();
    }

    #[test]
    fn broken_markers_are_invalid_table() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let good = serde_json::to_value(sample()).unwrap();
        let edits: &[(&str, Value)] = &[
            ("format", "forkscore-batch-done/0".into()),
            ("records", "two".into()),
            ("shard", "3/3".into()),
            ("extra", 1.into()),
        ];
        for (key, v) in edits {
            let mut m = good.clone();
            m[*key] = v.clone();
            std::fs::write(marker_path(&out), m.to_string()).unwrap();
            assert!(
                matches!(read(&out), Err(DoneError::Invalid { .. })),
                "{key}"
            );
        }
        let mut m = good.clone();
        m["input"]["sha256"] = "abc".into();
        std::fs::write(marker_path(&out), m.to_string()).unwrap();
        assert!(matches!(read(&out), Err(DoneError::Invalid { .. })));
        std::fs::write(marker_path(&out), "{\"format\":").unwrap();
        assert!(matches!(read(&out), Err(DoneError::Invalid { .. })));
    }

    #[test]
    fn the_hashing_reader_hashes_what_passes() {
        let mut r = HashingReader::new(&b"hello\nworld"[..]);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        let (h, n) = r.finish();
        assert_eq!(n, 11);
        assert_eq!(h, hex::encode(Sha256::digest(b"hello\nworld")));
    }
}
