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
//! `bf16` is not a block format: every weight is rounded to bf16. An f32 model's weights on an
//! x86 CPU are packed for AMX tiles with one part where AMX runs (`Linear::PackedAmx`, see
//! [`super::super::cpu::amx`]), else for the AVX-512 BF16 kernel of [`super::super::cpu::bf16gemm`] where the
//! CPU has it (`Linear::PackedBf16`); both round the activations to bf16 per call and sum in
//! f32 ([`cpu_bf16gemm::kernel`] picks). Elsewhere the weight is a bf16 tensor and each call
//! casts `x` to bf16 for candle's matmul and the result back (`Linear::Bf16`; candle's bf16
//! matmul sums in f32 and rounds its output to bf16).
//!
//! Which ggml type a weight gets ([`ggml_type`]): blocks run along the input dimension, so
//! `in` must be a multiple of the block (32 for `Q8_0` / `Q4_0`, 256 for `Q4_K`). `q4k` falls
//! back to `Q4_0` (4-bit blocks of 32, one f16 scale) for a weight whose `in` is a multiple of
//! 32 but not of 256, e.g. Qwen2.5-0.5B's 896-wide projections. (llama.cpp's quantizer picks
//! `Q5_0` there; GGUF files holding `Q5_0` take the 5-bit form of the same integer kernel.)
//! A weight whose `in` is not a multiple of 32
//! stays dense. [`QuantSummary`] counts what each weight got.
//!
//! On an x86 CPU with AVX2 + FMA, an f32 model's quantized weights are packed once at load for
//! an integer kernel (the blocks are not kept): `Q8_0` for [`super::super::cpu::qgemm`]
//! (`Linear::PackedQ8`), `Q4_0` / `Q4_K` / `Q5_0` for [`super::super::cpu::q4gemm`]
//! (`Linear::PackedQ4`). Every
//! call, whatever its row count, rounds the activations to 8-bit blocks and multiplies in
//! integers, as candle's own CPU kernels do for a few rows but register-tiled, so it is the fast
//! path for a prefill too.

use crate::candle::cpu;
use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use forkscore_seam::Quantization;

use super::super::cpu::amx::{AmxI8Weight, AmxWeight, Parts};
use super::super::cpu::bf16gemm::{Bf16Kernel, PackedBf16};
use super::super::cpu::gemm::{CpuGemm, PackedWeight};
use super::super::cpu::host::PackTensor;
use super::super::cpu::isa::Isa;
use super::super::cpu::q4gemm::PackedQ4;
use super::super::cpu::qgemm::PackedQ8;
use crate::error::CandleError;

mod quantize;
mod runs;

/// One linear layer.
#[derive(Debug, Clone)]
pub(crate) enum Linear {
    /// `W (out, in)` in the compute dtype (candle's GEMM).
    Dense(candle_nn::Linear),
    /// `W (out, in)` f32 packed for the CPU kernel of [`super::super::cpu::gemm`]; `bias (out,)` f32.
    Packed {
        weight: Arc<PackedWeight>,
        bias: Option<Tensor>,
    },
    /// `W (out, in)` f32 split into bf16 planes for the AMX kernel of [`super::super::cpu::amx`]
    /// (three: f32 accuracy; one: `--quantize bf16`); `bias (out,)` f32.
    PackedAmx {
        weight: Arc<AmxWeight>,
        bias: Option<Tensor>,
    },
    /// `W` rounded to int8 per output row (`--quantize int8`), packed for the AMX-INT8 tiles of
    /// [`super::super::cpu::amx`]; `bias (out,)` f32.
    PackedI8 {
        weight: Arc<AmxI8Weight>,
        bias: Option<Tensor>,
    },
    /// `W` `Q8_0`, packed for the integer kernel of [`super::super::cpu::qgemm`]; `bias (out,)` f32.
    PackedQ8 {
        weight: Arc<PackedQ8>,
        bias: Option<Tensor>,
    },
    /// `W` `Q4_0` or `Q4_K`, packed for the integer kernel of [`super::super::cpu::q4gemm`];
    /// `bias (out,)` f32.
    PackedQ4 {
        weight: Arc<PackedQ4>,
        bias: Option<Tensor>,
    },
    /// `W` rounded to bf16, packed for the kernel of [`super::super::cpu::bf16gemm`]; `bias (out,)` f32.
    PackedBf16 {
        weight: Arc<PackedBf16>,
        bias: Option<Tensor>,
    },
    /// `W (out, in)` rounded to bf16 where the bf16 kernel does not run: `x` is cast to bf16
    /// for candle's matmul and the result back to the compute dtype; `bias (out,)` in the
    /// compute dtype.
    Bf16 {
        weight: Tensor,
        bias: Option<Tensor>,
    },
    /// `W` quantized; `bias (out,)` in the compute dtype.
    Quantized {
        weight: QMatMul,
        /// The same blocks, for [`Linear::forward_dequantized`].
        blocks: Arc<QTensor>,
        bias: Option<Tensor>,
        ggml: GgmlDType,
    },
}

