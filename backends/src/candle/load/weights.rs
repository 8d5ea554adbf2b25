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
                let blocks = g.cpu_blocks(info, shape).map_err(op)?;
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
        if dtype == DType::F32 && self.device.is_cpu() {
            // read (f32) or widened (f16 / bf16) straight from the mapped bytes a run at a
            // time, each run's pages dropped once copied: the tensor is never held twice (for a
            // large embedding that transient set the load's peak)
            let t = host_f32_runs(raw.data, stored, shape, |a, b| {
                shards.release_part(&full, a, b)
            })
            .map_err(CandleError::tensor("load weight"))?;
            shards.release(&full);
            return Ok(t);
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

/// Stored little-endian f16 / bf16 bytes (any alignment) as an f32 tensor on the host of
/// `shape`, converted in one pass on the rayon threads. Both widenings are exact, so this is
/// the tensor `from_raw_buffer` + `to_dtype(F32)` gives, without the copy in the stored dtype.
#[cfg(test)]
fn widen_to_f32(bytes: &[u8], stored: DType, shape: &[usize]) -> candle_core::Result<Tensor> {
    if stored == DType::F32 {
        candle_core::bail!("widen_to_f32: stored {stored:?} is not a 16-bit float");
    }
    host_f32_runs(bytes, stored, shape, |_, _| {})
}

/// Stored little-endian f32 / f16 / bf16 bytes (any alignment) as an f32 tensor on the host of
/// `shape`: read or widened (both exact) in runs of [`RUN_VALUES`] values, each run converted on
/// the rayon threads and then handed to `done(from, to)` (its byte range), so the caller can
/// drop the mapped pages it no longer needs. Equal to `from_raw_buffer` + `to_dtype(F32)`.
fn host_f32_runs(
    bytes: &[u8],
    stored: DType,
    shape: &[usize],
    done: impl Fn(usize, usize),
) -> candle_core::Result<Tensor> {
    use rayon::prelude::*;
    let width = match stored {
        DType::F32 => 4,
        DType::F16 | DType::BF16 => 2,
        other => candle_core::bail!("host_f32_runs: stored {other:?} is not f32, f16 or bf16"),
    };
    let read: fn(&[u8]) -> f32 = match stored {
        DType::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
    };
    if bytes.len() != width * shape.iter().product::<usize>() {
        candle_core::bail!(
            "host_f32_runs: {} bytes for shape {shape:?} of {stored:?}",
            bytes.len()
        );
    }
    const PART: usize = 1 << 16;
    let mut out = vec![0f32; bytes.len() / width];
    for (r, (o, b)) in out
        .chunks_mut(RUN_VALUES)
        .zip(bytes.chunks(RUN_VALUES * width))
        .enumerate()
    {
        o.par_chunks_mut(PART)
            .zip(b.par_chunks(PART * width))
            .for_each(|(o, b)| {
                for (o, b) in o.iter_mut().zip(b.chunks_exact(width)) {
                    *o = read(b);
                }
            });
        let from = r * RUN_VALUES * width;
        done(from, from + b.len());
    }
    Tensor::from_vec(out, shape, &Device::Cpu)
}

/// Values per run of [`host_f32_runs`]: 16 MiB of f32.
const RUN_VALUES: usize = 1 << 22;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Widening from the bytes equals candle's copy-then-convert, bit for bit, for any
        /// 16-bit patterns (NaNs compared as NaN), both formats, at odd byte offsets.
        #[test]
        fn widening_equals_copy_then_convert(
            bits in proptest::collection::vec(any::<u16>(), 1..300),
            offset in 0usize..2,
        ) {
            let mut bytes = vec![0u8; offset];
            bytes.extend(bits.iter().flat_map(|b| b.to_le_bytes()));
            let bytes = &bytes[offset..];
            for stored in [DType::F16, DType::BF16] {
                let got = widen_to_f32(bytes, stored, &[bits.len()]).and_then(|t| t.to_vec1::<f32>()).expect("widen");
                let want = Tensor::from_raw_buffer(bytes, stored, &[bits.len()], &Device::Cpu)
                    .and_then(|t| t.to_dtype(DType::F32))
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("candle");
                for (g, w) in got.iter().zip(&want) {
                    prop_assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{g} vs {w}");
                }
            }
        }
    }

    /// f32 bytes read run by run equal candle's copy bit for bit (more than one run, an odd
    /// byte offset), and the runs handed back cover the bytes once, in order.
    #[test]
    fn f32_runs_equal_the_copy_and_cover_the_bytes() {
        let n = RUN_VALUES + 3;
        let mut bytes = vec![0u8; 1];
        bytes.extend((0..n).flat_map(|i| ((i as f32) * 0.37 - 5.0).to_le_bytes()));
        let bytes = &bytes[1..];
        let ranges = std::sync::Mutex::new(Vec::new());
        let got = host_f32_runs(bytes, DType::F32, &[n], |a, b| {
            ranges.lock().expect("ranges lock").push((a, b))
        })
        .and_then(|t| t.to_vec1::<f32>())
        .expect("runs");
        let want = Tensor::from_raw_buffer(bytes, DType::F32, &[n], &Device::Cpu)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("candle");
        assert!(got
            .iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits()));
        assert_eq!(
            ranges.into_inner().unwrap(),
            vec![(0, 4 * RUN_VALUES), (4 * RUN_VALUES, 4 * n)]
        );
    }

    #[test]
    fn wrong_sizes_and_dtypes_are_errors() {
        assert!(widen_to_f32(&[0u8; 6], DType::F16, &[2]).is_err());
        assert!(widen_to_f32(&[0u8; 8], DType::F32, &[2]).is_err());
    }
}
