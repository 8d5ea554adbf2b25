//! The tensor-facing shell of the AMX kernels (`forkscore_kernels::cpu::amx`): f32 weights
//! split into bf16 × 3 (`FORKSCORE_CPU_GEMM=amx`) or rounded to bf16 (`--quantize bf16`) from
//! tensors, the blocking this process runs (`FORKSCORE_CPU_AMX`), whether `Q8_0` weights take
//! the AMX-INT8 tiles (`FORKSCORE_CPU_Q8=amx`), and `x (.., k) · Wᵀ` on tensors. The tests hold
//! the kernel to candle's matmul where AMX runs.

use candle_core::{Result, Tensor};
use forkscore_kernels::cpu::amx as kernel;

use super::host::{kernel_err, with_host_rows, PackTensor};

#[cfg(test)]
use kernel::available;
pub(crate) use kernel::{AmxBlocking, AmxI8Weight, AmxWeight, Parts};

impl PackTensor for AmxWeight {
    /// Split in three.
    fn from_host_rows(w: &[f32], n: usize, k: usize) -> Self {
        AmxWeight::from_rows(w, n, k)
    }
}

/// `w (n, k)` (any float dtype, any device) rounded to bf16: one plane (`--quantize bf16`).
pub(crate) fn pack_bf16(w: &Tensor) -> Result<AmxWeight> {
    with_host_rows(w, |w, n, k| AmxWeight::split_rows(w, n, k, Parts::One))
}

/// `w (n, k)` (any float dtype, any device) rounded to int8 per output row
/// (`--quantize int8`), packed for the AMX-INT8 tiles.
pub(crate) fn pack_int8(w: &Tensor) -> Result<AmxI8Weight> {
    with_host_rows(w, AmxI8Weight::quantize_rows)
}

/// Whether the AMX tiles serve this process's layers: the CPU and OS run them and the
/// instruction level is not capped below AVX-512 (`FORKSCORE_CPU_ISA=avx2|avxvnni` stands for a
/// CPU without AVX-512, hence without AMX).
pub(crate) fn tiles_run() -> bool {
    kernel::available() && super::isa::Isa::chosen() == Some(super::isa::Isa::Avx512)
}