/// Whether quantized layers multiply f32 activations by their weights dequantized for each call
/// (`FORKSCORE_QUANT_ACTIVATIONS=f32`): the function of the dequantized weights in the compute
/// dtype — a GGUF then decides as the same weights written out dense — instead of rounding the
/// activations to 8-bit blocks for the integer kernels (the default, as llama.cpp computes).
/// Slower: every call dequantizes the whole weight. Read once per process.
pub(crate) fn f32_activations() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::switches::is("FORKSCORE_QUANT_ACTIVATIONS", "f32"))
}

/// The most activation rows a call sends through candle's quantized kernel for `ggml` on
/// `device`; above it the weight is dequantized to the activation dtype for that call and
/// multiplied by the dense GEMM ([`Linear::forward_dequantized`]).
/// (Where an integer kernel runs, an f32 model's weights never get here: see the module doc.)
/// - CPU: candle's x86 `Q8_0` / `Q4_0` kernels take one dot product per (row, column) with no
///   register tiling, so from a handful of rows on they are several times slower than the GEMM
///   plus the dequantization; its `Q4_K` kernel (repacked, tiled) keeps up with the f32 GEMM at
///   every row count (`cargo bench -p forkscore-benches --bench qmatmul` measures all three side
///   by side).
/// - GPUs: candle's matrix-vector kernels serve up to 8 rows; above that candle itself
///   dequantizes to f32 and runs an f32 GEMM, while dequantizing to the compute dtype (bf16)
///   lets the tensor-core GEMM run: measured on a Hopper GPU, Qwen3.5-4B q8_0 prefill took 2.5× the
///   bf16 time through candle's own path.
fn kernel_max_rows(device: &Device, ggml: GgmlDType) -> usize {
    match (device, ggml) {
        (Device::Cpu, GgmlDType::Q4K) => usize::MAX,
        (Device::Cpu, _) => 4,
        _ => 8,
    }
}

