//! Bounds on untrusted checkpoint files, checked before anything is allocated from them.
//!
//! A checkpoint folder is input like any other: a `config.json` can declare three billion
//! layers, a safetensors file can declare a 3 GiB header, a `tokenizer.json` can be a FIFO that
//! never ends. Each check here turns such a file into a typed error that names the file and the
//! rule, instead of an allocation abort, a multi-gigabyte read or a hang:
//! - [`read_regular`]: only regular files are read (a FIFO or device is refused before `open`,
//!   which would block on a FIFO), and no more than a stated number of bytes;
//! - [`check_config_sizes`]: every size in `config.json` within [`MAX_DIMS`], before any vector
//!   is built from it;
//! - [`check_header_len`]: a safetensors header length within the file and [`MAX_HEADER_BYTES`]
//!   before it is read;
//!
//! Whether the config agrees with the tensors actually stored is
//! [`super::config::ModelConfig::check_against_tensors`]'s question.

use std::path::Path;

use serde_json::Value;

use crate::error::CandleError;
pub use forkscore_seam::files::{file_kind, FileError, MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES};

/// Largest safetensors header accepted (the `safetensors` crate's own limit is 100 MB; real
/// checkpoints have headers of a few hundred KB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Upper bounds on `config.json` sizes: generous multiples of the largest published models
/// (hundreds of layers, hidden sizes of tens of thousands, vocabularies of a few hundred
/// thousand). Anything above is refused before a single layer is built.
pub const MAX_DIMS: &[(&str, u64)] = &[
    ("num_hidden_layers", 4_096),
    ("hidden_size", 1 << 17),
    ("intermediate_size", 1 << 20),
    ("num_attention_heads", 4_096),
    ("num_key_value_heads", 4_096),
    ("head_dim", 1 << 14),
    ("vocab_size", 1 << 23),
    ("full_attention_interval", 4_096),
    ("linear_num_key_heads", 4_096),
    ("linear_num_value_heads", 4_096),
    ("linear_key_head_dim", 1 << 14),
    ("linear_value_head_dim", 1 << 14),
    ("linear_conv_kernel_dim", 1_024),
];

impl From<FileError> for CandleError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Refused { path, reason } => CandleError::InvalidCheckpoint { path, reason },
            FileError::Io { path, source } => CandleError::Io { path, source },
        }
    }
}

/// `Ok(None)` when `path` does not exist; an error when it exists but is not a regular file
/// (checked on the path, before any `open`, so a FIFO cannot block). See
/// [`forkscore_seam::files::regular_file_len`].
pub fn regular_file_len(path: &Path) -> Result<Option<u64>, CandleError> {
    Ok(forkscore_seam::files::regular_file_len(path)?)
}

/// Read a regular file of at most `max` bytes (`Ok(None)` when it does not exist). See
/// [`forkscore_seam::files::read_regular`].
pub fn read_regular(path: &Path, max: u64) -> Result<Option<Vec<u8>>, CandleError> {
    Ok(forkscore_seam::files::read_regular(path, max)?)
}

/// Every size of [`MAX_DIMS`] present in the text-config object `text` is an integer within
/// its bound. Runs on the raw JSON, before the typed parse builds anything from these numbers.
pub fn check_config_sizes(
    text: &Value,
    invalid: &dyn Fn(String) -> CandleError,
) -> Result<(), CandleError> {
    for &(key, max) in MAX_DIMS {
        let Some(v) = text.get(key) else { continue };
        match v.as_u64() {
            Some(n) if n <= max => {}
            Some(n) => {
                return Err(invalid(format!(
                    "{key} = {n} is implausibly large (the limit is {max}); refusing to build a model from it"
                )))
            }
            None if v.is_null() => {}
            None => {
                return Err(invalid(format!(
                    "{key} must be a non-negative integer, got {v}"
                )))
            }
        }
    }
    if let Some(types) = text.get("layer_types").and_then(Value::as_array) {
        let max = MAX_DIMS[0].1;
        if types.len() as u64 > max {
            return Err(invalid(format!(
                "layer_types has {} entries (the limit is {max})",
                types.len()
            )));
        }
    }
    Ok(())
}

