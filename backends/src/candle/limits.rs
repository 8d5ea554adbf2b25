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
//! - [`check_against_tensors`]: the config's layer count and embedding shape agree with the
//!   tensors actually stored, before the model is built.

use std::path::Path;

use serde_json::Value;

use super::config::ModelConfig;
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

/// Layer indices `i` of tensor names containing `layers.{i}.`.
fn layer_index(name: &str) -> Option<u64> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    let digits = &rest[..rest.find('.')?];
    digits.parse().ok()
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

/// The config agrees with the stored tensors: the stored layer indices cover exactly
/// `0..num_hidden_layers`, and the text model's `embed_tokens.weight` has shape
/// `[vocab_size, hidden_size]`. `tensors` are all stored tensor names with their shapes. Runs
/// before the model is built, so a config that disagrees with its weights allocates nothing.
pub fn check_against_tensors<'a>(
    config: &ModelConfig,
    tensors: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> Result<(), CandleError> {
    let invalid = |reason: String| CandleError::InvalidConfig {
        path: config.path.clone(),
        reason,
    };
    let t = &config.text;
    let mut max_layer: Option<u64> = None;
    let mut embed: Option<&[usize]> = None;
    for (name, shape) in tensors {
        // vision towers and MTP heads have layers of their own; only the text model's count
        if name.contains("visual") || name.starts_with("mtp") || name.contains(".mtp.") {
            continue;
        }
        if let Some(i) = layer_index(name) {
            max_layer = Some(max_layer.map_or(i, |m| m.max(i)));
        }
        if name.ends_with("embed_tokens.weight") {
            embed = Some(shape);
        }
    }
    let stored_layers = max_layer.map_or(0, |m| m + 1);
    if stored_layers != t.num_layers as u64 {
        return Err(invalid(format!(
            "num_hidden_layers is {} but the checkpoint stores tensors for {stored_layers} layers",
            t.num_layers
        )));
    }
    if let Some(shape) = embed {
        if shape != [t.vocab_size, t.hidden_size] {
            return Err(invalid(format!(
                "vocab_size {} x hidden_size {} does not match the stored embedding of shape {shape:?}",
                t.vocab_size, t.hidden_size
            )));
        }
    }
    Ok(())
}

/// Open the weight files of `dir` exactly as a load does (index, shard headers, the index's
/// tensor placement) and list every stored tensor with its shape, sorted by name, without
/// building a model. Used by the fuzz target for the safetensors header / index reader.
pub fn inspect_weights(dir: &Path) -> Result<Vec<(String, Vec<usize>)>, CandleError> {
    let shards = super::shards::ShardSet::open(&super::shards::WeightFiles::discover(dir)?)?;
    let mut all: Vec<(String, Vec<usize>)> = shards
        .shapes()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    all.sort();
    for (name, _) in &all {
        shards.get(name)?;
    }
    Ok(all)
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

    #[test]
    fn layer_indices_are_read_from_names() {
        assert_eq!(layer_index("model.layers.27.mlp.up_proj.weight"), Some(27));
        assert_eq!(layer_index("model.language_model.layers.3.x"), Some(3));
        assert_eq!(layer_index("model.norm.weight"), None);
        assert_eq!(layer_index("model.layers.x.y"), None);
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
