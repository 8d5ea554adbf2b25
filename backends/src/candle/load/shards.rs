//! Memory-mapped safetensors files of one checkpoint, indexed by tensor name.
//!
//! In: a checkpoint folder holding `model.safetensors`, or `model.safetensors.index.json` plus
//! the shards its `weight_map` names. Out: [`RawTensor`] views (dtype, shape, bytes) borrowed
//! from the mapped files. Headers are parsed and validated when the set is opened (a truncated
//! or corrupt file fails here, naming the file); tensor bytes are only touched when a caller
//! asks for that tensor, so vision / MTP tensors of multimodal checkpoints are never read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::CandleError;

pub(crate) const SINGLE_FILE: &str = "model.safetensors";
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the mapped file (header included in the offset).
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
    entries: HashMap<String, Entry>,
}

/// A tensor as stored: dtype, shape and raw little-endian bytes.
pub(crate) struct RawTensor<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
    pub path: &'a Path,
}

/// All weight files of a checkpoint.
pub(crate) struct ShardSet {
    shards: Vec<Shard>,
    /// tensor name -> index into `shards`
    by_name: HashMap<String, usize>,
    /// What to name in a "missing tensor" error.
    describe: PathBuf,
    /// Names of the tensors whose bytes were handed out by [`ShardSet::get`] (load audit).
    read: Mutex<BTreeSet<String>>,
}

/// The weight files of a checkpoint folder, in a stable order: the index file (when sharded)
/// then the shards sorted by name, or the single `model.safetensors`.
pub(crate) struct WeightFiles {
    pub index: Option<PathBuf>,
    pub shards: Vec<PathBuf>,
    /// For sharded checkpoints: tensor name -> shard file name, as in `weight_map`.
    pub weight_map: BTreeMap<String, String>,
}

impl WeightFiles {
    pub fn discover(dir: &Path) -> Result<Self, CandleError> {
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            let bytes = std::fs::read(&index).map_err(|source| CandleError::Io {
                path: index.clone(),
                source,
            })?;
            #[derive(serde::Deserialize)]
            struct Index {
                weight_map: BTreeMap<String, String>,
            }
            let parsed: Index =
                serde_json::from_slice(&bytes).map_err(|e| CandleError::InvalidCheckpoint {
                    path: index.clone(),
                    reason: format!("not a safetensors index (needs a `weight_map` object): {e}"),
                })?;
            if parsed.weight_map.is_empty() {
                return Err(CandleError::InvalidCheckpoint {
                    path: index.clone(),
                    reason: "`weight_map` is empty: the index names no tensor".into(),
                });
            }
            let mut files: Vec<&String> = parsed.weight_map.values().collect();
            files.sort();
            files.dedup();
            let mut shards = Vec::with_capacity(files.len());
            for f in files {
                if f.contains('/') || f.contains('\\') || f.starts_with('.') {
                    return Err(CandleError::InvalidCheckpoint {
                        path: index.clone(),
                        reason: format!("weight_map names a file outside the folder: `{f}`"),
                    });
                }
                let p = dir.join(f);
                if !p.is_file() {
                    return Err(CandleError::MissingFile {
                        path: p,
                        reason: format!("shard named by {INDEX_FILE}"),
                    });
                }
                shards.push(p);
            }
            return Ok(WeightFiles {
                index: Some(index),
                shards,
                weight_map: parsed.weight_map,
            });
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Ok(WeightFiles {
                index: None,
                shards: vec![single],
                weight_map: BTreeMap::new(),
            });
        }
        Err(CandleError::MissingFile {
            path: single,
            reason: format!("the checkpoint has neither {SINGLE_FILE} nor {INDEX_FILE}"),
        })
    }
}