/// The ggml type a weight of input width `in_dim` gets under `q`, `None` when it stays dense.
pub(crate) fn ggml_type(q: Quantization, in_dim: usize) -> Option<GgmlDType> {
    let fits = |t: GgmlDType| in_dim > 0 && in_dim.is_multiple_of(t.block_size());
    let preferred = match q {
        Quantization::Q8_0 => GgmlDType::Q8_0,
        Quantization::Q4K => GgmlDType::Q4K,
        Quantization::Bf16 => GgmlDType::BF16,
        // per-channel int8 is no ggml block format
        Quantization::Int8 => return None,
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
    /// A dense layer from `weight (out, in)` and `bias (out,)`, already in the compute dtype:
    /// an f32 weight on the CPU is split for [`super::super::cpu::amx`] when asked and AMX runs
    /// ([`cpu_gemm::amx`]), else packed for [`super::super::cpu::gemm`] when that kernel runs here
    /// ([`cpu_gemm::choice`]); anything else keeps candle's tensor.
    pub fn dense(weight: Tensor, bias: Option<Tensor>) -> Self {
        if weight.device().is_cpu()
            && weight.dtype() == DType::F32
            && cpu::gemm::choice() == CpuGemm::Packed
        {
            if cpu::gemm::amx() {
                if let Ok(split) = AmxWeight::pack(&weight) {
                    return Linear::PackedAmx {
                        weight: Arc::new(split),
                        bias,
                    };
                }
            }
            if let Ok(packed) = PackedWeight::pack(&weight) {
                return Linear::Packed {
                    weight: Arc::new(packed),
                    bias,
                };
            }
        }
        Linear::Dense(candle_nn::Linear::new(weight, bias))
    }

    /// The layers stacked along `out` into one (`[a; b; …]`, biases likewise): all dense, all
    /// packed, or all packed `Q8_0` / 4-bit of one format (every part but the last a multiple
    /// of 16 rows), with one
    /// `in` and either all or none with a bias; `None` otherwise (the caller keeps them
    /// separate).
    pub fn stack(parts: &[&Linear]) -> Result<Option<Self>, CandleError> {
        let biases: Vec<&Tensor> = parts.iter().filter_map(|l| l.bias()).collect();
        if parts.is_empty() || (!biases.is_empty() && biases.len() != parts.len()) {
            return Ok(None);
        }
        let bias = match biases.is_empty() {
            true => None,
            false => Some(Tensor::cat(&biases, 0).map_err(CandleError::tensor("stack biases"))?),
        };
        // every part's weight of one kind, or None
        fn all<'a, T>(
            parts: &[&'a Linear],
            of: fn(&'a Linear) -> Option<&'a T>,
        ) -> Option<Vec<&'a T>> {
            parts.iter().map(|l| of(l)).collect()
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::Dense(d) => Some(d.weight()),
            _ => None,
        }) {
            let w = Tensor::cat(&ws, 0).map_err(CandleError::tensor("stack weights"))?;
            return Ok(Some(Linear::Dense(candle_nn::Linear::new(w, bias))));
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::PackedAmx { weight, .. } => Some(weight.as_ref()),
            _ => None,
        }) {
            return Ok(AmxWeight::stack(&ws).map(|w| Linear::PackedAmx {
                weight: Arc::new(w),
                bias,
            }));
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::PackedI8 { weight, .. } => Some(weight.as_ref()),
            _ => None,
        }) {
            return Ok(AmxI8Weight::stack(&ws).map(|w| Linear::PackedI8 {
                weight: Arc::new(w),
                bias,
            }));
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::PackedQ8 { weight, .. } => Some(weight.as_ref()),
            _ => None,
        }) {
            return Ok(PackedQ8::stack(&ws).map(|w| Linear::PackedQ8 {
                weight: Arc::new(w),
                bias,
            }));
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::PackedQ4 { weight, .. } => Some(weight.as_ref()),
            _ => None,
        }) {
            return Ok(PackedQ4::stack(&ws).map(|w| Linear::PackedQ4 {
                weight: Arc::new(w),
                bias,
            }));
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::PackedBf16 { weight, .. } => Some(weight.as_ref()),
            _ => None,
        }) {
            return Ok(PackedBf16::stack(&ws).map(|w| Linear::PackedBf16 {
                weight: Arc::new(w),
                bias,
            }));
        }
        if let Some(ws) = all(parts, |l| match l {
            Linear::Bf16 { weight, .. } => Some(weight),
            _ => None,
        }) {
            let weight = Tensor::cat(&ws, 0).map_err(CandleError::tensor("stack weights"))?;
            return Ok(Some(Linear::Bf16 { weight, bias }));
        }
        Ok(all(parts, |l| match l {
            Linear::Packed { weight, .. } => Some(weight.as_ref()),
            _ => None,
        })
        .and_then(|ws| PackedWeight::stack(&ws))
        .map(|w| Linear::Packed {
            weight: Arc::new(w),
            bias,
        }))
    }

    fn bias(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense(d) => d.bias(),
            Linear::Packed { bias, .. }
            | Linear::PackedAmx { bias, .. }
            | Linear::PackedI8 { bias, .. }
            | Linear::PackedQ8 { bias, .. }
            | Linear::PackedQ4 { bias, .. }
            | Linear::PackedBf16 { bias, .. }
            | Linear::Bf16 { bias, .. }
            | Linear::Quantized { bias, .. } => bias.as_ref(),
        }
    }

    /// The ggml type of the weight, `None` when dense (`BF16` for a bf16-rounded weight).
    pub fn ggml(&self) -> Option<GgmlDType> {
        match self {
            Linear::PackedBf16 { .. } | Linear::Bf16 { .. } => Some(GgmlDType::BF16),
            Linear::PackedAmx { weight, .. } if weight.parts() == Parts::One => {
                Some(GgmlDType::BF16)
            }
            Linear::Dense(_)
            | Linear::Packed { .. }
            | Linear::PackedAmx { .. }
            | Linear::PackedI8 { .. } => None,
            Linear::PackedQ8 { .. } => Some(GgmlDType::Q8_0),
            Linear::PackedQ4 { weight, .. } => Some(cpu::q4gemm::ggml(weight)),
            Linear::Quantized { ggml, .. } => Some(*ggml),
        }
    }

    /// The packed f32 weight of a layer without a bias ([`cpu_gemm`]'s), if that is what it
    /// holds.
    pub(crate) fn packed_f32(&self) -> Option<&PackedWeight> {
        match self {
            Linear::Packed { weight, bias: None } => Some(weight),
            _ => None,
        }
    }

    /// The bf16-rounded AMX weight (one part) of a layer without a bias, if that is what it
    /// holds.
    pub(crate) fn packed_amx_bf16(&self) -> Option<&AmxWeight> {
        match self {
            Linear::PackedAmx { weight, bias: None } if weight.parts() == Parts::One => {
                Some(weight)
            }
            _ => None,
        }
    }

    /// The int8 weight of a layer without a bias, if that is what it holds.
    pub(crate) fn packed_int8(&self) -> Option<&AmxI8Weight> {
        match self {
            Linear::PackedI8 { weight, bias: None } => Some(weight),
            _ => None,
        }
    }

    /// How [`QuantSummary`] names the weight: its ggml type, `int8`, or `dense`.
    pub fn weight_kind(&self) -> String {
        match self {
            Linear::PackedI8 { .. } => "int8".to_string(),
            _ => QuantSummary::key(self.ggml()),
        }
    }

    /// The packed `Q8_0` weight of a layer without a bias ([`cpu_qgemm`]'s), if that is what
    /// it holds.
    pub(crate) fn packed_q8(&self) -> Option<&PackedQ8> {
        match self {
            Linear::PackedQ8 { weight, bias: None } => Some(weight),
            _ => None,
        }
    }

    /// The packed 4-bit weight of a layer without a bias ([`cpu_q4gemm`]'s), if that is what
    /// it holds.
    pub(crate) fn packed_q4(&self) -> Option<&PackedQ4> {
        match self {
            Linear::PackedQ4 { weight, bias: None } => Some(weight),
            _ => None,
        }
    }

    /// A dense layer with a bias: its product `x · Wᵀ` with the bias left out, and the bias
    /// `(out,)`, for a kernel that adds it in a pass it makes anyway (the fused heads kernel).
    /// `None` for every other layer (the caller takes [`Linear::forward`]).
    pub(crate) fn forward_bias_apart(
        &self,
        x: &Tensor,
    ) -> Option<candle_core::Result<(Tensor, &Tensor)>> {
        match self {
            Linear::Dense(l) => {
                let bias = l.bias()?;
                Some(dense(x, l.weight(), None).map(|y| (y, bias)))
            }
            _ => None,
        }
    }

    /// `(.., in) -> (.., out)`. A quantized layer with more activation rows than
    /// [`kernel_max_rows`] takes [`Linear::forward_dequantized`], as every quantized layer does
    /// under [`f32_activations`].
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if f32_activations() && self.rounds_activations() {
            return self.forward_dequantized(x);
        }
        match self {
            Linear::Dense(l) => dense(x, l.weight(), l.bias()),
            Linear::Packed { weight, bias } => {
                add_bias(cpu::gemm::linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedAmx { weight, bias } => {
                add_bias(cpu::amx::linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedQ8 { weight, bias } => {
                add_bias(cpu::amx::q8_linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedI8 { weight, bias } => {
                add_bias(cpu::amx::int8_linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedQ4 { weight, bias } => {
                add_bias(cpu::q4gemm::linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedBf16 { weight, bias } => {
                add_bias(cpu::bf16gemm::linear(x, weight)?, bias.as_ref())
            }
            Linear::Bf16 { weight, bias } => {
                let y = x.to_dtype(DType::BF16)?.broadcast_matmul(&weight.t()?)?;
                add_bias(y.to_dtype(x.dtype())?, bias.as_ref())
            }
            Linear::Quantized {
                weight, bias, ggml, ..
            } => {
                let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?.max(1);
                if rows > kernel_max_rows(x.device(), *ggml) {
                    return self.forward_dequantized(x);
                }
                let dtype = x.dtype();
                // candle's quantized kernels take contiguous f32 activations
                let y = weight.forward(&x.to_dtype(DType::F32)?.contiguous()?)?;
                add_bias(y.to_dtype(dtype)?, bias.as_ref())
            }
        }
    }

    /// Whether this layer's kernel rounds the activations to 8 bits (integer weights: `Q8_0`,
    /// the 4- to 6-bit block formats, int8, and candle's quantized matmul).
    fn rounds_activations(&self) -> bool {
        matches!(
            self,
            Linear::PackedQ8 { .. }
                | Linear::PackedQ4 { .. }
                | Linear::PackedI8 { .. }
                | Linear::Quantized { .. }
        )
    }

    /// `(.., in) -> (.., out)` through the quantized kernel whatever the row count (tests
    /// compare it with [`Linear::forward_dequantized`]); dense layers as [`Linear::forward`].
    #[cfg(test)]
    pub fn forward_kernel(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense(l) => l.forward(x),
            Linear::Packed { .. }
            | Linear::PackedAmx { .. }
            | Linear::PackedI8 { .. }
            | Linear::PackedQ8 { .. }
            | Linear::PackedQ4 { .. }
            | Linear::PackedBf16 { .. }
            | Linear::Bf16 { .. } => self.forward(x),
            Linear::Quantized { weight, bias, .. } => {
                let y = weight.forward(&x.to_dtype(DType::F32)?.contiguous()?)?;
                add_bias(y.to_dtype(x.dtype())?, bias.as_ref())
            }
        }
    }

    /// `(.., in) -> (.., out)` with the weight dequantized to the activation dtype for this
    /// call only (the layer keeps its blocks) and a dense matmul; dense layers as
    /// [`Linear::forward`].
    pub fn forward_dequantized(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense(l) => l.forward(x),
            Linear::PackedAmx { weight, bias } if weight.parts() == Parts::One => {
                dense_rows(x, weight.rows(), weight.dims(), bias.as_ref())
            }
            Linear::Packed { .. } | Linear::PackedAmx { .. } | Linear::Bf16 { .. } => {
                self.forward(x)
            }
            Linear::PackedBf16 { weight, bias } => {
                dense_rows(x, weight.rows(), weight.dims(), bias.as_ref())
            }
            Linear::PackedQ8 { weight, bias } => {
                dense_rows(x, weight.rows(), weight.dims(), bias.as_ref())
            }
            Linear::PackedI8 { weight, bias } => {
                dense_rows(x, weight.rows(), weight.dims(), bias.as_ref())
            }
            Linear::PackedQ4 { weight, bias } => {
                dense_rows(x, weight.rows(), weight.dims(), bias.as_ref())
            }
            Linear::Quantized {
                blocks, bias, ggml, ..
            } => {
                if x.device().is_cpu()
                    && x.dtype() == DType::F32
                    && cpu::gemm::choice() == CpuGemm::Packed
                {
                    // packed for this call, Q8_0 / Q4_0 straight from the blocks: the packed
                    // kernel outruns candle's GEMM by more than the packing costs at the row
                    // counts that get here
                    let (n, k) = blocks.shape().dims2()?;
                    let y = match cpu::gemm::from_blocks(*ggml, &blocks.data()?, n, k) {
                        Some(packed) => cpu::gemm::linear(x, &packed)?,
                        None => runs::product_in_runs(x, blocks, *ggml, runs::run_rows(k))?,
                    };
                    return add_bias(y, bias.as_ref());
                }
                // (out, in) blocks -> (out, in) dense, transient
                let w = blocks.dequantize(x.device())?.to_dtype(x.dtype())?;
                let y = dense(x, &w, None)?;
                add_bias(y, bias.as_ref())
            }
        }
    }
}

/// `x (.., in) · w (out, in)ᵀ (+ bias)`: candle's matmul, or on the CPU in f32 with the
/// `openblas` feature one `cblas_sgemm` ([`super::super::cpu::blas`]).
fn dense(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
    #[cfg(feature = "openblas")]
    if super::super::cpu::blas::takes(x, w) {
        return add_bias(super::super::cpu::blas::linear(x, w)?, bias);
    }
    candle_nn::Linear::new(w.clone(), bias.cloned()).forward(x)
}

/// `x · Wᵀ (+ bias)` with `W (n, k)` given as row-major values (a packed weight dequantized
/// for this call only), through [`dense`].
fn dense_rows(
    x: &Tensor,
    rows: Vec<f32>,
    (n, k): (usize, usize),
    bias: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    let w = Tensor::from_vec(rows, (n, k), x.device())?;
    add_bias(dense(x, &w, None)?, bias)
}

fn add_bias(y: Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
    match bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
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
        self.count_kind(layer.weight_kind());
    }

    /// One weight named `kind` (as [`Linear::weight_kind`] names them).
    pub(crate) fn count_kind(&mut self, kind: String) {
        *self.by_type.entry(kind).or_default() += 1;
    }

    /// The name of ggml type `t` (`None`: `dense`).
    pub(crate) fn key(t: Option<GgmlDType>) -> String {
        match t {
            None => "dense".to_string(),
            Some(t) => format!("{t:?}").to_ascii_lowercase(),
        }
    }
}

#[cfg(test)]
use quantize::{integer_kernel, quantize_rows_parallel};

#[cfg(test)]
mod tests;
