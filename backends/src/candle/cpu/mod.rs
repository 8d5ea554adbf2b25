//! The CPU kernels behind the tensor-facing layers: instruction-level detection (`isa`), the
//! packed f32 GEMM (`gemm`), the bf16 (`bf16gemm`, `amx`) and integer (`qgemm`: `Q8_0`,
//! `q4gemm`: `Q4_0` / `Q4_K`) weight kernels over one panel layout (`panel`, `tile_store`),
//! causal / forked attention (`attention`, `key_major`), the elementwise math they share
//! (`math`), host-thread scheduling (`host`), aligned buffers (`aligned`), the switches'
//! parsers (`switches`) and the benches' entry points (`kernels`). Each module's x86 code sits in
//! its own `x86` / `tiles` submodule behind `cfg(target_arch = "x86_64")`; on other CPUs the
//! layers keep candle's path.

pub(in crate::candle) mod aligned;
pub(in crate::candle) mod amx;
pub(in crate::candle) mod attention;
pub(in crate::candle) mod bf16gemm;
#[cfg(feature = "openblas")]
pub(in crate::candle) mod blas;
pub(in crate::candle) mod gemm;
pub(in crate::candle) mod heads;
pub(in crate::candle) mod host;
pub(in crate::candle) mod isa;
#[doc(hidden)]
pub mod kernels;
#[cfg(target_arch = "x86_64")]
pub(in crate::candle) mod key_major;
pub(in crate::candle) mod math;
pub(in crate::candle) mod panel;
pub(in crate::candle) mod q4gemm;
pub(in crate::candle) mod qgemm;
pub(in crate::candle) mod switches;
pub(in crate::candle) mod tile_store;
