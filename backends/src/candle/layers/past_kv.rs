//! The retained keys and values a call's new tokens attend to, as every attention kernel
//! (candle path, CPU kernel, flash kernel) takes them. A leaf: the kernels and their dispatcher
//! ([`super::attention`]) all import it, none through another.

use candle_core::Tensor;

/// The retained keys/values of `S` slots, each `(Hkv, S, P, hd)`.
pub struct PastKv<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
}
