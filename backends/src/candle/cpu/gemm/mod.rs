//! The tensor-facing shell of the packed f32 GEMM (`forkscore_kernels::cpu::gemm`): which CPU
//! GEMM f32 dense layers take in this process (`FORKSCORE_CPU_GEMM`), the blocking it runs with
//! (`FORKSCORE_CPU_GEMM_BLOCKING`), weights packed from tensors and `x (.., k) · Wᵀ` on tensors.
//!
//! The weight is packed only where the CPU has AVX2 and FMA (detected once); elsewhere layers
//! keep candle's dense weight and matmul. `FORKSCORE_CPU_GEMM=candle` (or `openblas` with that
//! feature) keeps the dense weight too, to compare; `FORKSCORE_CPU_GEMM=amx` splits it for the
//! AMX kernel of [`super::amx`] where the CPU has AMX. The equivalence tests hold this kernel to
//! candle's matmul.

use candle_core::quantized::GgmlDType;
use candle_core::{Result, Tensor};
use forkscore_kernels::cpu::gemm as kernel;

use super::host::{kernel_err, PackTensor};
use super::isa::Isa;

pub(crate) use kernel::{Blocking, PackedWeight};

impl PackTensor for PackedWeight {
    fn from_host_rows(w: &[f32], n: usize, k: usize) -> Self {
        PackedWeight::from_rows(w, n, k)
    }
}

/// The blocking this process runs `isa` with: [`Blocking::default_for`], or
/// `FORKSCORE_CPU_GEMM_BLOCKING` over it (read once; an invalid value is an error naming it).
pub(crate) fn chosen_blocking(isa: Isa) -> Result<Blocking> {
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<&str>> = OnceLock::new();
    let spec = SPEC.get_or_init(|| crate::switches::value("FORKSCORE_CPU_GEMM_BLOCKING"));
    match spec {
        None => Ok(Blocking::default_for(isa)),
        Some(s) => Blocking::parse(s, isa).map_err(|e| {
            candle_core::Error::Msg(format!("FORKSCORE_CPU_GEMM_BLOCKING={s:?}: {e}"))
        }),
    }
}

/// Which CPU GEMM f32 dense layers use, read once from `FORKSCORE_CPU_GEMM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuGemm {
    /// Weights packed at load, the packed kernel (the default where the CPU has AVX2 + FMA).
    Packed,
    /// The system OpenBLAS (`--features openblas`, `FORKSCORE_CPU_GEMM=openblas`).
    OpenBlas,
    /// candle's matmul (the reference; the default elsewhere).
    Candle,
}

/// The GEMM this process runs CPU f32 linear layers with.
pub(crate) fn choice() -> CpuGemm {
    use std::sync::OnceLock;
    static C: OnceLock<CpuGemm> = OnceLock::new();
    *C.get_or_init(|| match asked() {
        "candle" => CpuGemm::Candle,
        "openblas" if cfg!(feature = "openblas") => CpuGemm::OpenBlas,
        _ if kernel_available() => CpuGemm::Packed,
        _ if cfg!(feature = "openblas") => CpuGemm::OpenBlas,
        _ => CpuGemm::Candle,
    })
}

/// Whether f32 dense layers run through the AMX bf16 × 6 kernel of [`super::amx`]: only
/// when asked (`FORKSCORE_CPU_GEMM=amx`) and the CPU and OS run AMX tiles; elsewhere, or
/// unasked, the packed kernel. Opt-in because on the AMX CPUs tried it measured slower end
/// to end than the AVX-512 kernel (see `cpu_amx`).
pub(crate) fn amx() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        asked() == "amx" && choice() == CpuGemm::Packed && super::isa::amx_available()
    })
}

/// `FORKSCORE_CPU_GEMM`, trimmed (empty when unset), read once.
fn asked() -> &'static str {
    use std::sync::OnceLock;
    static ASKED: OnceLock<String> = OnceLock::new();
    ASKED.get_or_init(|| {
        crate::switches::value("FORKSCORE_CPU_GEMM")
            .unwrap_or_default()
            .to_ascii_lowercase()
    })
}

