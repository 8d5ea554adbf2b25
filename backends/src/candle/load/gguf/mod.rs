//! GGUF checkpoints (llama.cpp's single-file format) for the Qwen2 / Qwen2.5 / Qwen3 layouts.
//!
//! In: a `.gguf` file. Out: what a Hugging Face folder gives the loader — the configuration
//! ([`config::model_config`]) and tensors under their Hugging Face names ([`GgufTensors`],
//! through [`names`]) — plus the tokenizer metadata ([`GgufTokenizer`], turned into a tokenizer
//! by the caller: this crate knows no tokenizer). Nothing above the candle backend sees GGUF:
//! the model loaders ask [`super::weights::Weights`] for the same names either way.
//!
//! Tensor types: a linear weight stored in a block format stays in it
//! ([`super::super::layers::linear::Linear::from_blocks`]: packed for the integer CPU kernels where they run —
//! `Q8_0`, `Q4_0`, `Q4_K` of an f32 model on x86 — else candle's quantized matmul); a linear
//! weight stored as F32 / F16 / BF16 is read like a safetensors weight (and `--quantize`
//! applies to it). The embedding and output head stay in their block format on the CPU
//! ([`super::table::Table`], rows dequantized when read); everything else the backend holds
//! dense — norms, biases, and on GPUs the embedding and head — is dequantized at load into the
//! compute dtype when stored in a block format, and [`GgufTensors::dequantized`] counts those by
//! type for provenance. Each tensor's mapped pages are released once it is copied
//! ([`file::GgufFile::release`]).

mod blocks;
pub mod config;
pub mod file;
pub mod names;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use sha2::{Digest, Sha256};

use self::file::{GgufFile, MetaValue, TensorInfo};
use crate::error::CandleError;

/// An opened GGUF checkpoint: the parsed file and what the load read from it.
pub struct GgufTensors {
    file: GgufFile,
    /// GGUF names of the tensors handed out (load audit).
    read: Mutex<BTreeSet<String>>,
    /// Tensors stored in a block format and dequantized at load: ggml type name -> count.
    dequantized: Mutex<BTreeMap<String, usize>>,
}

impl std::fmt::Debug for GgufTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTensors")
            .field("file", &self.file)
            .finish()
    }
}

