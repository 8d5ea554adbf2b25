//! Bounded reads of untrusted checkpoint files, shared by the engine (tokenizer, template) and
//! the backends (config, weights).
//!
//! A checkpoint folder is input like any other: a `tokenizer.json` can be a FIFO that never
//! ends, a `config.json` can be gigabytes. [`read_regular`] reads only regular files (a FIFO or
//! device is refused on its metadata, before an `open` that would block), and no more than a
//! stated number of bytes. Each backend or stage maps [`FileError`] into its own error type.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest `config.json`, `tokenizer_config.json` or chat template read.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Largest `tokenizer.json` read (real ones are 2–20 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// Why a checkpoint file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file exists but is not a regular file, or is over the size limit.
    #[error("{reason}")]
    Refused { path: PathBuf, reason: String },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn refuse(path: &Path, reason: String) -> FileError {
    FileError::Refused {
        path: path.to_path_buf(),
        reason,
    }
}

/// What kind of file `meta` describes, for messages.
pub fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// `Ok(None)` when `path` does not exist; an error when it exists but is not a regular file
/// (checked on the path, before any `open`, so a FIFO cannot block).
pub fn regular_file_len(path: &Path) -> Result<Option<u64>, FileError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(Some(m.len())),
        Ok(m) => Err(refuse(
            path,
            format!(
                "{} is {}; only regular files are read",
                path.display(),
                file_kind(&m)
            ),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FileError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Read a regular file of at most `max` bytes. `Ok(None)` when it does not exist. The size is
/// checked before reading and the read itself stops at `max + 1` bytes (a file that grows
/// while being read is refused too).
pub fn read_regular(path: &Path, max: u64) -> Result<Option<Vec<u8>>, FileError> {
    let Some(len) = regular_file_len(path)? else {
        return Ok(None);
    };
    let too_big = |n: u64| {
        refuse(
            path,
            format!(
                "{} is {n} bytes, over the limit of {max} bytes",
                path.display()
            ),
        )
    };
    if len > max {
        return Err(too_big(len));
    }
    let io = |source| FileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(Some(bytes))
}