fn map_file(path: &Path) -> Result<Mmap, CandleError> {
    let file = File::open(path).map_err(|source| CandleError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    // SAFETY: the map is read-only and private to this process. Checkpoint files are not expected
    // to change while loaded; if one is truncated underneath us the process may fault, which is the
    // documented limit of every memory-mapped safetensors loader.
    unsafe { Mmap::map(&file) }.map_err(|source| CandleError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> CandleError {
    CandleError::InvalidCheckpoint {
        path: path.to_path_buf(),
        reason: format!("truncated or corrupt safetensors file: {e}"),
    }
}

impl ShardSet {
    /// Map every file and validate its header (and, when sharded, that each tensor named by
    /// the index is where the index says).
    pub fn open(files: &WeightFiles) -> Result<Self, CandleError> {
        let mut shards = Vec::with_capacity(files.shards.len());
        let mut by_name = HashMap::new();
        for (i, path) in files.shards.iter().enumerate() {
            let mmap = map_file(path)?;
            super::limits::check_mapped_header(path, &mmap)?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| corrupt(path, format!("{e:?}")))?;
            let base = 8 + header_len;
            let mut entries = HashMap::new();
            for (name, info) in metadata.tensors() {
                let (s, e) = info.data_offsets;
                entries.insert(
                    name.clone(),
                    Entry {
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: base + s,
                        end: base + e,
                    },
                );
                if by_name.insert(name.clone(), i).is_some() {
                    return Err(CandleError::InvalidCheckpoint {
                        path: path.clone(),
                        reason: format!("tensor `{name}` is stored in more than one file"),
                    });
                }
            }
            shards.push(Shard {
                path: path.clone(),
                mmap,
                entries,
            });
        }
        for (name, file) in &files.weight_map {
            let found = by_name.get(name).map(|&i| &shards[i].path);
            if found.and_then(|p| p.file_name()).and_then(|f| f.to_str()) != Some(file.as_str()) {
                return Err(CandleError::InvalidCheckpoint {
                    path: files.index.clone().unwrap_or_default(),
                    reason: format!(
                        "index maps `{name}` to `{file}` but that file does not hold it"
                    ),
                });
            }
        }
        let describe = files
            .index
            .clone()
            .unwrap_or_else(|| files.shards[0].clone());
        Ok(ShardSet {
            shards,
            by_name,
            describe,
            read: Mutex::new(BTreeSet::new()),
        })
    }

    /// Every tensor name [`ShardSet::get`] returned bytes for so far, sorted.
    pub fn names_read(&self) -> Vec<String> {
        self.read
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Every stored tensor name and its shape (for checks before the model is built).
    pub fn shapes(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.shards.iter().flat_map(|s| {
            s.entries
                .iter()
                .map(|(n, e)| (n.as_str(), e.shape.as_slice()))
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The stored tensor `name`, or [`CandleError::MissingTensor`].
    pub fn get(&self, name: &str) -> Result<RawTensor<'_>, CandleError> {
        let shard = self
            .by_name
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| CandleError::MissingTensor {
                name: name.to_string(),
                path: self.describe.clone(),
            })?;
        let entry = &shard.entries[name];
        if let Ok(mut read) = self.read.lock() {
            read.insert(name.to_string());
        }
        let data = shard
            .mmap
            .get(entry.start..entry.end)
            .ok_or_else(|| corrupt(&shard.path, "data range"))?;
        Ok(RawTensor {
            dtype: entry.dtype,
            shape: &entry.shape,
            data,
            path: &shard.path,
        })
    }
}

impl ShardSet {
    /// Drop the mapped pages of the stored tensor `name` once its bytes were copied
    /// ([`super::pages::release`]); unknown names are ignored.
    pub fn release(&self, name: &str) {
        self.release_part(name, 0, usize::MAX);
    }

    /// Drop the mapped pages of bytes `from..to` of the stored tensor `name` (offsets into its
    /// bytes, clamped to them) once they were copied; unknown names are ignored.
    pub fn release_part(&self, name: &str, from: usize, to: usize) {
        if let Some(&i) = self.by_name.get(name) {
            let shard = &self.shards[i];
            let entry = &shard.entries[name];
            let start = entry.start.saturating_add(from).min(entry.end);
            let end = entry.start.saturating_add(to).min(entry.end);
            super::pages::release(&shard.mmap, start, end);
        }
    }
}

/// The raw header bytes and the size of a safetensors file, read without mapping it
/// (used by the checkpoint fingerprint).
pub(crate) fn header_and_size(path: &Path) -> Result<(Vec<u8>, u64), CandleError> {
    use std::io::Read;
    let io = |source| CandleError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| corrupt(path, e))?;
    let n = u64::from_le_bytes(len);
    super::limits::check_header_len(path, n, size)?;
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|e| corrupt(path, e))?;
    Ok((header, size))
}
/// Open the weight files of `dir` exactly as a load does (index, shard headers, the index's
/// tensor placement) and list every stored tensor with its shape, sorted by name, without
/// building a model. Used by the fuzz target for the safetensors header / index reader.
pub fn inspect_weights(dir: &Path) -> Result<Vec<(String, Vec<usize>)>, CandleError> {
    let shards = ShardSet::open(&WeightFiles::discover(dir)?)?;
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
