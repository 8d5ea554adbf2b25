//! Texts (a context, a `logprobs` text, a schema file) read or checked under a byte bound: a
//! context may hold at most [`BYTES_PER_TOKEN`] bytes per allowed token ([`max_context_bytes`]),
//! refused before it is tokenized; a file, a pipe or an endless device is read only up to the
//! bound, then refused.

use std::io::Read;
use std::path::Path;

/// Bytes of text allowed per `--max-input-tokens` token.
pub const BYTES_PER_TOKEN: u64 = 64;

/// Smallest context bound, whatever `--max-input-tokens` says.
pub const MIN_CONTEXT_BYTES: u64 = 64 << 10;

/// Most bytes a context may have under `max_input_tokens`.
pub fn max_context_bytes(max_input_tokens: usize) -> u64 {
    (max_input_tokens as u64)
        .saturating_mul(BYTES_PER_TOKEN)
        .max(MIN_CONTEXT_BYTES)
}

/// Why a bounded text could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    #[error("{what} is longer than {max} bytes, the limit for --max-input-tokens {tokens} ({per} bytes per token); it could never fit, so it is refused before tokenizing (raise --max-input-tokens to allow longer text)", per = BYTES_PER_TOKEN)]
    TooLong {
        what: String,
        max: u64,
        tokens: usize,
    },
    #[error("{what} is a directory")]
    Directory { what: String },
    #[error("cannot read {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is not UTF-8 text")]
    NotUtf8 { what: String },
}

/// Read at most the context bound of `max_input_tokens` from `reader` (a file, a pipe, stdin,
/// a device): more is an error after `bound + 1` bytes, however long the source is.
pub fn read_context(
    reader: impl Read,
    what: &str,
    max_input_tokens: usize,
) -> Result<String, BoundedReadError> {
    let max = max_context_bytes(max_input_tokens);
    let mut bytes = Vec::new();
    reader
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| BoundedReadError::Io {
            what: what.to_string(),
            source,
        })?;
    if bytes.len() as u64 > max {
        return Err(BoundedReadError::TooLong {
            what: what.to_string(),
            max,
            tokens: max_input_tokens,
        });
    }
    String::from_utf8(bytes).map_err(|_| BoundedReadError::NotUtf8 {
        what: what.to_string(),
    })
}

/// [`read_context`] from a path (`-` is stdin). Directories are refused; a FIFO, a pipe or a
/// device is read up to the bound.
pub fn read_context_file(path: &Path, max_input_tokens: usize) -> Result<String, BoundedReadError> {
    read_text_file(path, "context", max_input_tokens)
}

/// [`read_context_file`] for any text under the same bound; `noun` names it in errors
/// (`"context"`: "context file x.txt", "the context from stdin"; `"text"` for `logprobs`).
pub fn read_text_file(
    path: &Path,
    noun: &str,
    max_input_tokens: usize,
) -> Result<String, BoundedReadError> {
    let what = format!("{noun} file {}", path.display());
    if path.as_os_str() == "-" {
        return read_context(
            std::io::stdin().lock(),
            &format!("the {noun} from stdin"),
            max_input_tokens,
        );
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(BoundedReadError::Directory { what });
    }
    let file = std::fs::File::open(path).map_err(|source| BoundedReadError::Io {
        what: what.clone(),
        source,
    })?;
    read_context(file, &what, max_input_tokens)
}

/// An inline `--context` over the bound is refused the same way.
pub fn check_context_len(context: &str, max_input_tokens: usize) -> Result<(), BoundedReadError> {
    check_text_len(context, "context", max_input_tokens)
}

/// [`check_context_len`] for any inline text; `noun` names it in errors.
pub fn check_text_len(
    text: &str,
    noun: &str,
    max_input_tokens: usize,
) -> Result<(), BoundedReadError> {
    let max = max_context_bytes(max_input_tokens);
    if text.len() as u64 > max {
        return Err(BoundedReadError::TooLong {
            what: format!("the {noun}"),
            max,
            tokens: max_input_tokens,
        });
    }
    Ok(())
}

/// Why a schema file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchemaFileError {
    #[error("schema file {path} is longer than {max} bytes, the most a schema may have; it is refused before parsing or tokenizing anything", max = forkscore_engine::schema::MAX_SCHEMA_BYTES)]
    TooLong { path: String },
    #[error("schema file {path} is a directory")]
    Directory { path: String },
    #[error("cannot read schema file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("schema file {path} is not UTF-8 text")]
    NotUtf8 { path: String },
}

/// Read a schema file, at most [`forkscore_engine::schema::MAX_SCHEMA_BYTES`] of it: a larger
/// file (or an endless device) is refused after that many bytes plus one, so memory stays flat.
pub fn read_schema_file(path: &Path) -> Result<String, SchemaFileError> {
    let max = forkscore_engine::schema::MAX_SCHEMA_BYTES as u64;
    let shown = path.display().to_string();
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(SchemaFileError::Directory { path: shown });
    }
    let io = |source| SchemaFileError::Io {
        path: shown.clone(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(SchemaFileError::TooLong { path: shown });
    }
    String::from_utf8(bytes).map_err(|_| SchemaFileError::NotUtf8 { path: shown })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_source_stops_at_the_bound() {
        let endless = std::io::repeat(b'x');
        let e = read_context(endless, "zeros", 10).unwrap_err();
        assert!(matches!(e, BoundedReadError::TooLong { .. }), "{e}");
    }

    #[test]
    fn the_context_bound_follows_max_input_tokens() {
        assert_eq!(max_context_bytes(4096), 4096 * 64);
        assert_eq!(max_context_bytes(1), MIN_CONTEXT_BYTES);
    }
}
