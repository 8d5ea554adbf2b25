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
//! [`super::cpu_amx`]), else for the AVX-512 BF16 kernel of [`super::cpu_bf16gemm`] where the
//! CPU has it (`Linear::PackedBf16`); both round the activations to bf16 per call and sum in
//! f32 ([`cpu_bf16gemm::kernel`] picks). Elsewhere the weight is a bf16 tensor and each call
//! casts `x` to bf16 for candle's matmul and the result back (`Linear::Bf16`; candle's bf16
//! matmul sums in f32 and rounds its output to bf16).
//!
//! Which ggml type a weight gets ([`ggml_type`]): blocks run along the input dimension, so
//! `in` must be a multiple of the block (32 for `Q8_0` / `Q4_0`, 256 for `Q4_K`). `q4k` falls
//! back to `Q4_0` (4-bit blocks of 32, one f16 scale) for a weight whose `in` is a multiple of
//! 32 but not of 256, e.g. Qwen2.5-0.5B's 896-wide projections. llama.cpp's quantizer picks
//! `Q5_0` there; candle's CPU `Q5_0` dot product has no SIMD form on x86 and requires an even
//! block count, while `Q4_0` has an AVX2 kernel. A weight whose `in` is not a multiple of 32
//! stays dense. [`QuantSummary`] counts what each weight got.
//!
//! On an x86 CPU with AVX2 + FMA, an f32 model's quantized weights are packed once at load for
//! an integer kernel (the blocks are not kept): `Q8_0` for [`super::cpu_qgemm`]
//! (`Linear::PackedQ8`), `Q4_0` / `Q4_K` for [`super::cpu_q4gemm`] (`Linear::PackedQ4`). Every
//! call, whatever its row count, rounds the activations to 8-bit blocks and multiplies in
//! integers, as candle's own CPU kernels do for a few rows but register-tiled, so it is the fast
//! path for a prefill too.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use forkscore_seam::Quantization;

use super::cpu_amx::{self, AmxWeight, Parts};
use super::cpu_bf16gemm::{self, Bf16Kernel, PackedBf16};
use super::cpu_gemm::{self, CpuGemm, PackedWeight};
use super::cpu_isa::Isa;
use super::cpu_q4gemm::{self, PackedQ4};
use super::cpu_qgemm::PackedQ8;
use crate::error::CandleError;

