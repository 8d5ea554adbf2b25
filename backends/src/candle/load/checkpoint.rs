//! Resolving a model reference to a checkpoint folder on disk, with a content fingerprint.
//!
//! In: either a local Hugging Face folder plus a free-text revision label, or a hub id
//! `ORG/NAME` plus a full 40-hex commit, looked up offline in the Hugging Face cache
//! (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`, layout
//! `models--ORG--NAME/snapshots/REV/`). Out: a [`ResolvedCheckpoint`]. The revision is
//! optional ([`ResolvedCheckpoint::resolve_optional`]): a folder without one is labelled
//! `unlabelled`, a hub id without one takes the commit of the cache's `refs/main`.
//!
//! A GGUF checkpoint is a `.gguf` file named by path, or a folder holding exactly one `.gguf`
//! file and no `config.json`; its revision is a free-text label like a folder's. Its
//! fingerprint is sha256 over the GGUF header and tensor infos (all metadata, including the
//! tokenizer and chat template, and every tensor's name, shape, type and offset) and the file
//! size, plus `tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja` when they sit
//! beside the file (they then decide the prompt tokens).
//!
//! Branch names and short hashes are rejected: they name different weights over time, so a
//! result stamped with them is not reproducible. The fingerprint is sha256 over, in order:
//! `config.json`; the weight index (when sharded); each safetensors file's header and byte size
//! (not the tensor bytes: hashing gigabytes per load would dominate start-up); `tokenizer.json`
//! when present. Each part is framed by its file name and length so parts cannot run together.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::shards::{header_and_size, WeightFiles};
use crate::error::CandleError;

/// Where a checkpoint was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CheckpointSource {
    /// A local folder named by path.
    Folder,
    /// A snapshot in the Hugging Face cache named by id and commit.
    HfCache,
    /// A GGUF file named by path (or the one `.gguf` of a folder without `config.json`).
    Gguf,
}

/// A checkpoint folder ready to load, with its provenance.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ResolvedCheckpoint {
    /// The folder holding config.json, weights and tokenizer files.
    pub dir: PathBuf,
    /// `ORG/NAME` for cache snapshots; the folder path for local folders.
    pub model_id: String,
    /// The 40-hex commit (cache) or the caller's label (folder).
    pub revision: String,
    /// `sha256:<hex>` over config, index / safetensors headers and sizes, tokenizer.json.
    pub fingerprint: String,
    pub source: CheckpointSource,
    /// The GGUF file, for a GGUF checkpoint (`dir` is then its folder).
    pub gguf: Option<PathBuf>,
}

impl ResolvedCheckpoint {
    /// A local Hugging Face folder. `revision_label` is free text (e.g. a git describe or a
    /// date) recorded in provenance; it must not be empty.
    pub fn from_folder(dir: &Path, revision_label: &str) -> Result<Self, CandleError> {
        if revision_label.trim().is_empty() {
            return Err(CandleError::InvalidModelRef {
                reason: "a local checkpoint folder needs a non-empty revision label".into(),
            });
        }
        if !dir.is_dir() {
            return Err(CandleError::MissingFile {
                path: dir.to_path_buf(),
                reason: "checkpoint folder does not exist".into(),
            });
        }
        Ok(ResolvedCheckpoint {
            dir: dir.to_path_buf(),
            model_id: dir.display().to_string(),
            revision: revision_label.trim().to_string(),
            fingerprint: fingerprint(dir)?,
            source: CheckpointSource::Folder,
            gguf: None,
        })
    }

