//! [`Linear`] layers built from a dense weight quantized at load, or from a checkpoint's stored
//! ggml blocks: the integer CPU kernels' packed layouts where they run, candle's `QMatMul`
//! elsewhere, bf16 weights for `--quantize bf16`.

use super::*;
use crate::candle::cpu;
use crate::candle::cpu::host::PackTensor;

impl Linear {
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
        if q == Quantization::Int8 {
            if !(dtype == DType::F32 && device.is_cpu() && cpu::amx::int8_runs()) {
                return Err(CandleError::Quantize {
                    name: name.to_string(),
                    reason: "--quantize int8 runs only on a CPU with AMX-INT8 tiles (Intel Xeon \
                             Sapphire Rapids or later, Linux) in f32 compute; use --quantize q8_0 \
                             (8-bit blocks, every CPU and GPU) or bf16"
                        .to_string(),
                });
            }
            let weight = cpu::amx::pack_int8(weight).map_err(op("int8"))?;
            return Ok(Linear::PackedI8 {
                weight: Arc::new(weight),
                bias,
            });
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
                _ => cpu::q4gemm::from_blocks(ggml, &data, n, k, isa).map(|w| Linear::PackedQ4 {
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
    /// `Q4_0` / `Q4_K` / `Q5_0` / `Q6_K`) the blocks are packed for it, as `--quantize` packs its own; any other
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
                _ => cpu::q4gemm::from_blocks(ggml, bytes, out, in_dim, isa).map(|w| {
                    Linear::PackedQ4 {
                        weight: Arc::new(w),
                        bias: bias.clone(),
                    }
                }),
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
            true => cpu::bf16gemm::kernel()?,
            false => Bf16Kernel::Candle,
        };
        Ok(match kernel {
            Bf16Kernel::Amx => Linear::PackedAmx {
                weight: Arc::new(cpu::amx::pack_bf16(weight)?),
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
}

/// The integer kernel a `ggml` weight of a `dtype` model on `device` gets: `Q8_0`
/// ([`cpu_qgemm`]) or `Q4_0` / `Q4_K` / `Q5_0` / `Q6_K` ([`cpu_q4gemm`]), f32, on a CPU where those kernels run
/// (and `FORKSCORE_CPU_GEMM` does not ask for candle's matmul).
pub(super) fn integer_kernel(ggml: GgmlDType, dtype: DType, device: &Device) -> Option<Isa> {
    let format = matches!(
        ggml,
        GgmlDType::Q8_0 | GgmlDType::Q4_0 | GgmlDType::Q4K | GgmlDType::Q5_0 | GgmlDType::Q6K
    );
    let fits = format && dtype == DType::F32 && device.is_cpu();
    match fits && cpu::gemm::choice() == CpuGemm::Packed {
        true => Isa::chosen(),
        false => None,
    }
}

/// `w (out, in)` f32 on the host quantized to `ggml` onto `device`. ggml blocks run along `in`
/// and never span two rows, so runs of rows are quantized on the rayon threads independently
/// and their blocks concatenated: byte for byte what quantizing the whole matrix at once gives
/// (tested), in a fraction of the time (candle quantizes on one thread; a 4B model's q4k
/// weights took minutes).
pub(super) fn quantize_rows_parallel(
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