/// One linear layer.
#[derive(Debug, Clone)]
pub(crate) enum Linear {
    /// `W (out, in)` in the compute dtype (candle's GEMM).
    Dense(candle_nn::Linear),
    /// `W (out, in)` f32 packed for the CPU kernel of [`super::cpu_gemm`]; `bias (out,)` f32.
    Packed {
        weight: Arc<PackedWeight>,
        bias: Option<Tensor>,
    },
    /// `W (out, in)` f32 split into bf16 planes for the AMX kernel of [`super::cpu_amx`]
    /// (three: f32 accuracy; one: `--quantize bf16`); `bias (out,)` f32.
    PackedAmx {
        weight: Arc<AmxWeight>,
        bias: Option<Tensor>,
    },
    /// `W` `Q8_0`, packed for the integer kernel of [`super::cpu_qgemm`]; `bias (out,)` f32.
    PackedQ8 {
        weight: Arc<PackedQ8>,
        bias: Option<Tensor>,
    },
    /// `W` `Q4_0` or `Q4_K`, packed for the integer kernel of [`super::cpu_q4gemm`];
    /// `bias (out,)` f32.
    PackedQ4 {
        weight: Arc<PackedQ4>,
        bias: Option<Tensor>,
    },
    /// `W` rounded to bf16, packed for the kernel of [`super::cpu_bf16gemm`]; `bias (out,)` f32.
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
    /// an f32 weight on the CPU is split for [`super::cpu_amx`] when asked and AMX runs
    /// ([`cpu_gemm::amx`]), else packed for [`super::cpu_gemm`] when that kernel runs here
    /// ([`cpu_gemm::choice`]); anything else keeps candle's tensor.
    pub fn dense(weight: Tensor, bias: Option<Tensor>) -> Self {
        if weight.device().is_cpu()
            && weight.dtype() == DType::F32
            && cpu_gemm::choice() == CpuGemm::Packed
        {
            if cpu_gemm::amx() {
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
            | Linear::PackedQ8 { bias, .. }
            | Linear::PackedQ4 { bias, .. }
            | Linear::PackedBf16 { bias, .. }
            | Linear::Bf16 { bias, .. }
            | Linear::Quantized { bias, .. } => bias.as_ref(),
        }
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
        if q == Quantization::Bf16 {
            return Self::bf16(weight, bias, dtype, device).map_err(op("bf16"));
        }
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
        let blocks = Arc::new(quantize_rows_parallel(&host, ggml, device).map_err(op("quantize"))?);
        if let Some(isa) = integer_kernel(ggml, dtype, device) {
            let (n, k) = blocks.shape().dims2().map_err(op("quantized shape"))?;
            let data = blocks.data().map_err(op("quantized blocks"))?;
            let packed = match ggml {
                GgmlDType::Q8_0 => {
                    PackedQ8::from_blocks(&data, n, k, isa).map(|w| Linear::PackedQ8 {
                        weight: Arc::new(w),
                        bias: bias.clone(),
                    })
                }
                _ => PackedQ4::from_blocks(ggml, &data, n, k, isa).map(|w| Linear::PackedQ4 {
                    weight: Arc::new(w),
                    bias: bias.clone(),
                }),
            };
            if let Some(packed) = packed {
                return Ok(packed);
            }
        }
        let weight = QMatMul::from_arc(blocks.clone()).map_err(op("quantized matmul"))?;
        Ok(Linear::Quantized {
            weight,
            blocks,
            bias,
            ggml,
        })
    }

    /// A layer whose weight `(out, in)` is stored already quantized, as the ggml blocks
    /// `bytes` of type `ggml` (a GGUF tensor; blocks run along `in`, rows one after another):
    /// kept in that format. Where an integer kernel runs (an f32 model on an x86 CPU, `Q8_0` /
    /// `Q4_0` / `Q4_K`) the blocks are packed for it, as `--quantize` packs its own; any other
    /// block format becomes candle's blocks on `device` behind [`QMatMul`] (its kernels, or the
    /// per-call dequantization of [`Linear::forward_dequantized`] above [`kernel_max_rows`]).
    /// `bias` is cast to `dtype` on `device`; `name` labels errors.
    #[allow(clippy::too_many_arguments)]
    pub fn from_blocks(
        name: &str,
        ggml: GgmlDType,
        bytes: &[u8],
        (out, in_dim): (usize, usize),
        bias: Option<Tensor>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, CandleError> {
        let op = |what: &'static str| {
            move |e: candle_core::Error| CandleError::Quantize {
                name: name.to_string(),
                reason: format!("{what}: {e}"),
            }
        };
        let block = ggml.block_size();
        let want = (in_dim / block.max(1)) * ggml.type_size() * out;
        if !in_dim.is_multiple_of(block) || bytes.len() != want {
            return Err(CandleError::Quantize {
                name: name.to_string(),
                reason: format!(
                    "{ggml:?} weight ({out}, {in_dim}): rows are not whole blocks of {block}, or {} bytes stored for {want}",
                    bytes.len()
                ),
            });
        }
        let bias = bias
            .map(|b| b.to_dtype(dtype).and_then(|b| b.to_device(device)))
            .transpose()
            .map_err(op("bias"))?;
        if let Some(isa) = integer_kernel(ggml, dtype, device) {
            let packed = match ggml {
                GgmlDType::Q8_0 => {
                    PackedQ8::from_blocks(bytes, out, in_dim, isa).map(|w| Linear::PackedQ8 {
                        weight: Arc::new(w),
                        bias: bias.clone(),
                    })
                }
                _ => {
                    PackedQ4::from_blocks(ggml, bytes, out, in_dim, isa).map(|w| Linear::PackedQ4 {
                        weight: Arc::new(w),
                        bias: bias.clone(),
                    })
                }
            };
            if let Some(packed) = packed {
                return Ok(packed);
            }
        }
        let blocks = Arc::new(
            candle_core::quantized::ggml_file::qtensor_from_ggml(
                ggml,
                bytes,
                vec![out, in_dim],
                device,
            )
            .map_err(op("stored blocks"))?,
        );
        // candle's CPU dot products of these formats take blocks in pairs (a debug assertion
        // on an odd count): such a weight is dequantized to `dtype` here instead
        let pairs = matches!(ggml, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1);
        if pairs && (in_dim / block) % 2 == 1 && device.is_cpu() {
            let w = blocks
                .dequantize(device)
                .and_then(|w| w.to_dtype(dtype))
                .map_err(op("dequantize"))?;
            return Ok(Linear::dense(w, bias));
        }
        let weight = QMatMul::from_arc(blocks.clone()).map_err(op("quantized matmul"))?;
        Ok(Linear::Quantized {
            weight,
            blocks,
            bias,
            ggml,
        })
    }

    /// `weight (out, in)` rounded to bf16 ([`Quantization::Bf16`]): for an f32 model on the
    /// CPU, packed for the kernel [`cpu_bf16gemm::kernel`] picks (AMX tiles with one part, or
    /// AVX-512 BF16); otherwise, or where it picks candle's matmul, a bf16 tensor on `device`.
    /// `bias` (already in `dtype` on `device`) is kept as it is.
    fn bf16(
        weight: &Tensor,
        bias: Option<Tensor>,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let kernel = match dtype == DType::F32 && device.is_cpu() {
            true => cpu_bf16gemm::kernel()?,
            false => Bf16Kernel::Candle,
        };
        Ok(match kernel {
            Bf16Kernel::Amx => Linear::PackedAmx {
                weight: Arc::new(AmxWeight::pack_bf16(weight)?),
                bias,
            },
            Bf16Kernel::Dot => Linear::PackedBf16 {
                weight: Arc::new(PackedBf16::pack(weight)?),
                bias,
            },
            Bf16Kernel::Candle => Linear::Bf16 {
                weight: weight.to_dtype(DType::BF16)?.to_device(device)?,
                bias,
            },
        })
    }

    /// The ggml type of the weight, `None` when dense (`BF16` for a bf16-rounded weight).
    pub fn ggml(&self) -> Option<GgmlDType> {
        match self {
            Linear::PackedBf16 { .. } | Linear::Bf16 { .. } => Some(GgmlDType::BF16),
            Linear::PackedAmx { weight, .. } if weight.parts() == Parts::One => {
                Some(GgmlDType::BF16)
            }
            Linear::Dense(_) | Linear::Packed { .. } | Linear::PackedAmx { .. } => None,
            Linear::PackedQ8 { .. } => Some(GgmlDType::Q8_0),
            Linear::PackedQ4 { weight, .. } => Some(weight.format()),
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

    /// `(.., in) -> (.., out)`. A quantized layer with more activation rows than
    /// [`kernel_max_rows`] takes [`Linear::forward_dequantized`].
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense(l) => dense(x, l.weight(), l.bias()),
            Linear::Packed { weight, bias } => {
                add_bias(cpu_gemm::linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedAmx { weight, bias } => {
                add_bias(cpu_amx::linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedQ8 { weight, bias } => {
                add_bias(cpu_amx::q8_linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedQ4 { weight, bias } => {
                add_bias(cpu_q4gemm::linear(x, weight)?, bias.as_ref())
            }
            Linear::PackedBf16 { weight, bias } => {
                add_bias(cpu_bf16gemm::linear(x, weight)?, bias.as_ref())
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

    /// `(.., in) -> (.., out)` through the quantized kernel whatever the row count (tests
    /// compare it with [`Linear::forward_dequantized`]); dense layers as [`Linear::forward`].
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn forward_kernel(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense(l) => l.forward(x),
            Linear::Packed { .. }
            | Linear::PackedAmx { .. }
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
            Linear::PackedQ4 { weight, bias } => {
                dense_rows(x, weight.rows(), weight.dims(), bias.as_ref())
            }
            Linear::Quantized {
                blocks, bias, ggml, ..
            } => {
                if x.device().is_cpu()
                    && x.dtype() == DType::F32
                    && cpu_gemm::choice() == CpuGemm::Packed
                {
                    // packed for this call, Q8_0 / Q4_0 straight from the blocks: the packed
                    // kernel outruns candle's GEMM by more than the packing costs at the row
                    // counts that get here
                    let (n, k) = blocks.shape().dims2()?;
                    let packed = match PackedWeight::from_blocks(*ggml, &blocks.data()?, n, k) {
                        Some(p) => p,
                        None => PackedWeight::pack(&blocks.dequantize(x.device())?)?,
                    };
                    return add_bias(cpu_gemm::linear(x, &packed)?, bias.as_ref());
                }
                // (out, in) blocks -> (out, in) dense, transient
                let w = blocks.dequantize(x.device())?.to_dtype(x.dtype())?;
                let y = dense(x, &w, None)?;
                add_bias(y, bias.as_ref())
            }
        }
    }
}

/// The integer kernel a `ggml` weight of a `dtype` model on `device` gets: `Q8_0`
/// ([`cpu_qgemm`]) or `Q4_0` / `Q4_K` ([`cpu_q4gemm`]), f32, on a CPU where those kernels run
/// (and `FORKSCORE_CPU_GEMM` does not ask for candle's matmul).
fn integer_kernel(ggml: GgmlDType, dtype: DType, device: &Device) -> Option<Isa> {
    let format = matches!(ggml, GgmlDType::Q8_0 | GgmlDType::Q4_0 | GgmlDType::Q4K);
    let fits = format && dtype == DType::F32 && device.is_cpu();
    match fits && cpu_gemm::choice() == CpuGemm::Packed {
        true => Isa::chosen(),
        false => None,
    }
}

/// `w (out, in)` f32 on the host quantized to `ggml` onto `device`. ggml blocks run along `in`
/// and never span two rows, so runs of rows are quantized on the rayon threads independently
/// and their blocks concatenated: byte for byte what quantizing the whole matrix at once gives
/// (tested), in a fraction of the time (candle quantizes on one thread; a 4B model's q4k
/// weights took minutes).
fn quantize_rows_parallel(
    w: &Tensor,
    ggml: GgmlDType,
    device: &Device,
) -> candle_core::Result<QTensor> {
    use rayon::prelude::*;
    let (out, in_dim) = w.dims2()?;
    let host = w.flatten_all()?.to_vec1::<f32>()?;
    // a few tasks per thread, each at least 16 rows
    let rows_per_task = out.div_ceil(rayon::current_num_threads() * 4).max(16);
    let starts: Vec<usize> = (0..out).step_by(rows_per_task).collect();
    let parts = starts
        .par_iter()
        .map(|&r0| {
            let n = rows_per_task.min(out - r0);
            // a tensor of its own: candle's quantize reads a storage from its start, ignoring
            // the offset of a view (`narrow`)
            let rows = Tensor::from_slice(
                &host[r0 * in_dim..(r0 + n) * in_dim],
                (n, in_dim),
                &Device::Cpu,
            )?;
            let q = QTensor::quantize(&rows, ggml)?;
            Ok(q.data()?.into_owned())
        })
        .collect::<candle_core::Result<Vec<Vec<u8>>>>()?;
    let bytes = parts.concat();
    candle_core::quantized::ggml_file::qtensor_from_ggml(ggml, &bytes, vec![out, in_dim], device)
}

/// `x (.., in) · w (out, in)ᵀ (+ bias)`: candle's matmul, or on the CPU in f32 with the
/// `openblas` feature one `cblas_sgemm` ([`super::cpu_blas`]).
fn dense(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
    #[cfg(feature = "openblas")]
    if super::cpu_blas::takes(x, w) {
        return add_bias(super::cpu_blas::linear(x, w)?, bias);
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
        self.count_type(layer.ggml());
    }

    /// One weight of ggml type `t` (`None`: dense).
    pub(crate) fn count_type(&mut self, t: Option<GgmlDType>) {
        let key = match t {
            None => "dense".to_string(),
            Some(t) => format!("{t:?}").to_ascii_lowercase(),
        };
        *self.by_type.entry(key).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantized kernel (activations rounded to 8-bit blocks) vs the dequantize + GEMM path
    /// (f32 activations) on the same blocks, for every ggml type a scheme can pick, with a bias:
    /// they differ only by the activation rounding, bounded here relative to the output scale.
    #[test]
    fn kernel_path_equals_dequantized_path() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        // Activation rounding to 8 bits (|error| <= max|x| / 254 per element), summed over
        // `in` products: measured at most ~0.4% of max|y| here; 2% leaves headroom.
        const RELATIVE: f32 = 0.02;
        for (q, in_dim) in [
            (Quantization::Q8_0, 96),
            (Quantization::Q4K, 256),
            (Quantization::Q4K, 96),
        ] {
            let w = Tensor::rand(-0.2f32, 0.2, (24, in_dim), &dev)?;
            let b = Tensor::rand(-1f32, 1.0, 24, &dev)?;
            let layer = Linear::quantized("w", &w, Some(b), q, DType::F32, &dev)
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            assert_eq!(layer.ggml(), ggml_type(q, in_dim));
            let x = Tensor::rand(-1f32, 1.0, (2, 7, in_dim), &dev)?;
            let a = layer.forward_kernel(&x)?;
            let d = layer.forward_dequantized(&x)?;
            assert_eq!(a.dims(), &[2, 7, 24]);
            let scale = d.abs()?.max_all()?.to_scalar::<f32>()?;
            let diff = (&a - &d)?.abs()?.max_all()?.to_scalar::<f32>()?;
            eprintln!("{q} in {in_dim}: relative difference {}", diff / scale);
            assert!(
                diff <= RELATIVE * scale,
                "{q} in {in_dim}: |kernel - dequantized| {diff} > {RELATIVE} * {scale}"
            );
            // forward() picks one of the two (14 rows > the Q8_0 / Q4_0 kernel limit of
            // candle's kernels; the integer kernel of cpu_qgemm takes every row count)
            let f = layer.forward(&x)?;
            let integer = matches!(layer, Linear::PackedQ8 { .. } | Linear::PackedQ4 { .. });
            let ggml = layer.ggml().unwrap_or(GgmlDType::F32);
            let pick = if integer || kernel_max_rows(&dev, ggml) >= 14 {
                a
            } else {
                d
            };
            let same = (f - pick)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!(same, 0.0, "{q} in {in_dim}: forward took neither path");
        }
        Ok(())
    }

    /// Quantizing runs of rows in parallel gives exactly the blocks of quantizing the whole
    /// matrix at once, for every ggml type a scheme can pick and a row count that does not
    /// divide into the tasks evenly.
    #[test]
    fn parallel_quantization_equals_whole_matrix_quantization() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        for (ggml, in_dim) in [
            (GgmlDType::Q8_0, 96),
            (GgmlDType::Q4_0, 64),
            (GgmlDType::Q4K, 512),
        ] {
            for out in [1usize, 37, 301] {
                let w = Tensor::randn(0f32, 0.3, (out, in_dim), &dev)?;
                let whole = QTensor::quantize(&w, ggml)?;
                let parallel = quantize_rows_parallel(&w, ggml, &dev)?;
                assert_eq!(parallel.shape().dims(), &[out, in_dim]);
                assert_eq!(parallel.dtype(), ggml);
                assert!(
                    whole.data()? == parallel.data()?,
                    "{ggml:?} ({out}, {in_dim}): blocks differ"
                );
            }
        }
        Ok(())
    }

    /// Where the integer kernels run, an f32 model's Q8_0 / Q4_0 / Q4_K layers take them (not
    /// candle's blocks), count as their ggml type, and stack: the stacked layer's output is the
    /// parts' outputs side by side, bit for bit.
    #[test]
    fn quantized_layers_take_the_integer_kernels_and_stack() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        for (q, in_dim, want) in [
            (Quantization::Q8_0, 64, GgmlDType::Q8_0),
            (Quantization::Q4K, 96, GgmlDType::Q4_0),
            (Quantization::Q4K, 256, GgmlDType::Q4K),
        ] {
            let layer = |rows: usize| -> candle_core::Result<Linear> {
                let w = Tensor::randn(0f32, 0.2, (rows, in_dim), &dev)?;
                let b = Tensor::randn(0f32, 1.0, rows, &dev)?;
                Linear::quantized("w", &w, Some(b), q, DType::F32, &dev)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            };
            let (a, b) = (layer(32)?, layer(20)?);
            assert_eq!(a.ggml(), Some(want));
            if integer_kernel(want, DType::F32, &dev).is_none() {
                assert!(
                    matches!(a, Linear::Quantized { .. }),
                    "no integer kernel here"
                );
                continue;
            }
            match want {
                GgmlDType::Q8_0 => assert!(matches!(a, Linear::PackedQ8 { .. })),
                _ => assert!(matches!(a, Linear::PackedQ4 { .. })),
            }
            let stacked = Linear::stack(&[&a, &b])
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?
                .expect("32 rows first: aligned");
            assert_eq!(stacked.ggml(), Some(want));
            let x = Tensor::randn(0f32, 1.0, (5, in_dim), &dev)?;
            let want_y = Tensor::cat(&[a.forward(&x)?, b.forward(&x)?], 1)?;
            let got = stacked.forward(&x)?;
            assert_eq!(got.to_vec2::<f32>()?, want_y.to_vec2::<f32>()?, "{want:?}");
            // 20 rows first: the padded panel would sit inside the stack
            assert!(Linear::stack(&[&b, &a])
                .map_err(|e| candle_core::Error::Msg(e.to_string()))?
                .is_none());
        }
        Ok(())
    }

    /// `bf16` rounds every weight, whatever `in` (no block): an f32 model on a CPU with AVX-512
    /// BF16 takes the packed kernel, elsewhere the bf16 tensor. Both equal the f32 product of
    /// the bf16-rounded operands plus the bias (the kernel within f32 rounding, candle's bf16
    /// matmul within its output's bf16 rounding), count as `bf16`, and stack bit for bit.
    #[test]
    fn bf16_layers_round_the_weights_and_stack() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let in_dim = 45;
        let make = |rows: usize| -> candle_core::Result<(Tensor, Tensor, Linear)> {
            let w = Tensor::randn(0f32, 0.2, (rows, in_dim), &dev)?;
            let b = Tensor::randn(0f32, 1.0, rows, &dev)?;
            let l = Linear::quantized(
                "w",
                &w,
                Some(b.clone()),
                Quantization::Bf16,
                DType::F32,
                &dev,
            )
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
            Ok((w, b, l))
        };
        let (w, b, layer) = make(32)?;
        assert_eq!(layer.ggml(), Some(GgmlDType::BF16));
        let kernel = cpu_bf16gemm::kernel()?;
        let took = match &layer {
            Linear::PackedAmx { weight, .. } if weight.parts() == Parts::One => Bf16Kernel::Amx,
            Linear::PackedBf16 { .. } => Bf16Kernel::Dot,
            Linear::Bf16 { .. } => Bf16Kernel::Candle,
            other => panic!("a bf16 layer became {other:?}"),
        };
        assert_eq!(took, kernel);
        let generic = Linear::Bf16 {
            weight: w.to_dtype(DType::BF16)?,
            bias: Some(b.clone()),
        };
        let x = Tensor::randn(0f32, 1.0, (2, 7, in_dim), &dev)?;
        let round = |t: &Tensor| t.to_dtype(DType::BF16)?.to_dtype(DType::F32);
        let want = round(&x)?
            .broadcast_matmul(&round(&w)?.t()?)?
            .broadcast_add(&b)?;
        let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
        for (name, l, relative) in [
            ("layer", &layer, 1e-5f32),
            ("bf16 tensor", &generic, 1.0 / 256.0),
        ] {
            let got = l.forward(&x)?;
            assert_eq!(got.dims(), &[2, 7, 32]);
            assert_eq!(got.dtype(), DType::F32);
            let diff = (&got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(
                diff <= relative * scale,
                "{name}: {diff} > {relative} * {scale}"
            );
            // the packed weight's dequantized path keeps the f32 activations (the tests' other
            // reference); the bf16 tensor's is its forward
            let dq = l.forward_dequantized(&x)?;
            let want_dq = match l {
                Linear::PackedBf16 { .. } | Linear::PackedAmx { .. } => {
                    x.broadcast_matmul(&round(&w)?.t()?)?.broadcast_add(&b)?
                }
                _ => want.clone(),
            };
            let diff = (&dq - &want_dq)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff <= relative * scale, "{name} dequantized: {diff}");
        }
        let (_, _, other) = make(20)?;
        let stacked = Linear::stack(&[&layer, &other])
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?
            .expect("bf16 layers stack");
        assert_eq!(stacked.ggml(), Some(GgmlDType::BF16));
        let x = Tensor::randn(0f32, 1.0, (5, in_dim), &dev)?;
        let parts = Tensor::cat(&[layer.forward(&x)?, other.forward(&x)?], 1)?;
        assert_eq!(
            stacked.forward(&x)?.to_vec2::<f32>()?,
            parts.to_vec2::<f32>()?
        );
        Ok(())
    }

    /// A weight stored in a block format (a GGUF tensor) keeps that format: Q8_0 / Q4_0 /
    /// Q4_K take the integer kernels where they run, the others candle's blocks; its output is
    /// the dequantized weight's product within the activation rounding. A pair format with an
    /// odd block count per row is dequantized (dense); bytes that do not match the shape are a
    /// typed error.
    #[test]
    fn stored_blocks_keep_their_format() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let err = |e: CandleError| candle_core::Error::Msg(e.to_string());
        for (ggml, in_dim, kept) in [
            (GgmlDType::Q8_0, 64, true),
            (GgmlDType::Q4_0, 64, true),
            (GgmlDType::Q4K, 256, true),
            (GgmlDType::Q6K, 256, true),
            (GgmlDType::Q5_0, 64, true),
            (GgmlDType::Q5_0, 96, false),
        ] {
            let w = Tensor::randn(0f32, 0.2, (24, in_dim), &dev)?;
            let q = QTensor::quantize(&w, ggml)?;
            let dense = q.dequantize(&dev)?;
            let bytes = q.data()?.into_owned();
            let b = Tensor::randn(0f32, 1.0, 24, &dev)?;
            let layer = Linear::from_blocks(
                "w",
                ggml,
                &bytes,
                (24, in_dim),
                Some(b.clone()),
                DType::F32,
                &dev,
            )
            .map_err(err)?;
            assert_eq!(layer.ggml(), kept.then_some(ggml), "{ggml:?} in {in_dim}");
            for rows in [2usize, 9] {
                let x = Tensor::randn(0f32, 1.0, (rows, in_dim), &dev)?;
                let want = x.matmul(&dense.t()?)?.broadcast_add(&b)?;
                let got = layer.forward(&x)?;
                let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
                let diff = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
                assert!(
                    diff <= 0.02 * scale,
                    "{ggml:?} in {in_dim}, {rows} rows: {diff} vs scale {scale}"
                );
            }
            let short = Linear::from_blocks(
                "w",
                ggml,
                &bytes[..bytes.len() - 2],
                (24, in_dim),
                None,
                DType::F32,
                &dev,
            );
            assert!(
                matches!(short, Err(CandleError::Quantize { .. })),
                "{ggml:?}: short bytes accepted"
            );
        }
        Ok(())
    }

    #[test]
    fn ggml_types_follow_the_input_width() {
        assert_eq!(ggml_type(Quantization::Q8_0, 896), Some(GgmlDType::Q8_0));
        assert_eq!(ggml_type(Quantization::Q8_0, 40), None);
        assert_eq!(ggml_type(Quantization::Q4K, 4864), Some(GgmlDType::Q4K));
        assert_eq!(ggml_type(Quantization::Q4K, 896), Some(GgmlDType::Q4_0));
        assert_eq!(ggml_type(Quantization::Q4K, 40), None);
        assert_eq!(ggml_type(Quantization::Q4K, 0), None);
        assert_eq!(ggml_type(Quantization::Bf16, 45), Some(GgmlDType::BF16));
    }
}