    /// A GGUF file. `revision_label` is free text recorded in provenance; it must not be empty.
    pub fn from_gguf(file: &Path, revision_label: &str) -> Result<Self, CandleError> {
        if revision_label.trim().is_empty() {
            return Err(CandleError::InvalidModelRef {
                reason: "a GGUF checkpoint needs a non-empty revision label".into(),
            });
        }
        let parsed = super::gguf::file::GgufFile::open(file)?;
        let dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut h = Sha256::new();
        h.update(super::gguf::fingerprint(&parsed).as_bytes());
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            let f = dir.join(name);
            if f.is_file() {
                let bytes =
                    std::fs::read(&f).map_err(|source| CandleError::Io { path: f, source })?;
                h.update((name.len() as u64).to_le_bytes());
                h.update(name.as_bytes());
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(&bytes);
            }
        }
        Ok(ResolvedCheckpoint {
            dir,
            model_id: file.display().to_string(),
            revision: revision_label.trim().to_string(),
            fingerprint: format!("sha256:{}", hex::encode(h.finalize())),
            source: CheckpointSource::Gguf,
            gguf: Some(file.to_path_buf()),
        })
    }

    /// The one `.gguf` file of `dir` when it has no `config.json`: `Ok(None)` when it has a
    /// `config.json` or no `.gguf` file, an error when it has several.
    pub fn single_gguf(dir: &Path) -> Result<Option<PathBuf>, CandleError> {
        if dir.join("config.json").exists() {
            return Ok(None);
        }
        let entries = std::fs::read_dir(dir).map_err(|source| CandleError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_gguf_name(p) && p.is_file())
            .collect();
        found.sort();
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            n => Err(CandleError::InvalidModelRef {
                reason: format!(
                    "{} holds {n} .gguf files and no config.json: name the file to load ({})",
                    dir.display(),
                    found
                        .iter()
                        .filter_map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// A snapshot `ORG/NAME` at a 40-hex `revision` in the Hugging Face cache under
    /// `cache_root` (or [`hf_cache_root`] when `None`). Never touches the network.
    pub fn from_hf_cache(
        model_id: &str,
        revision: &str,
        cache_root: Option<&Path>,
    ) -> Result<Self, CandleError> {
        let (org, name) = parse_model_id(model_id)?;
        validate_revision(revision)?;
        let root = match cache_root {
            Some(r) => r.to_path_buf(),
            None => hf_cache_root().ok_or_else(|| CandleError::InvalidModelRef {
                reason: "cannot locate the Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, HOME is set".into(),
            })?,
        };
        let repo = root.join(format!("models--{org}--{name}"));
        let dir = repo.join("snapshots").join(revision);
        if !dir.is_dir() {
            let reason = if repo.is_dir() {
                format!("{model_id} is in the cache but revision {revision} is not downloaded")
            } else {
                format!(
                    "{model_id} is not in the Hugging Face cache (offline: nothing is downloaded)"
                )
            };
            return Err(CandleError::MissingFile { path: dir, reason });
        }
        Ok(ResolvedCheckpoint {
            fingerprint: fingerprint(&dir)?,
            dir,
            model_id: format!("{org}/{name}"),
            revision: revision.to_string(),
            source: CheckpointSource::HfCache,
            gguf: None,
        })
    }

    /// `reference` is a folder when such a directory exists, else a hub id resolved in the
    /// default cache (where `revision` must be a 40-hex commit).
    pub fn resolve(reference: &str, revision: &str) -> Result<Self, CandleError> {
        Self::resolve_optional(reference, Some(revision))
    }

    /// [`Self::resolve`] with the revision optional: a folder or GGUF file without one is
    /// labelled [`UNLABELLED`] (its fingerprint is its identity); a hub id without one takes
    /// the commit the offline cache's `refs/main` names ([`hf_cache_main_revision`]), which
    /// provenance then records.
    pub fn resolve_optional(reference: &str, revision: Option<&str>) -> Result<Self, CandleError> {
        let path = Path::new(reference);
        let label = revision.unwrap_or(UNLABELLED);
        if path.is_dir() {
            match Self::single_gguf(path)? {
                Some(file) => Self::from_gguf(&file, label),
                None => Self::from_folder(path, label),
            }
        } else if is_gguf_name(path) {
            Self::from_gguf(path, label)
        } else {
            let as_hub_id = || {
                let revision = match revision {
                    Some(r) => r.to_string(),
                    None => hf_cache_main_revision(reference, None)?,
                };
                Self::from_hf_cache(reference, &revision, None)
            };
            as_hub_id().map_err(|e| CandleError::InvalidModelRef {
                reason: format!(
                    "`{reference}` is not a local checkpoint folder (no such directory), and as a Hugging Face id: {e}"
                ),
            })
        }
    }
}

/// The revision provenance records for a local folder or GGUF file given without one.
pub const UNLABELLED: &str = "unlabelled";

/// The commit `refs/main` names for `ORG/NAME` in the Hugging Face cache under `cache_root`
/// (or [`hf_cache_root`] when `None`): what `huggingface_hub` wrote when it downloaded the
/// main branch. Offline; an absent or malformed ref is an error that says to pass the commit.
pub fn hf_cache_main_revision(
    model_id: &str,
    cache_root: Option<&Path>,
) -> Result<String, CandleError> {
    let (org, name) = parse_model_id(model_id)?;
    let root = match cache_root {
        Some(r) => r.to_path_buf(),
        None => hf_cache_root().ok_or_else(|| CandleError::InvalidModelRef {
            reason:
                "cannot locate the Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, HOME is set"
                    .into(),
        })?,
    };
    let repo = root.join(format!("models--{org}--{name}"));
    let main = repo.join("refs").join("main");
    if !repo.is_dir() {
        return Err(CandleError::MissingFile {
            path: repo,
            reason: format!(
                "{model_id} is not in the Hugging Face cache (offline: nothing is downloaded)"
            ),
        });
    }
    // a ref file holds one 40-hex commit; anything much larger is not one
    let Some(bytes) = super::limits::read_regular(&main, 256)? else {
        return Err(CandleError::MissingFile {
            path: main,
            reason: format!(
                "no --revision was given and the cache has no refs/main for {model_id}; pass --revision with the 40-hex commit of a downloaded snapshot (see {}/snapshots)",
                repo.display()
            ),
        });
    };
    let text = String::from_utf8_lossy(&bytes);
    let commit = text.trim();
    validate_revision(commit).map_err(|e| CandleError::InvalidModelRef {
        reason: format!("{} does not hold a commit id: {e}", main.display()),
    })?;
    Ok(commit.to_string())
}

/// Whether `path` names a `.gguf` file (extension compared case-insensitively).
fn is_gguf_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The Hugging Face hub cache directory from the environment: `HF_HUB_CACHE`, else
/// `HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hf_cache_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
}

fn parse_model_id(model_id: &str) -> Result<(&str, &str), CandleError> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    match model_id.split_once('/') {
        Some((org, name)) if ok_part(org) && ok_part(name) => Ok((org, name)),
        _ => Err(CandleError::InvalidModelRef {
            reason: format!(
                "`{model_id}` is neither an existing folder nor a hub id of the form ORG/NAME"
            ),
        }),
    }
}

/// A hub revision must be a full 40-hex commit id.
pub fn validate_revision(revision: &str) -> Result<(), CandleError> {
    if revision.len() == 40
        && revision
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    {
        return Ok(());
    }
    Err(CandleError::InvalidModelRef {
        reason: format!(
            "revision `{revision}` is not a full 40-character lowercase hex commit id; branch names \
             and short hashes are not reproducible (they can point at different weights over time)"
        ),
    })
}

fn fingerprint(dir: &Path) -> Result<String, CandleError> {
    let mut h = Sha256::new();
    let mut part = |label: &str, bytes: &[u8]| {
        h.update((label.len() as u64).to_le_bytes());
        h.update(label.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    let read = |p: PathBuf| std::fs::read(&p).map_err(|source| CandleError::Io { path: p, source });
    let config = dir.join("config.json");
    if super::limits::regular_file_len(&config)?.is_none() {
        return Err(CandleError::MissingFile {
            path: config,
            reason: "the checkpoint has no config.json".into(),
        });
    }
    part("config.json", &read(config)?);
    let files = WeightFiles::discover(dir)?;
    if let Some(index) = &files.index {
        part("model.safetensors.index.json", &read(index.clone())?);
    }
    for shard in &files.shards {
        let (header, size) = header_and_size(shard)?;
        let name = shard
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        part(name, &header);
        part("size", &size.to_le_bytes());
    }
    // The tokenizer and the chat template decide the prompt tokens, so they are part of it.
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        let file = dir.join(name);
        if file.is_file() {
            part(name, &read(file)?);
        }
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_must_be_full_commits() {
        assert!(validate_revision(&"a".repeat(40)).is_ok());
        for bad in [
            "main",
            "abc1234",
            &"A".repeat(40),
            &"g".repeat(40),
            &"a".repeat(41),
        ] {
            let msg = validate_revision(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(msg.contains("not reproducible"), "{bad}: {msg}");
        }
    }

    #[test]
    fn model_ids_are_org_slash_name() {
        assert!(parse_model_id("Qwen/Qwen2.5-0.5B-Instruct").is_ok());
        for bad in ["Qwen", "a/b/c", "../x", "a/..", "/x"] {
            assert!(parse_model_id(bad).is_err(), "{bad}");
        }
    }
}
