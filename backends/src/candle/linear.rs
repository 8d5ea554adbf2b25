//! Linear layers `y = x Wᵀ (+ b)`: dense in the compute dtype, or with the weight quantized in
//! memory at load time (`LoadOptions::quantization`).
//!
//! In: `x (.., in)` in the compute dtype. Out: `(.., out)` in the same dtype. A quantized layer
//! holds `W (out, in)` as a candle [`QTensor`] (ggml block format) on the model's device and
//! runs candle's quantized matmul kernels: on the CPU the activations are quantized per row to
//! the kernel's dot-product type (8-bit) and multiplied block by block; on CUDA / Metal candle's
//! own kernels. The kernels take f32 activations, so a bf16/f16 model casts `x` to f32 and the
//! result back (exact for the cast in, one rounding out); the bias stays dense in the compute
//! dtype.
//!
//! Which ggml type a weight gets ([`ggml_type`]): blocks run along the input dimension, so
//! `in` must be a multiple of the block (32 for `Q8_0` / `Q4_0`, 256 for `Q4_K`). `q4k` falls
//! back to `Q4_0` (4-bit blocks of 32, one f16 scale) for a weight whose `in` is a multiple of
//! 32 but not of 256, e.g. Qwen2.5-0.5B's 896-wide projections. llama.cpp's quantizer picks
//! `Q5_0` there; candle's CPU `Q5_0` dot product has no SIMD form on x86 and requires an even
//! block count, while `Q4_0` has an AVX2 kernel. A weight whose `in` is not a multiple of 32
//! stays dense. [`QuantSummary`] counts what each weight got.

use std::collections::BTreeMap;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use forkscore_seam::Quantization;

use crate::error::CandleError;

/// One linear layer.
#[derive(Debug, Clone)]
pub(crate) enum Linear {
    /// `W (out, in)` in the compute dtype (candle's GEMM).
    Dense(candle_nn::Linear),
    /// `W` quantized; `bias (out,)` in the compute dtype.
    Quantized {
        weight: QMatMul,
        bias: Option<Tensor>,
        ggml: GgmlDType,
    },
}

/// The ggml type a weight of input width `in_dim` gets under `q`, `None` when it stays dense.
pub(crate) fn ggml_type(q: Quantization, in_dim: usize) -> Option<GgmlDType> {
    let fits = |t: GgmlDType| in_dim > 0 && in_dim % t.block_size() == 0;
    let preferred = match q {
        Quantization::Q8_0 => GgmlDType::Q8_0,
        Quantization::Q4K => GgmlDType::Q4K,
    };
    if fits(preferred) {
        return Some(preferred);
    }
    match q {
        Quantization::Q4K if fits(GgmlDType::Q4_0) => Some(GgmlDType::Q4_0),
        _ => None,
    }
}

impl Linear {
    /// A dense layer from `weight (out, in)` and `bias (out,)`, already in the compute dtype.
    pub fn dense(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear::Dense(candle_nn::Linear::new(weight, bias))
    }

    /// `weight (out, in)` quantized under `q` onto `device` (the source may sit on any device,
    /// in any float dtype: it is read as f32 on the host), `bias` cast to `dtype` on `device`.
    /// A weight no ggml type fits ([`ggml_type`]) stays dense in `dtype`. `name` labels errors.
    pub fn quantized(
        name: &str,
        weight: &Tensor,
        bias: Option<Tensor>,
        q: Quantization,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, CandleError> {
        let op = |what: &'static str| {
            move |e: candle_core::Error| CandleError::Quantize {
                name: name.to_string(),
                reason: format!("{what}: {e}"),
            }
        };
        let (_, in_dim) = weight.dims2().map_err(op("weight is not a matrix"))?;
        let bias = bias
            .map(|b| b.to_dtype(dtype).and_then(|b| b.to_device(device)))
            .transpose()
            .map_err(op("bias"))?;
        let Some(ggml) = ggml_type(q, in_dim) else {
            let w = weight
                .to_dtype(dtype)
                .and_then(|w| w.to_device(device))
                .map_err(op("dense fallback"))?;
            return Ok(Linear::dense(w, bias));
        };
        // (out, in) f32 on the host -> ggml blocks along `in` on `device`
        let host = weight
            .to_device(&Device::Cpu)
            .and_then(|w| w.to_dtype(DType::F32))
            .map_err(op("weight to host f32"))?;
        let qt = QTensor::quantize_onto(&host, ggml, device).map_err(op("quantize"))?;
        let weight = QMatMul::from_qtensor(qt).map_err(op("quantized matmul"))?;
        Ok(Linear::Quantized { weight, bias, ggml })
    }

    /// The ggml type of the weight, `None` when dense.
    pub fn ggml(&self) -> Option<GgmlDType> {
        match self {
            Linear::Dense(_) => None,
            Linear::Quantized { ggml, .. } => Some(*ggml),
        }
    }

    /// `(.., in) -> (.., out)`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense(l) => l.forward(x),
            Linear::Quantized { weight, bias, .. } => {
                let dtype = x.dtype();
                // candle's quantized kernels take contiguous f32 activations
                let y = weight.forward(&x.to_dtype(DType::F32)?.contiguous()?)?;
                let y = y.to_dtype(dtype)?;
                match bias {
                    Some(b) => y.broadcast_add(b),
                    None => Ok(y),
                }
            }
        }
    }
}

/// `(.., in) -> (.., out)`, errors named `name`.
pub(crate) fn apply(layer: &Linear, x: &Tensor, name: &'static str) -> Result<Tensor, CandleError> {
    layer.forward(x).map_err(CandleError::tensor(name))
}

/// How many linear weights got each ggml type (`"dense"` for those kept in the compute dtype).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuantSummary {
    pub by_type: BTreeMap<String, usize>,
}

impl QuantSummary {
    pub(crate) fn count(&mut self, layer: &Linear) {
        let key = match layer.ggml() {
            None => "dense".to_string(),
            Some(t) => format!("{t:?}").to_ascii_lowercase(),
        };
        *self.by_type.entry(key).or_default() += 1;
    }
}
