//! Which weight stackings CUDA models apply at load time. Each stacks the weights of products
//! that read the same input into one matrix, so one GEMM (and one bias add) replaces several:
//!
//! - gate | up of every MLP (`super::mlp`), followed by the fused SwiGLU kernel;
//! - q | k | v of softmax attention layers with q/k/v biases and no output gate (the Qwen2
//!   family, `super::models::self_attn`): one product and one bias add instead of three each.
//!
//! Both are on by default on CUDA with dense weights and never elsewhere (the CPU path and
//! quantized weights keep the separate products, the reference). [`set_gate_up`] / [`set_qkv`]
//! (the GPU equivalence tests) or `FORKSCORE_MLP=separate` / `FORKSCORE_QKV=separate` (A/B
//! timings) turn them off for models loaded from then on.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::Device;

static GATE_UP: AtomicBool = AtomicBool::new(true);
static QKV: AtomicBool = AtomicBool::new(true);

/// Stack gate and up into one product on CUDA (`true`, the default) or keep two products and
/// candle's SiLU and product (`false`).
pub fn set_gate_up(on: bool) {
    GATE_UP.store(on, Ordering::Relaxed);
}

/// Stack q, k and v (weights and biases) into one product on CUDA (`true`, the default) or keep
/// three products (`false`).
pub fn set_qkv(on: bool) {
    QKV.store(on, Ordering::Relaxed);
}

fn env_separate(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim() == "separate")
}

/// Whether a model loading onto `device` stacks gate | up.
pub(crate) fn gate_up(device: &Device) -> bool {
    device.is_cuda() && GATE_UP.load(Ordering::Relaxed) && !env_separate("FORKSCORE_MLP")
}

/// Whether a model loading onto `device` stacks q | k | v where the layer allows it.
pub(crate) fn qkv(device: &Device) -> bool {
    device.is_cuda() && QKV.load(Ordering::Relaxed) && !env_separate("FORKSCORE_QKV")
}
