//! The tensor-facing shell of the 4-, 5- and 6-bit integer kernels
//! (`forkscore_kernels::cpu::q4gemm`: `Q4_0`, `Q4_K`, `Q5_0`, `Q6_K`): weights packed from candle's blocks of a [`GgmlDType`], and
//! `x (.., k) · Wᵀ` on tensors. The tests hold the kernels to their plain-Rust reference
//! ([`portable`]) and that to candle's dequantization.

use candle_core::quantized::GgmlDType;
use candle_core::{Result, Tensor};
use forkscore_kernels::cpu::q4gemm as kernel;

use super::host::kernel_err;
use super::isa::Isa;

#[cfg(test)]
use forkscore_kernels::cpu::qgemm::portable::quantize_block;
#[cfg(test)]
use kernel::{portable, BLOCK, MC};
pub(crate) use kernel::{PackedQ4, Q4Format};

/// The kernel format of a ggml type (`Q4_0`, `Q4_K`, `Q5_0`, `Q6_K`), `None` for another.
pub(crate) fn format(ggml: GgmlDType) -> Option<Q4Format> {
    match ggml {
        GgmlDType::Q4_0 => Some(Q4Format::Q4_0),
        GgmlDType::Q4K => Some(Q4Format::Q4K),
        GgmlDType::Q5_0 => Some(Q4Format::Q5_0),
        GgmlDType::Q6K => Some(Q4Format::Q6K),
        _ => None,
    }
}

/// The ggml type of a packed 4-bit weight.
pub(crate) fn ggml(w: &PackedQ4) -> GgmlDType {
    match w.format() {
        Q4Format::Q4_0 => GgmlDType::Q4_0,
        Q4Format::Q4K => GgmlDType::Q4K,
        Q4Format::Q5_0 => GgmlDType::Q5_0,
        Q4Format::Q6K => GgmlDType::Q6K,
    }
}

/// Pack `Q4_0`, `Q4_K`, `Q5_0` or `Q6_K` blocks of `(n, k)` (candle's serialized form, per row) for `isa`
/// ([`PackedQ4::from_blocks`]). `None` for another type, a `k` that is not a multiple of its
/// block, or a byte count that does not fit `(n, k)`.
pub(crate) fn from_blocks(
    ggml: GgmlDType,
    bytes: &[u8],
    n: usize,
    k: usize,
    isa: Isa,
) -> Option<PackedQ4> {
    PackedQ4::from_blocks(format(ggml)?, bytes, n, k, isa)
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU through the integer kernel of `w`'s ISA.
/// Errors (never panics) on a non-f32, non-CPU or mis-sized `x`, or a CPU without that ISA.
pub(crate) fn linear(x: &Tensor, w: &PackedQ4) -> Result<Tensor> {
    let ready = || w.isa().require("4-bit linear").map_err(kernel_err);
    super::host::try_apply_rows(x, w.dims(), "4-bit linear", ready, |xd, m| {
        kernel::product(xd, m, w).map_err(kernel_err)
    })
}

/// `x (.., k) -> (.., F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedQ4::gate_up`], the SwiGLU taken as each output tile is written; equal bit for bit
/// to [`linear`] on the stacked weight followed by [`super::super::layers::swiglu::swiglu`]
/// (tested). Errors as [`linear`].
pub(crate) fn swiglu(x: &Tensor, w: &PackedQ4) -> Result<Tensor> {
    let (n, k) = w.dims();
    let ready = || w.isa().require("4-bit gate|up").map_err(kernel_err);
    super::host::try_apply_rows(x, (n / 2, k), "4-bit gate|up", ready, |xd, m| {
        kernel::swiglu_product(xd, m, w).map_err(kernel_err)
    })
}

#[cfg(test)]
mod tests;
