//! The tensor-facing shell of the `Q8_0` integer kernels (`forkscore_kernels::cpu::qgemm`):
//! `x (.., k) · Wᵀ` on tensors for a weight packed from candle's `Q8_0` blocks. The kernels'
//! arithmetic, layouts and plain-Rust reference ([`portable`]) are the kernels crate's; the
//! tests here hold the kernels to that reference and to candle's dequantization.

use candle_core::{Result, Tensor};
use forkscore_kernels::cpu::qgemm as kernel;

use super::host::kernel_err;

#[cfg(test)]
use super::isa::Isa;
pub(crate) use kernel::{parse_prefetch, PackedQ8};
#[cfg(test)]
use kernel::{portable, set_prefetch, BLOCK, MC};

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU through the integer kernel of `w`'s ISA.
/// Errors (never panics) on a non-f32, non-CPU or mis-sized `x`, or a CPU without that ISA.
/// (The layer's dispatcher, [`super::amx::q8_linear`], sends AVX-512 weights to the AMX
/// int8 tiles instead when `FORKSCORE_CPU_Q8=amx` asks for them.)
pub(crate) fn linear(x: &Tensor, w: &PackedQ8) -> Result<Tensor> {
    let ready = || w.isa().require("q8_0 linear").map_err(kernel_err);
    super::host::try_apply_rows(x, w.dims(), "q8_0 linear", ready, |xd, m| {
        kernel::product(xd, m, w).map_err(kernel_err)
    })
}

/// `x (.., k) -> (.., F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedQ8::gate_up`], the SwiGLU taken as each output tile is written, so the `(.., 2F)`
/// product is never stored. Equal bit for bit to [`linear`] on the stacked `[gate; up]` weight
/// followed by [`super::super::layers::swiglu::swiglu`] (the same sums, the same SiLU on every
/// element; tested). Errors as [`linear`].
pub(crate) fn swiglu(x: &Tensor, w: &PackedQ8) -> Result<Tensor> {
    let (n, k) = w.dims();
    let ready = || w.isa().require("q8_0 gate|up").map_err(kernel_err);
    super::host::try_apply_rows(x, (n / 2, k), "q8_0 gate|up", ready, |xd, m| {
        kernel::swiglu_product(xd, m, w).map_err(kernel_err)
    })
}

#[cfg(test)]
mod tests;
