//! forkscore's own kernels, without candle: what they compute on plain slices and buffers, apart
//! from the tensors that carry their operands through a model. The tensor-facing shells that
//! check shapes, read tensors' storage and choose a kernel per process live in
//! `forkscore-backends` (`candle::cpu`, `candle::cuda`).
//!
//! - [`cpu`]: the CPU kernels at slice level, grouped by what they compute (the f32, bf16, AMX,
//!   `Q8_0` and 4-bit GEMMs, attention, vector math), each with its x86 code in per-ISA
//!   submodules behind `cfg(target_arch = "x86_64")`. Always built (no feature).
//! - [`fatbin`] (feature `cuda`): the CUDA kernels, as nvcc's fat binaries of the sources in
//!   `cuda/` (see `build.rs`): machine code for the build's compute capability plus compute_80
//!   PTX (`cargo build -p forkscore-kernels --features cuda`). Without the feature nothing
//!   needs nvcc.

pub mod cpu;

/// One fat binary per kernel source (`cuda/<name>.cu`).
#[cfg(feature = "cuda")]
pub mod fatbin {
    /// Flash attention: prefill, chunked prefill and forked scoring rows, causal or tree masks.
    pub const FLASH_ATTN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/flash_attn.fatbin"));
    /// Gated DeltaNet: the causal conv + SiLU and the recurrent delta rule.
    pub const GDN_RECURRENT: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/gdn_recurrent.fatbin"));
    /// Gated DeltaNet: the chunked (WY) delta rule on the tensor cores.
    pub const GDN_CHUNKED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gdn_chunked.fatbin"));
    /// Gated DeltaNet: the β / decay gates and the gated RMSNorm.
    pub const GDN_POINTWISE: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/gdn_pointwise.fatbin"));
    /// The SwiGLU of a stacked gate | up product.
    pub const SWIGLU: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/swiglu.fatbin"));
    /// A residual add fused with the RMSNorm that reads it.
    pub const ADD_RMS_NORM: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/add_rms_norm.fatbin"));
    /// A projection's output into head-major heads with the per-head RMSNorm and RoPE fused.
    pub const HEADS_NORM_ROPE: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/heads_norm_rope.fatbin"));
    /// Exact top-K over the vocabulary.
    pub const VOCAB_TOPK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vocab_topk.fatbin"));
}
