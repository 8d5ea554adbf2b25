//! Typed access to checkpoint tensors: by name, with shape and dtype checks, converted to the
//! compute dtype on the target device.
//!
//! In: a [`Store`] — the safetensors files of a folder ([`ShardSet`]) or a GGUF file
//! ([`GgufTensors`], asked by the same Hugging Face names) — and a name prefix (`model.` for
//! Qwen2/Qwen3; Qwen3.5 multimodal checkpoints keep the text model under
//! `model.language_model.`). Out: candle tensors. Only tensors that are asked for are read.
//! Accepted stored dtypes: F32, BF16, F16; from a GGUF file also the ggml block formats (linear
//! weights and, on the CPU, the embedding / head tables kept in them; norms and biases
//! dequantized: see [`super::gguf`]).

use candle_core::{DType, Device, Tensor};
use forkscore_seam::Quantization;
use safetensors::Dtype;

use super::super::layers::linear::Linear;
use super::gguf::GgufTensors;
use super::shards::ShardSet;
use super::table::Table;
use crate::error::CandleError;

/// Where a checkpoint's tensors are stored.
#[derive(Clone, Copy)]
pub(crate) enum Store<'a> {
    Safetensors(&'a ShardSet),
    Gguf(&'a GgufTensors),
}

/// A view of the checkpoint under a name prefix.
#[derive(Clone, Copy)]
pub(crate) struct Weights<'a> {
    store: Store<'a>,
    prefix: &'a str,
    dtype: DType,
    device: &'a Device,
    /// Linear weights loaded through [`Weights::linear`] are quantized when set.
    quantization: Option<Quantization>,
}

const ACCEPTED: &str = "F32, BF16, F16";

impl<'a> Weights<'a> {
    pub fn new(store: Store<'a>, prefix: &'a str, dtype: DType, device: &'a Device) -> Self {
        Weights {
            store,
            prefix,
            dtype,
            device,
            quantization: None,
        }
    }

    /// The same view, loading linear weights quantized under `q` (dense when `None`).
    pub fn with_quantization(self, quantization: Option<Quantization>) -> Self {
        Weights {
            quantization,
            ..self
        }
    }

    pub fn quantization(&self) -> Option<Quantization> {
        self.quantization
    }

