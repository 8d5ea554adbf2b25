//! The candle implementation of the backend seam: model architectures, their shared
//! primitives and per-layer state.

pub mod gated_deltanet;
