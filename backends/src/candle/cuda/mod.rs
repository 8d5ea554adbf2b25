//! CUDA-only support: loading this crate's fat binaries (`cuda_module`), runtime settings (`cuda_runtime`), the flash attention, fused heads and top-K kernels' shells (`flash_attention`, `heads`, `vocab_topk`). The generic candle path is kept everywhere these run.

#[cfg(feature = "cuda")]
pub(in crate::candle) mod cuda_module;
#[cfg(feature = "cuda")]
pub mod cuda_runtime;
pub(in crate::candle) mod flash_attention;
pub mod heads;
pub mod vocab_topk;