    /// Linear layer `name.weight` `(out, in)` (+ `name.bias` `(out,)`): dense in the compute
    /// dtype, or quantized on the device from the stored values read as f32 on the host.
    pub fn linear(
        &self,
        name: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Linear, CandleError> {
        let bias = if bias {
            Some(self.get(&format!("{name}.bias"), &[out_dim])?)
        } else {
            None
        };
        let weight_name = format!("{name}.weight");
        if let Store::Gguf(g) = self.store {
            let full = self.full_name(&weight_name);
            let (_, info) = g.info(&full, &[out_dim, in_dim])?;
            if !info.dtype.is_float() {
                let layer = Linear::from_blocks(
                    &full,
                    info.dtype.0,
                    g.bytes(info),
                    (out_dim, in_dim),
                    bias,
                    self.dtype,
                    self.device,
                );
                // packed or copied into candle's blocks: the mapped pages are not read again
                g.release(info);
                return layer;
            }
        }
        match self.quantization {
            None => Ok(Linear::dense(
                self.get(&weight_name, &[out_dim, in_dim])?,
                bias,
            )),
            Some(q) => {
                let host = self.host_f32(&weight_name, &[out_dim, in_dim])?;
                let full = self.full_name(&weight_name);
                Linear::quantized(&full, &host, bias, q, self.dtype, self.device)
            }
        }
    }

    /// Tensor `prefix + name` with exactly `shape`, in f32 on the host (the source of a
    /// quantized weight).
    pub fn host_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor, CandleError> {
        Weights {
            device: &Device::Cpu,
            ..*self
        }
        .get_as(name, shape, DType::F32)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// The same checkpoint under another prefix (e.g. `""` for the root `lm_head.weight`).
    pub fn with_prefix(&self, prefix: &'a str) -> Self {
        Weights { prefix, ..*self }
    }

    pub fn full_name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub fn contains(&self, name: &str) -> bool {
        match self.store {
            Store::Safetensors(s) => s.contains(&self.full_name(name)),
            Store::Gguf(g) => g.contains(&self.full_name(name)),
        }
    }

    /// Whether the stored tensors `prefix + a` and `prefix + b` hold the same dtype, shape and
    /// bytes (compared in the mapped files, nothing converted or copied).
    pub fn stored_identical(&self, a: &str, b: &str) -> Result<bool, CandleError> {
        let shards = match self.store {
            Store::Safetensors(s) => s,
            Store::Gguf(g) => return Ok(g.stored_identical(&self.full_name(a), &self.full_name(b))),
        };
        let (a, b) = (self.full_name(a), self.full_name(b));
        let (ra, rb) = (shards.get(&a)?, shards.get(&b)?);
        let same = ra.dtype == rb.dtype && ra.shape == rb.shape && ra.data == rb.data;
        shards.release(&a);
        shards.release(&b);
        Ok(same)
    }

    /// The `(V, D)` token table `prefix + name` (embedding or output head): a GGUF tensor
    /// stored in a block format stays in it on the CPU ([`Table::Blocks`]); anything else is
    /// [`Weights::get`] ([`Table::Dense`]).
    pub fn table(&self, name: &str, shape: &[usize]) -> Result<Table, CandleError> {
        if let Store::Gguf(g) = self.store {
            let full = self.full_name(name);
            let (_, info) = g.info(&full, shape)?;
            if !info.dtype.is_float() && self.device.is_cpu() {
                let op = |e: candle_core::Error| CandleError::Quantize {
                    name: full.clone(),
                    reason: format!("stored blocks: {e}"),
                };
                let blocks = candle_core::quantized::ggml_file::qtensor_from_ggml(
                    info.dtype.0,
                    g.bytes(info),
                    shape.to_vec(),
                    self.device,
                )
                .map_err(op)?;
                g.release(info);
                return Table::blocks(blocks, self.dtype).map_err(op);
            }
        }
        Ok(Table::Dense(self.get(name, shape)?))
    }

    /// Tensor `prefix + name` with exactly `shape`, in the compute dtype.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, CandleError> {
        self.get_as(name, shape, self.dtype)
    }

    /// Tensor `prefix + name` with exactly `shape`, in f32 whatever the compute dtype (for
    /// parameters that must stay f32, e.g. Gated DeltaNet's `A_log`).
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor, CandleError> {
        self.get_as(name, shape, DType::F32)
    }

    fn get_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor, CandleError> {
        let full = self.full_name(name);
        let shards = match self.store {
            Store::Safetensors(s) => s,
            Store::Gguf(g) => return g.dense(&full, shape, dtype, self.device),
        };
        let raw = shards.get(&full)?;
        if raw.shape != shape {
            return Err(CandleError::WrongShape {
                name: full,
                expected: shape.to_vec(),
                actual: raw.shape.to_vec(),
            });
        }
        let stored = match raw.dtype {
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            other => {
                return Err(CandleError::WrongDtype {
                    name: full,
                    expected: ACCEPTED.into(),
                    actual: format!("{other:?}"),
                })
            }
        };
        if stored == dtype && !self.device.is_cpu() {
            // Stored as computed: straight from the mapped file to the device, with no host copy
            // in between (an 8 GB checkpoint would otherwise pass through a second host buffer).
            let t = Tensor::from_raw_buffer(raw.data, stored, shape, self.device)
                .map_err(CandleError::tensor("load weight"));
            shards.release(&full);
            return t;
        }
        let t = Tensor::from_raw_buffer(raw.data, stored, shape, &Device::Cpu).map_err(|e| {
            CandleError::InvalidCheckpoint {
                path: raw.path.to_path_buf(),
                reason: format!("tensor `{full}`: {e}"),
            }
        })?;
        // the bytes are copied: the file's pages of this tensor are not needed any more
        shards.release(&full);
        t.to_dtype(dtype)
            .and_then(|t| t.to_device(self.device))
            .map_err(CandleError::tensor("load weight"))
    }
}
