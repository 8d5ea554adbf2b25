//! One story for `--dtype` and `--quantize` on the CPU, decided once before the model loads.
//!
//! On the CPU every activation, norm and sum is f32; what can change is the format of the linear
//! weights (`--quantize q8_0 | q4k | bf16`). A bf16 *tensor* model has no fast CPU kernels (candle's
//! bf16 matmul is about 4× slower than our f32), so:
//! - `--dtype bf16` runs as `--quantize bf16` — bf16 weights on the AMX tiles or the AVX-512 BF16
//!   kernel, activations rounded to bf16 per product, sums in f32 — where the CPU has either;
//!   elsewhere it is refused, naming the alternatives;
//! - `--dtype bf16` beside an explicit `--quantize` keeps that scheme and f32 compute;
//! - `--dtype f16` is refused on the CPU (no f16 kernels at all).
//!
//! On accelerators `--dtype` is the compute dtype, as given.

use forkscore_backends::{ComputeDType, DeviceSpec, Quantization};

/// What a load runs with, after the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Precision {
    pub dtype: ComputeDType,
    pub quantization: Option<Quantization>,
    /// What the policy changed, for the user (printed once at load).
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrecisionError {
    #[error("--dtype bf16 has no fast kernel on this CPU (neither AMX nor AVX-512 BF16): bf16 tensors would run about 4x slower than the default f32. Drop --dtype (f32), or use --quantize q8_0 for 8-bit weights")]
    NoBf16Kernel,
    #[error("--dtype f16 has no CPU kernels: f16 tensors would run several times slower than the default f32. Drop --dtype (f32), or use --quantize bf16 / q8_0 for smaller weights")]
    NoF16Kernel,
}

/// The policy. `bf16_kernel`: the kernel bf16 weights take on this CPU (`"amx"`, `"dot"`), or
/// `None` when only candle's slow matmul would run them.
pub fn resolve(
    device: DeviceSpec,
    dtype: Option<ComputeDType>,
    quantize: Option<Quantization>,
    bf16_kernel: Option<&str>,
) -> Result<Precision, PrecisionError> {
    let asked = dtype.unwrap_or_else(|| device.default_dtype());
    if !matches!(device, DeviceSpec::Cpu) || asked == ComputeDType::F32 {
        return Ok(Precision {
            dtype: asked,
            quantization: quantize,
            note: None,
        });
    }
    match (asked, quantize, bf16_kernel) {
        (ComputeDType::F16, _, _) => Err(PrecisionError::NoF16Kernel),
        (_, Some(q), _) => Ok(Precision {
            dtype: ComputeDType::F32,
            quantization: Some(q),
            note: Some(format!(
                "on the CPU compute is f32: --dtype bf16 is ignored, the linear weights are {q} (--quantize)"
            )),
        }),
        (_, None, Some(kernel)) => Ok(Precision {
            dtype: ComputeDType::F32,
            quantization: Some(Quantization::Bf16),
            note: Some(format!(
                "on the CPU, --dtype bf16 runs as --quantize bf16: bf16 weights on the {} kernel, activations rounded to bf16 per product, sums and everything else f32",
                match kernel {
                    "amx" => "AMX",
                    _ => "AVX-512 BF16",
                }
            )),
        }),
        (_, None, None) => Err(PrecisionError::NoBf16Kernel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: DeviceSpec = DeviceSpec::Cpu;

    #[test]
    fn f32_and_accelerators_are_left_as_given() {
        for q in [None, Some(Quantization::Q8_0)] {
            let p = resolve(CPU, None, q, None).unwrap();
            assert_eq!(
                (p.dtype, p.quantization, p.note),
                (ComputeDType::F32, q, None)
            );
            let p = resolve(CPU, Some(ComputeDType::F32), q, Some("amx")).unwrap();
            assert_eq!((p.dtype, p.quantization), (ComputeDType::F32, q));
        }
        let gpu = DeviceSpec::Cuda(0);
        let p = resolve(gpu, Some(ComputeDType::Bf16), None, None).unwrap();
        assert_eq!(
            (p.dtype, p.quantization, p.note),
            (ComputeDType::Bf16, None, None)
        );
        let p = resolve(gpu, None, None, None).unwrap();
        assert_eq!(p.dtype, gpu.default_dtype());
    }

    #[test]
    fn cpu_bf16_takes_the_fast_bf16_weights_or_is_refused() {
        for kernel in ["amx", "dot"] {
            let p = resolve(CPU, Some(ComputeDType::Bf16), None, Some(kernel)).unwrap();
            assert_eq!(p.dtype, ComputeDType::F32);
            assert_eq!(p.quantization, Some(Quantization::Bf16));
            assert!(p.note.unwrap().contains("--quantize bf16"));
        }
        let e = resolve(CPU, Some(ComputeDType::Bf16), None, None).unwrap_err();
        assert_eq!(e, PrecisionError::NoBf16Kernel);
        assert!(e.to_string().contains("--quantize q8_0"));
    }

    #[test]
    fn cpu_bf16_beside_a_scheme_keeps_the_scheme_and_f16_is_refused() {
        let p = resolve(CPU, Some(ComputeDType::Bf16), Some(Quantization::Q4K), None).unwrap();
        assert_eq!(
            (p.dtype, p.quantization),
            (ComputeDType::F32, Some(Quantization::Q4K))
        );
        assert!(p.note.unwrap().contains("ignored"));
        for q in [None, Some(Quantization::Bf16)] {
            for k in [None, Some("amx")] {
                let e = resolve(CPU, Some(ComputeDType::F16), q, k).unwrap_err();
                assert_eq!(e, PrecisionError::NoF16Kernel);
            }
        }
    }
}