/// Whether this CPU runs the packed kernel (x86-64 with AVX2 and FMA: some [`Isa`] level).
pub(crate) fn kernel_available() -> bool {
    Isa::chosen().is_some()
}

/// Pack a ggml weight `(n, k)` straight from its blocks ([`PackedWeight::from_blocks`]), for
/// `Q8_0` and `Q4_0`; `None` for other types or a byte count that does not fit `(n, k)`.
pub(crate) fn from_blocks(
    ggml: GgmlDType,
    bytes: &[u8],
    n: usize,
    k: usize,
) -> Option<PackedWeight> {
    let blocks = match ggml {
        GgmlDType::Q8_0 => kernel::Blocks::Q8_0,
        GgmlDType::Q4_0 => kernel::Blocks::Q4_0,
        _ => return None,
    };
    PackedWeight::from_blocks(blocks, bytes, n, k)
}

/// `W` as a dense `(n, k)` f32 tensor on the host.
#[cfg(test)]
fn unpack(w: &PackedWeight) -> Result<Tensor> {
    Tensor::from_vec(w.rows(), w.dims(), &candle_core::Device::Cpu)
}

/// `x (.., k) · Wᵀ -> (.., n)` f32 on the CPU. Errors (never panics) on a non-f32, non-CPU or
/// mis-sized `x`.
pub(crate) fn linear(x: &Tensor, w: &PackedWeight) -> Result<Tensor> {
    match Isa::chosen().map(Isa::f32_level) {
        Some(isa) => linear_with(x, w, isa, &chosen_blocking(isa)?),
        None => candle_core::bail!("packed linear: this CPU has no AVX2 + FMA"),
    }
}

/// Whether [`swiglu`] takes a gate | up weight of input width `k` in this process: the
/// kernel runs here and its blocking keeps `k` innermost (`k ≤ short_k`), so each output block
/// is whole while it is in cache.
pub(crate) fn swiglu_fits(k: usize) -> bool {
    match Isa::chosen().map(Isa::f32_level) {
        Some(isa) => chosen_blocking(isa).is_ok_and(|bl| k <= bl.short_k),
        None => false,
    }
}

/// `x (.., k) -> (.., F)`: `SiLU(x · gateᵀ) · (x · upᵀ)` for a weight of
/// [`PackedWeight::gate_up`] ([`kernel::swiglu_product`]: the `(.., 2F)` product is never
/// stored). Equal bit for bit to [`linear`] on the stacked weight followed by
/// [`super::super::layers::swiglu::swiglu`] (tested). Errors as [`linear`], and where
/// [`swiglu_fits`] does not hold.
pub(crate) fn swiglu(x: &Tensor, w: &PackedWeight) -> Result<Tensor> {
    let Some(isa) = Isa::chosen().map(Isa::f32_level) else {
        candle_core::bail!("packed gate|up: this CPU has no AVX2 + FMA");
    };
    swiglu_with(x, w, isa, &chosen_blocking(isa)?)
}

/// [`swiglu`] with the microkernel of `isa` and blocking `bl` (`k ≤ bl.short_k`; an odd
/// panel block `nc` is taken one larger, so no block splits a (gate, up) pair).
pub(crate) fn swiglu_with(x: &Tensor, w: &PackedWeight, isa: Isa, bl: &Blocking) -> Result<Tensor> {
    let (n, k) = w.dims();
    let ready = || kernel::check_swiglu(w, isa, bl).map_err(kernel_err);
    super::host::try_apply_rows(x, (n / 2, k), "packed gate|up", ready, |xd, m| {
        kernel::swiglu_product(xd, m, w, isa, bl).map_err(kernel_err)
    })
}

/// [`linear`] with the microkernel of `isa` (which the CPU must support: an error otherwise)
/// and blocking `bl` (an error if `isa`'s tile cannot hold it or a count is 0).
pub(crate) fn linear_with(x: &Tensor, w: &PackedWeight, isa: Isa, bl: &Blocking) -> Result<Tensor> {
    let ready = || kernel::check(isa, bl).map_err(kernel_err);
    super::host::try_apply_rows(x, w.dims(), "packed linear", ready, |xd, m| {
        kernel::product(xd, m, w, isa, bl).map_err(kernel_err)
    })
}

#[cfg(test)]
mod tests;
