//! The tensor-facing shells of the CPU kernels. The kernels themselves, on slices and packed
//! weights, are the `forkscore-kernels` crate's (`forkscore_kernels::cpu`, no candle); the
//! shells here check a call's tensors (f32 on the CPU, shapes that fit the weight), read their
//! storage as rows, shape the result back into a tensor, pack weights from tensors, and choose
//! per process which kernel a layer takes (the `FORKSCORE_CPU_*` switches):
//!
//! - [`gemm`]: the packed f32 GEMM, and which CPU GEMM f32 layers take (`FORKSCORE_CPU_GEMM`);
//! - [`bf16gemm`]: the bf16-weight kernel, and which kernel bf16 weights take;
//! - [`amx`]: the AMX kernels (bf16 × 3 f32, bf16, `Q8_0` on AMX-INT8);
//! - [`qgemm`] (`Q8_0`) and [`q4gemm`] (`Q4_0`, `Q4_K`): the integer kernels;
//! - [`attention`]: causal / forked attention over the layers' key / value tensors;
//! - [`heads`]: the q | k | v split with the rotary embedding (a tensor-level pass of its own);
//! - `blas` (feature `openblas`): f32 linear layers through the system OpenBLAS;
//! - [`host`]: the frame the shells share; [`switches`]: the parsers of the switches' values.
//!
//! [`isa`] and [`math`] are the kernels crate's, re-exported for the layers. Where the CPU has no
//! AVX2 + FMA (or off x86-64) the layers keep candle's path.
//!
//! Public: which instruction level and kernels this process's CPU layers take
//! ([`kernel_choice`], [`bf16_kernel`]), for the front end, the benches and reports; the benches
//! time the kernels themselves through `forkscore_kernels::cpu`.

pub(in crate::candle) mod amx;
pub(in crate::candle) mod attention;
pub(in crate::candle) mod bf16gemm;
#[cfg(feature = "openblas")]
pub(in crate::candle) mod blas;
pub(in crate::candle) mod gemm;
pub(in crate::candle) mod heads;
pub(in crate::candle) mod host;
pub(in crate::candle) mod q4gemm;
pub(in crate::candle) mod qgemm;
pub(in crate::candle) mod switches;

pub(in crate::candle) use forkscore_kernels::cpu::{isa, math};

/// The kernels this process's CPU layers take, as the switches and the CPU decide them (each
/// read once): what a bench or a report needs to know to time or label the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelChoice {
    /// The instruction level of the packed and integer kernels (`"avx2"`, `"avxvnni"`,
    /// `"avx512"`; `FORKSCORE_CPU_ISA` caps it), `None` where they do not run.
    pub isa: Option<&'static str>,
    /// f32 dense layers run on the AMX bf16 × 6 kernel (`FORKSCORE_CPU_GEMM=amx` where AMX runs).
    pub f32_amx: bool,
    /// The kernel bf16 weights take (`"amx"`, `"dot"`), `None` for candle's matmul
    /// (`FORKSCORE_CPU_BF16`, `FORKSCORE_CPU_GEMM`).
    pub bf16: Option<&'static str>,
    /// `Q8_0` weights of the AVX-512 layout run on the AMX-INT8 tiles (`FORKSCORE_CPU_Q8=amx`
    /// where AMX-INT8 runs).
    pub q8_amx: bool,
}

/// The kernels this process's CPU layers take; an error names a switch whose value is wrong
/// (`FORKSCORE_CPU_Q8`).
pub fn kernel_choice() -> Result<KernelChoice, crate::error::CandleError> {
    Ok(KernelChoice {
        isa: isa::Isa::chosen().map(isa::Isa::name),
        f32_amx: gemm::amx(),
        bf16: bf16_kernel(),
        q8_amx: amx::q8_runs().map_err(|source| crate::error::CandleError::Tensor {
            op: "cpu kernel choice",
            source,
        })?,
    })
}

/// The kernel bf16 weights run on this CPU (`"amx"`, `"dot"`), or `None` (candle's matmul; also
/// where `FORKSCORE_CPU_BF16` is wrong, which the backend's load refuses by name).
pub fn bf16_kernel() -> Option<&'static str> {
    match bf16gemm::kernel() {
        Ok(bf16gemm::Bf16Kernel::Amx) => Some("amx"),
        Ok(bf16gemm::Bf16Kernel::Dot) => Some("dot"),
        _ => None,
    }
}
