//! Which weight stackings models apply at load time. Each stacks the weights of products that
//! read the same input into one matrix, so one GEMM (and one bias add) replaces several:
//!
//! - gate | up of every MLP (`super::mlp`), followed by the fused SwiGLU pass (`super::swiglu`);
//!   for packed weights (f32, `Q8_0`, `Q4_0`, `Q4_K`) of an f32 model on an x86 CPU, gate's
//!   and up's panels alternate instead and the SwiGLU is taken as each output tile (or f32
//!   block) is written (`super::super::cpu::tile_store`, `super::super::cpu::gemm::swiglu`): the `(…, 2F)`
//!   product is never stored;
//! - q | k | v of softmax attention layers with q/k/v biases and no output gate (the Qwen2
//!   family, `super::super::models::self_attn`): one product and one bias add instead of three each;
//! - q|k|v, z, b and a of every Gated DeltaNet layer (Qwen3.5, `super::super::gated_deltanet`):
//!   one product cut into the four; opt-in ([`set_gdn_projections`], `FORKSCORE_GDN_PROJ=stacked`)
//!   until measured on a GPU.
//!
//! Both are on by default on CUDA and on the CPU, for dense weights (quantized weights keep the
//! separate products). The separate products are the reference: [`set_gate_up`] / [`set_qkv`]
//! (the equivalence tests) or `FORKSCORE_MLP=separate` / `FORKSCORE_QKV=separate` (A/B
//! timings) turn the stackings off for models loaded from then on. On the CPU the stacked
//! gate | up also replaces candle's one-threaded SiLU and a separate product by one vectorised
//! pass on the rayon threads, and the narrow k and v products (128 columns each on
//! Qwen2.5-0.5B) stop packing the activations once more each.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use candle_core::Device;

static GATE_UP: AtomicBool = AtomicBool::new(true);
static GATE_UP_IN_TILES: AtomicBool = AtomicBool::new(true);
static QKV: AtomicBool = AtomicBool::new(true);
/// 0: the default (separate, unless `FORKSCORE_GDN_PROJ=stacked`), 1: stacked, 2: separate.
static GDN_PROJECTIONS: AtomicU8 = AtomicU8::new(0);
static QKV_HEADS: AtomicBool = AtomicBool::new(true);

/// Stack gate and up into one product (`true`, the default) or keep two products and candle's
/// SiLU and product (`false`).
pub fn set_gate_up(on: bool) {
    GATE_UP.store(on, Ordering::Relaxed);
}

/// Stack q, k and v (weights and biases) into one product (`true`, the default) or keep three
/// products (`false`).
pub fn set_qkv(on: bool) {
    QKV.store(on, Ordering::Relaxed);
}

fn env_separate(var: &str) -> bool {
    crate::switches::is(var, "separate")
}

/// Take the SwiGLU of packed gate | up weights inside the kernel's tiles (`true`, the
/// default) or as its own pass after the stacked product (`false`: the reference the tests
/// hold it to), for models loaded from then on.
pub fn set_gate_up_in_tiles(on: bool) {
    GATE_UP_IN_TILES.store(on, Ordering::Relaxed);
}

/// Whether the gate | up SwiGLU may run inside the packed kernels' tiles (the default) or
/// only as its own pass after the stacked product ([`set_gate_up_in_tiles`], or
/// `FORKSCORE_MLP=stacked` for A/B timings).
pub(crate) fn gate_up_in_tiles() -> bool {
    GATE_UP_IN_TILES.load(Ordering::Relaxed) && !crate::switches::is("FORKSCORE_MLP", "stacked")
}

/// Whether a model loading onto `device` stacks gate | up.
pub(crate) fn gate_up(device: &Device) -> bool {
    stacks_on(device) && GATE_UP.load(Ordering::Relaxed) && !env_separate("FORKSCORE_MLP")
}

/// Whether a model loading onto `device` stacks q | k | v where the layer allows it.
pub(crate) fn qkv(device: &Device) -> bool {
    stacks_on(device) && QKV.load(Ordering::Relaxed) && !env_separate("FORKSCORE_QKV")
}

/// Stack a Gated DeltaNet layer's four input projections (`Some(true)`), keep four products
/// (`Some(false)`), or follow the default (`None`: four products unless
/// `FORKSCORE_GDN_PROJ=stacked`), for models loaded from then on.
pub fn set_gdn_projections(on: Option<bool>) {
    let v = match on {
        None => 0,
        Some(true) => 1,
        Some(false) => 2,
    };
    GDN_PROJECTIONS.store(v, Ordering::Relaxed);
}

/// Whether a Gated DeltaNet layer loading onto `device` stacks its q|k|v, z, b and a
/// projections into one product (aimed at CUDA, where the two narrow `b` and `a` products cost
/// a GEMM launch each for a few columns). Opt-in ([`set_gdn_projections`],
/// `FORKSCORE_GDN_PROJ=stacked`) until its speed and its GPU equivalence test are measured on a
/// GPU; the CPU equivalence test (`backends/tests/gdn_stacked.rs`) holds it to the four products.
pub(crate) fn gdn_projections(device: &Device) -> bool {
    match GDN_PROJECTIONS.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => stacks_on(device) && crate::switches::is("FORKSCORE_GDN_PROJ", "stacked"),
    }
}

/// Rotate the query and key heads of a stacked q|k|v product with the fused heads kernel
/// straight from their views of the product (`true`, the default), or through candle's copy and
/// rope (`false`; also `FORKSCORE_QKV_HEADS=candle`), for calls from then on. The fused kernel
/// is the one the Qwen3 / Qwen3.5 heads use; on Qwen2.5-1.5B in bf16 on an H100 it took one
/// decision from 17.2 to 15.9 ms (8 fields) and 23.2 to 21.5 ms (28 fields), the same
/// throughput under load, and the GPU tests hold it to the separate products.
pub fn set_qkv_heads(on: bool) {
    QKV_HEADS.store(on, Ordering::Relaxed);
}

/// Whether a stacked q|k|v product's heads take the fused kernel ([`set_qkv_heads`]).
pub(crate) fn qkv_heads() -> bool {
    QKV_HEADS.load(Ordering::Relaxed) && !crate::switches::is("FORKSCORE_QKV_HEADS", "candle")
}

/// The devices where stacking is measured to pay: CUDA and the CPU (Metal keeps the separate
/// products, unmeasured).
fn stacks_on(device: &Device) -> bool {
    device.is_cuda() || device.is_cpu()
}
