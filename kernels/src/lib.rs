//! forkscore's own CUDA kernels, as nvcc's fat binaries of the sources in `cuda/` (see
//! `build.rs`): machine code for the build's compute capability plus compute_80 PTX. The
//! tensor-facing shells that load and launch them live in `forkscore-backends`; this crate has no
//! dependency at all, so the kernels build and can be inspected on their own
//! (`cargo build -p forkscore-kernels --features cuda`). Without the `cuda` feature it is empty.

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
    /// Exact top-K over the vocabulary.
    pub const VOCAB_TOPK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vocab_topk.fatbin"));
}