impl GgufTensors {
    pub fn open(path: &Path) -> Result<Self, CandleError> {
        Ok(GgufTensors {
            file: GgufFile::open(path)?,
            read: Mutex::new(BTreeSet::new()),
            dequantized: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The model configuration from the metadata.
    pub fn config(&self) -> Result<super::config::ModelConfig, CandleError> {
        config::model_config(&self.file.path, &self.file.metadata, &self.file.tensors)
    }

    /// Every tensor of the Qwen layout with its Hugging Face name and shape (tensors outside
    /// the layout are left out).
    pub fn hf_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.file
            .tensors
            .iter()
            .filter_map(|(n, i)| names::hf_name(n).map(|h| (h, i.shape.clone())))
            .collect()
    }

    /// Count of stored tensors per ggml type name (`Q4_K`, `F32`, …).
    pub fn stored_types(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for info in self.file.tensors.values() {
            *m.entry(info.dtype.name().to_string()).or_default() += 1;
        }
        m
    }

    /// Tensors dequantized at load into the compute dtype, per stored ggml type.
    pub fn dequantized(&self) -> BTreeMap<String, usize> {
        self.dequantized
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default()
    }

    /// GGUF names of the tensors read so far, sorted.
    pub fn names_read(&self) -> Vec<String> {
        self.read
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn contains(&self, hf: &str) -> bool {
        names::gguf_name(hf).is_some_and(|g| self.file.tensors.contains_key(&g))
    }

    /// The stored tensor under its Hugging Face name `hf`, checked against `shape`.
    pub(crate) fn info(
        &self,
        hf: &str,
        shape: &[usize],
    ) -> Result<(String, &TensorInfo), CandleError> {
        let name = names::gguf_name(hf).ok_or_else(|| CandleError::MissingTensor {
            name: format!("{hf} (no GGUF name for it in the Qwen2 / Qwen3 layout)"),
            path: self.file.path.clone(),
        })?;
        let info = self
            .file
            .tensors
            .get(&name)
            .ok_or_else(|| CandleError::MissingTensor {
                name: format!("{name} ({hf})"),
                path: self.file.path.clone(),
            })?;
        if info.shape != shape {
            return Err(CandleError::WrongShape {
                name: format!("{name} ({hf})"),
                expected: shape.to_vec(),
                actual: info.shape.clone(),
            });
        }
        if let Ok(mut read) = self.read.lock() {
            read.insert(name.clone());
        }
        Ok((name, info))
    }

    /// The stored bytes of a tensor returned by [`GgufTensors::info`].
    pub(crate) fn bytes(&self, info: &TensorInfo) -> &[u8] {
        self.file.bytes(info)
    }

    /// The tensor's bytes were copied: drop its mapped pages ([`GgufFile::release`]).
    pub(crate) fn release(&self, info: &TensorInfo) {
        self.file.release(info)
    }

    /// Whether the tensors `a` and `b` (Hugging Face names) are stored with the same type,
    /// shape and bytes.
    pub fn stored_identical(&self, a: &str, b: &str) -> bool {
        let get = |hf: &str| names::gguf_name(hf).and_then(|g| self.file.tensors.get(&g));
        match (get(a), get(b)) {
            (Some(x), Some(y)) => {
                x.dtype == y.dtype && x.shape == y.shape && self.file.bytes(x) == self.file.bytes(y)
            }
            _ => false,
        }
    }

    /// The tensor `hf` with exactly `shape`, in `dtype` on `device`: float types converted,
    /// block formats dequantized (and counted in [`GgufTensors::dequantized`]).
    pub(crate) fn dense(
        &self,
        hf: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor, CandleError> {
        let (name, info) = self.info(hf, shape)?;
        let corrupt = |e: candle_core::Error| CandleError::InvalidCheckpoint {
            path: self.file.path.clone(),
            reason: format!("tensor `{name}`: {e}"),
        };
        let bytes = self.file.bytes(info);
        let host = match info.dtype.0 {
            candle_core::quantized::GgmlDType::F32 => {
                Tensor::from_raw_buffer(bytes, DType::F32, shape, &Device::Cpu)
            }
            candle_core::quantized::GgmlDType::F16 => {
                Tensor::from_raw_buffer(bytes, DType::F16, shape, &Device::Cpu)
            }
            candle_core::quantized::GgmlDType::BF16 => {
                Tensor::from_raw_buffer(bytes, DType::BF16, shape, &Device::Cpu)
            }
            ggml => {
                if let Ok(mut d) = self.dequantized.lock() {
                    *d.entry(info.dtype.name().to_string()).or_default() += 1;
                }
                candle_core::quantized::ggml_file::qtensor_from_ggml(
                    ggml,
                    bytes,
                    shape.to_vec(),
                    &Device::Cpu,
                )
                .and_then(|q| q.dequantize(&Device::Cpu))
            }
        }
        .map_err(corrupt)?;
        // `from_raw_buffer` and the dequantization copied the bytes
        self.file.release(info);
        host.to_dtype(dtype)
            .and_then(|t| t.to_device(device))
            .map_err(CandleError::tensor("load weight"))
    }
}

/// `sha256:<hex>` over the file's header and tensor infos (every metadata value — tokenizer,
/// chat template, hyper-parameters — and every tensor's name, shape, type and offset) and the
/// file's byte size; tensor bytes are not hashed (a 1 GB file would take seconds per load).
pub fn fingerprint(file: &GgufFile) -> String {
    let mut h = Sha256::new();
    let header = file.header_bytes();
    for (label, bytes) in [
        ("gguf-header", header),
        ("size", &file.file_len().to_le_bytes()[..]),
    ] {
        h.update((label.len() as u64).to_le_bytes());
        h.update(label.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The tokenizer a GGUF file describes in its `tokenizer.*` metadata, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTokenizer {
    /// `tokenizer.ggml.model` (`gpt2` for byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: llama.cpp's name of the pre-tokenizer (`qwen2`).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte); empty when absent.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"a b"` pairs in priority order.
    pub merges: Vec<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    pub add_bos_token: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufTokenizer {
    /// Read the `tokenizer.*` metadata of the GGUF file at `path`.
    pub fn read(path: &Path) -> Result<Self, CandleError> {
        let file = GgufFile::open(path)?;
        Self::from_metadata(path, &file.metadata)
    }

    pub fn from_metadata(
        path: &Path,
        metadata: &BTreeMap<String, MetaValue>,
    ) -> Result<Self, CandleError> {
        let invalid = |reason: String| CandleError::InvalidCheckpoint {
            path: path.to_path_buf(),
            reason,
        };
        let strings = |key: &str| -> Result<Vec<String>, CandleError> {
            match metadata.get(key) {
                None => Ok(Vec::new()),
                Some(v) => v
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|s| s.as_str().map(str::to_string))
                            .collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| invalid(format!("`{key}` is not an array of strings"))),
            }
        };
        let id = |key: &str| -> Result<Option<u32>, CandleError> {
            match metadata.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| invalid(format!("`{key}` is not a token id"))),
            }
        };
        let model = metadata
            .get("tokenizer.ggml.model")
            .and_then(MetaValue::as_str)
            .ok_or_else(|| invalid("no string `tokenizer.ggml.model` in the metadata".into()))?
            .to_string();
        let tokens = strings("tokenizer.ggml.tokens")?;
        let token_types = match metadata.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|t| t.as_i64().and_then(|t| i32::try_from(t).ok()))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    invalid("`tokenizer.ggml.token_type` is not an array of integers".into())
                })?,
        };
        if !token_types.is_empty() && token_types.len() != tokens.len() {
            return Err(invalid(format!(
                "{} token types for {} tokens",
                token_types.len(),
                tokens.len()
            )));
        }
        Ok(GgufTokenizer {
            model,
            pre: metadata
                .get("tokenizer.ggml.pre")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
            tokens,
            token_types,
            merges: strings("tokenizer.ggml.merges")?,
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: id("tokenizer.ggml.eos_token_id")?,
            padding_token_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: metadata
                .get("tokenizer.ggml.add_bos_token")
                .and_then(MetaValue::as_bool),
            chat_template: metadata
                .get("tokenizer.chat_template")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
        })
    }
}
