//! The CPU linear kernels ([`super::cpu_gemm`], [`super::cpu_qgemm`]) on their own, for the
//! `cpu_linear` bench: pack a weight once, then time products at one blocking after another in
//! one process. Not part of the engine's API (the model layers reach the kernels through
//! `linear`); hidden from the docs.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};

use super::cpu_amx::{self, AmxWeight};
use super::cpu_gemm::{self, Blocking, PackedWeight};
use super::cpu_isa::Isa;
use super::cpu_qgemm::{self, PackedQ8};
use crate::error::CandleError;

fn tensor_err(op: &'static str) -> impl Fn(candle_core::Error) -> CandleError {
    move |source| CandleError::Tensor { op, source }
}

fn chosen_isa() -> Result<Isa, CandleError> {
    Isa::chosen().ok_or_else(|| CandleError::Device {
        reason: "the CPU kernels need x86-64 with AVX2 + FMA".into(),
    })
}

/// An f32 weight `(out, in)` packed for the f32 kernel.
pub struct F32Weight(PackedWeight);

impl F32Weight {
    /// Pack `w (out, in)` (any float dtype).
    pub fn pack(w: &Tensor) -> Result<Self, CandleError> {
        PackedWeight::pack(w)
            .map(F32Weight)
            .map_err(tensor_err("pack f32 weight"))
    }
}

/// An f32 weight `(out, in)` split into bf16 planes for the AMX kernel.
pub struct AmxF32Weight(AmxWeight);

impl AmxF32Weight {
    /// Split `w (out, in)` (any float dtype).
    pub fn pack(w: &Tensor) -> Result<Self, CandleError> {
        AmxWeight::pack(w)
            .map(AmxF32Weight)
            .map_err(tensor_err("split f32 weight"))
    }
}

/// Whether the AMX bf16 × 6 f32 kernel runs on this CPU (AMX tiles granted), whether or not
/// the model's layers use it (they do with `FORKSCORE_CPU_GEMM=amx`).
pub fn amx() -> bool {
    cpu_amx::available()
}

/// `x (.., in) · Wᵀ` through the AMX kernel with blocking `spec` (`mc=…,pf=…` over the
/// default, as `FORKSCORE_CPU_AMX`; an error where AMX does not run or `spec` is wrong).
pub fn linear_amx(x: &Tensor, w: &AmxF32Weight, spec: &str) -> Result<Tensor, CandleError> {
    let bl = cpu_amx::AmxBlocking::parse(spec).map_err(|reason| CandleError::InvalidRequest {
        reason: format!("amx blocking `{spec}`: {reason}"),
    })?;
    cpu_amx::linear_with(x, &w.0, &bl).map_err(tensor_err("amx f32 linear"))
}

/// A weight `(out, in)` quantized to `Q8_0` and packed for the integer kernel of the chosen
/// instruction level.
pub struct Q8Weight(PackedQ8);

impl Q8Weight {
    /// Quantize `w (out, in)` (f32; `in` a multiple of 32) the way `--quantize q8_0` does, and
    /// pack it.
    pub fn quantize(w: &Tensor) -> Result<Self, CandleError> {
        let (n, k) = w.dims2().map_err(tensor_err("q8_0 weight dims"))?;
        let q = QTensor::quantize(w, GgmlDType::Q8_0).map_err(tensor_err("quantize q8_0"))?;
        let bytes = q.data().map_err(tensor_err("q8_0 bytes"))?;
        PackedQ8::from_blocks(&bytes, n, k, chosen_isa()?)
            .map(Q8Weight)
            .ok_or_else(|| CandleError::Quantize {
                name: format!("({n}, {k}) weight"),
                reason: "in is not a multiple of 32".into(),
            })
    }
}

/// The instruction level the kernels run with here (`"avx512"` / `"avx2"`), or `None`.
pub fn isa() -> Option<&'static str> {
    Isa::chosen().map(Isa::name)
}

/// The blocking `spec` (`key=value,…` over the default, see `FORKSCORE_CPU_GEMM_BLOCKING`)
/// resolves to on this CPU, printed as `mr=…,kc=…,mc=…,nc=…,short_k=…`; an error names a
/// wrong key or value.
pub fn blocking(spec: &str) -> Result<String, CandleError> {
    let isa = chosen_isa()?;
    let b = Blocking::parse(spec, isa).map_err(|reason| CandleError::InvalidRequest {
        reason: format!("blocking `{spec}`: {reason}"),
    })?;
    Ok(format!(
        "mr={},kc={},mc={},nc={},short_k={}",
        b.mr, b.kc, b.mc, b.nc, b.short_k
    ))
}

/// `x (.., in) · Wᵀ` through the f32 kernel with blocking `spec` (as [`blocking`]).
pub fn linear_f32(x: &Tensor, w: &F32Weight, spec: &str) -> Result<Tensor, CandleError> {
    let isa = chosen_isa()?;
    let b = Blocking::parse(spec, isa).map_err(|reason| CandleError::InvalidRequest {
        reason: format!("blocking `{spec}`: {reason}"),
    })?;
    cpu_gemm::linear_with(x, &w.0, isa, &b).map_err(tensor_err("packed f32 linear"))
}

/// `x (.., in) · Wᵀ` (f32 `x`) through the `Q8_0` integer kernel.
pub fn linear_q8(x: &Tensor, w: &Q8Weight) -> Result<Tensor, CandleError> {
    if x.dtype() != DType::F32 {
        return Err(CandleError::InvalidRequest {
            reason: format!("q8_0 linear takes f32 input, not {:?}", x.dtype()),
        });
    }
    cpu_qgemm::linear(x, &w.0).map_err(tensor_err("q8_0 linear"))
}