/// A safetensors header of `declared` bytes in a file of `file_len` bytes is plausible: it fits
/// in the file after the 8-byte length and is at most [`MAX_HEADER_BYTES`].
pub fn check_header_len(path: &Path, declared: u64, file_len: u64) -> Result<(), CandleError> {
    let corrupt = |reason: String| CandleError::InvalidCheckpoint {
        path: path.to_path_buf(),
        reason: format!("truncated or corrupt safetensors file: {reason}"),
    };
    if declared.saturating_add(8) > file_len {
        return Err(corrupt(format!(
            "the header declares {declared} bytes but the file has {file_len}"
        )));
    }
    if declared > MAX_HEADER_BYTES {
        return Err(corrupt(format!(
            "the header declares {declared} bytes, over the limit of {MAX_HEADER_BYTES}"
        )));
    }
    Ok(())
}

/// The first 8 bytes of a mapped safetensors file declare a plausible header length
/// ([`check_header_len`]), checked before the header is parsed.
pub fn check_mapped_header(path: &Path, bytes: &[u8]) -> Result<(), CandleError> {
    let Some(len) = bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return Err(CandleError::InvalidCheckpoint {
            path: path.to_path_buf(),
            reason: format!(
                "truncated or corrupt safetensors file: {} bytes, shorter than the 8-byte header length",
                bytes.len()
            ),
        });
    };
    check_header_len(path, u64::from_le_bytes(len), bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_sizes_are_bounded_table() {
        let invalid = |reason: String| CandleError::InvalidRequest { reason };
        let cases: &[(Value, Option<&str>)] = &[
            (json!({"num_hidden_layers": 28, "hidden_size": 1536}), None),
            (
                json!({"num_hidden_layers": 3_000_000_000u64}),
                Some("num_hidden_layers"),
            ),
            (
                json!({"num_hidden_layers": 1u64 << 40}),
                Some("implausibly large"),
            ),
            (
                json!({"hidden_size": 1_000_000_000_000u64}),
                Some("hidden_size"),
            ),
            (
                json!({"linear_key_head_dim": 1_000_000_000_000u64}),
                Some("linear_key_head_dim"),
            ),
            (json!({"vocab_size": -1}), Some("non-negative integer")),
            (json!({"head_dim": 1.5}), Some("non-negative integer")),
            (json!({"head_dim": null}), None),
        ];
        for (v, want) in cases {
            let got = check_config_sizes(v, &invalid).err().map(|e| e.to_string());
            match want {
                None => assert_eq!(got, None, "{v}"),
                Some(w) => assert!(got.as_deref().unwrap_or("").contains(w), "{v}: {got:?}"),
            }
        }
    }

    #[test]
    fn header_lengths_are_bounded_table() {
        let p = Path::new("m.safetensors");
        let cases: &[(u64, u64, bool)] = &[
            (100, 1_000, true),
            (992, 1_000, true),
            (993, 1_000, false),
            (u64::MAX, 1_000, false),
            (3 << 30, (3 << 30) + 100, false),
            (MAX_HEADER_BYTES, MAX_HEADER_BYTES + 8, true),
        ];
        for &(declared, len, ok) in cases {
            assert_eq!(
                check_header_len(p, declared, len).is_ok(),
                ok,
                "{declared} in {len}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn fifos_and_directories_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("tokenizer.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.map(|s| s.success()).unwrap_or(false) {
            let e = read_regular(&fifo, 10).unwrap_err().to_string();
            assert!(e.contains("FIFO"), "{e}");
        }
        let e = read_regular(dir.path(), 10).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
        let f = dir.path().join("small");
        std::fs::write(&f, b"12345").unwrap();
        assert_eq!(read_regular(&f, 5).unwrap(), Some(b"12345".to_vec()));
        assert!(read_regular(&f, 4)
            .unwrap_err()
            .to_string()
            .contains("over the limit"));
        assert_eq!(read_regular(&dir.path().join("none"), 4).unwrap(), None);
    }
}
