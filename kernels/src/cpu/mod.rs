//! The CPU kernels at slice level: what they compute on `&[f32]` rows, packed weights and raw
//! pointers, without tensors. Grouped by what they compute:
//!
//! - [`gemm`]: the packed f32 GEMM (`y = x Wᵀ` against panels packed once);
//! - [`bf16`]: bf16 weights through AVX-512 BF16 dot products;
//! - [`amx`]: f32 (bf16 × 6) and bf16 weights on AMX tiles, and `Q8_0` on AMX-INT8;
//! - [`qgemm`] (`Q8_0`) and [`q4gemm`] (`Q4_0`, `Q4_K`): integer products of rounded
//!   activations and quantized weights;
//! - [`attention`]: causal / forked attention in tiles (products and key-major forms);
//! - [`math`]: the vectorised `exp`, row maximum and SiLU they share.
//!
//! Around them: [`isa`] (which x86 instructions run, detected once), [`aligned`] (cache-line
//! aligned buffers), [`panel`] and [`tile_store`] (the panel layout every GEMM shares and the
//! tile store writing outputs by panel), `host` (the split of panels over the rayon threads and
//! the blocking specs' parser), [`switch`] (the two environment switches read here) and
//! [`Error`].
//!
//! Each module's x86 code sits in its own `x86` / `tiles` submodule (per instruction set where
//! a module has several) behind `cfg(target_arch = "x86_64")`; a `portable` submodule holds the
//! plain-Rust form of a kernel's sums where one exists (the reference the x86 kernels are held
//! to). The tensor-facing shells (shapes, storage, the per-process choice of kernel) are
//! `forkscore_backends::candle::cpu`.

mod aligned;
pub mod amx;
pub mod attention;
pub mod bf16;
mod error;
pub mod gemm;
mod host;
pub mod isa;
pub mod math;
pub mod panel;
pub mod q4gemm;
pub mod qgemm;
pub mod settings;
#[cfg(test)]
mod testing;
pub(crate) mod tile_store;

pub(crate) use error::bail;
pub use error::{Error, Result};