/// Whether `--quantize int8` runs here: [`tiles_run`] on a CPU with AMX-INT8.
pub(crate) fn int8_runs() -> bool {
    tiles_run() && kernel::q8_available()
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 for a per-channel int8 weight on the AMX-INT8 tiles, the
/// activations rounded per row. Errors (never panics) as [`linear`].
pub(crate) fn int8_linear(x: &Tensor, w: &AmxI8Weight) -> Result<Tensor> {
    let ready = || match int8_runs() {
        true => Ok(()),
        false => candle_core::bail!("int8 linear: this CPU does not run the AMX-INT8 tiles"),
    };
    super::host::try_apply_rows(x, w.dims(), "int8 linear", ready, |xd, m| {
        kernel::int8_product(xd, m, w).map_err(kernel_err)
    })
}

/// The SwiGLU of an int8 gate | up weight of [`AmxI8Weight::gate_up`], taken from the scaled
/// output tiles: equal bit for bit to [`int8_linear`] over the stacked weight followed by the
/// SwiGLU pass (tested). Errors as [`int8_linear`].
pub(crate) fn int8_swiglu(x: &Tensor, w: &AmxI8Weight) -> Result<Tensor> {
    let (n, k) = w.dims();
    let ready = || match int8_runs() {
        true => Ok(()),
        false => candle_core::bail!("int8 gate|up: this CPU does not run the AMX-INT8 tiles"),
    };
    super::host::try_apply_rows(x, (n / 2, k), "int8 gate|up", ready, |xd, m| {
        kernel::int8_swiglu_product(xd, m, w).map_err(kernel_err)
    })
}

/// The blocking of this process: the default, or `FORKSCORE_CPU_AMX` over it (read once;
/// an invalid value is an error naming it).
pub(crate) fn chosen_blocking() -> Result<AmxBlocking> {
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<&str>> = OnceLock::new();
    match SPEC.get_or_init(|| crate::switches::value("FORKSCORE_CPU_AMX")) {
        None => Ok(AmxBlocking::DEFAULT),
        Some(s) => match AmxBlocking::parse(s) {
            Ok(b) if b.hot => candle_core::bail!(
                "FORKSCORE_CPU_AMX={s:?}: hot is a timing probe with wrong results"
            ),
            Ok(b) => Ok(b),
            Err(e) => candle_core::bail!("FORKSCORE_CPU_AMX={s:?}: {e}"),
        },
    }
}

/// A `Q8_0` linear layer `x (.., k) · Wᵀ -> (.., n)`: with `FORKSCORE_CPU_Q8=amx` on a CPU with
/// AMX-INT8 ([`q8_runs`]) a weight of the AVX-512 layout runs on the int8 tiles (the same sums
/// as the VNNI kernel, bit for bit), every other weight on [`super::qgemm::linear`].
pub(crate) fn q8_linear(x: &Tensor, w: &super::qgemm::PackedQ8) -> Result<Tensor> {
    if w.isa() == super::isa::Isa::Avx512 && q8_runs()? {
        let ready = || w.isa().require("q8_0 linear").map_err(kernel_err);
        return super::host::try_apply_rows(x, w.dims(), "q8_0 linear", ready, |xd, m| {
            kernel::q8_product(xd, m, w).map_err(kernel_err)
        });
    }
    super::qgemm::linear(x, w)
}

/// Whether `Q8_0` weights run on the AMX int8 tiles in this process: only when
/// `FORKSCORE_CPU_Q8=amx` asks for them and AMX-INT8 runs here (unset or `vnni`: the VNNI
/// kernel). Read once; another value is an error naming it.
pub(crate) fn q8_runs() -> Result<bool> {
    use std::sync::OnceLock;
    static ON: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    ON.get_or_init(|| {
        let asked = crate::switches::value("FORKSCORE_CPU_Q8").unwrap_or_default();
        match asked.trim().to_ascii_lowercase().as_str() {
            "amx" => Ok(kernel::q8_available()),
            "" | "vnni" => Ok(false),
            other => Err(format!(
                "FORKSCORE_CPU_Q8={asked:?}: `{other}`: expected amx or vnni"
            )),
        }
    })
    .clone()
    .map_err(candle_core::Error::Msg)
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 through AMX. Errors (never panics) on a non-f32, non-CPU or
/// mis-sized `x`, or where the kernel does not run (`forkscore_kernels::cpu::amx::available`).
///
/// A one-part (bf16) weight runs the in-place kernel (`bf16_product`: weight blocks in L2,
/// output tiles stored straight into the result), unless `FORKSCORE_CPU_AMX` names a blocking
/// of the blocked kernel (an A/B switch; both give the same bits).
pub(crate) fn linear(x: &Tensor, w: &AmxWeight) -> Result<Tensor> {
    if w.parts() == Parts::One && crate::switches::value("FORKSCORE_CPU_AMX").is_none() {
        let ready = || kernel::check().map_err(kernel_err);
        return super::host::try_apply_rows(x, w.dims(), "amx bf16 linear", ready, |xd, m| {
            kernel::bf16_product(xd, m, w).map_err(kernel_err)
        });
    }
    linear_with(x, w, &chosen_blocking()?)
}

/// `SiLU(x · Gᵀ) · (x · Uᵀ)`, `(.., k) -> (.., F)`, for a gate | up weight of
/// [`AmxWeight::gate_up`], the SwiGLU taken from the output tiles: equal bit for bit to
/// [`linear`] over the stacked `[gate; up]` weight followed by the SwiGLU pass (tested).
/// Errors as [`linear`].
pub(crate) fn bf16_swiglu(x: &Tensor, w: &AmxWeight) -> Result<Tensor> {
    let (n, k) = w.dims();
    let ready = || kernel::check().map_err(kernel_err);
    super::host::try_apply_rows(x, (n / 2, k), "amx bf16 gate|up", ready, |xd, m| {
        kernel::bf16_swiglu_product(xd, m, w).map_err(kernel_err)
    })
}

/// [`linear`] with blocking `bl`.
pub(crate) fn linear_with(x: &Tensor, w: &AmxWeight, bl: &AmxBlocking) -> Result<Tensor> {
    let ready = || kernel::check().map_err(kernel_err);
    super::host::try_apply_rows(x, w.dims(), "amx linear", ready, |xd, m| {
        kernel::product(xd, m, w, bl).map_err(kernel_err)
    })
}

#[cfg(test)]
mod tests;
