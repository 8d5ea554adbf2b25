//! Fused CUDA kernels of a Gated DeltaNet layer (`kernels/cuda/gdn_recurrent.cu`, and, for calls of 64
//! tokens or more of bf16 / f16 layers, the tensor-core chunked form `kernels/cuda/gdn_chunked.cu`:
//! see [`PrefillForm`]), for prefill and
//! scoring on NVIDIA GPUs: [`causal_conv_silu`] (the causal conv, SiLU and new conv state in one
//! pass) and [`gated_delta_rule`], the delta rule. The delta rule computes the same function as
//! [`super::recurrence`] token by token, but keeps the recurrent state in registers for the
//! whole call and fuses the q | k | v split, the L2 normalisation, the q scale, the key-head
//! sharing and the head-major transposes around it.
//!
//! Delta rule in: the conv output `qkv: (B, L, Cc)` f32 (`Cc = 2·Hk·dk + Hv·dv`), `beta, g: (B, L, Hv)` f32
//! (already 0 at right-padded positions), `state: (S, Hv, dk, dv)` f32 with, when `S ≠ B` or
//! rows share states, `slot_of_row: (B,)` u32 (row `b` continues state row `slot_of_row[b]`:
//! a scoring pass forked from one prefix reads the prefix state in place, no per-row copy).
//! Out: `o: (B, L, Hv, dv)` f32 (token-major, ready for the gated norm) and the final state.
//!
//! Supported: `dk ∈ {32, 64, 128, 256}`, any `dv`, `Hv` a multiple of `Hk`; [`supports`] says
//! whether a call can take this path. On a build without the `cuda` feature, or on another
//! device, [`supports`] is false and the candle path runs.

use candle_core::{Device, Result, Tensor};

use super::GdnDims;

/// Which kernel runs the delta rule of long calls (64 tokens or more) on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillForm {
    /// The default: [`PrefillForm::Chunked`] where the layer computes in bf16 / f16 (its TF32
    /// products are finer than the model's own rounding), [`PrefillForm::Recurrent`] for f32
    /// layers (exact to f32 summation order).
    Auto,
    /// Token by token (`gdn_recurrent.cu`): f32 throughout.
    Recurrent,
    /// Chunked WY form on the tensor cores (`gdn_chunked.cu`, TF32 products with f32
    /// accumulation, ~1e-3 relative to the f32 recurrence), whatever the layer's dtype.
    Chunked,
}

/// 0: the environment decides (`FORKSCORE_GDN_PREFILL=auto|recurrent|chunked`, default auto),
/// 1: recurrent, 2: chunked, 3: auto.
static PREFILL_FORM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Choose the form for the whole process (the GPU tests run each).
pub fn set_prefill_form(form: PrefillForm) {
    let v = match form {
        PrefillForm::Recurrent => 1,
        PrefillForm::Chunked => 2,
        PrefillForm::Auto => 3,
    };
    PREFILL_FORM.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The form in force.
pub fn prefill_form() -> PrefillForm {
    match PREFILL_FORM.load(std::sync::atomic::Ordering::Relaxed) {
        1 => PrefillForm::Recurrent,
        2 => PrefillForm::Chunked,
        3 => PrefillForm::Auto,
        _ => {
            static ENV: std::sync::OnceLock<PrefillForm> = std::sync::OnceLock::new();
            *ENV.get_or_init(|| {
                match crate::switches::value("FORKSCORE_GDN_PREFILL")
                    .map(str::to_ascii_lowercase)
                    .as_deref()
                {
                    Some("chunked") => PrefillForm::Chunked,
                    Some("recurrent") => PrefillForm::Recurrent,
                    _ => PrefillForm::Auto,
                }
            })
        }
    }
}

/// Whether a layer computing in `low_precision` (bf16 / f16) takes the chunked form for long
/// calls under the form in force.
#[cfg(feature = "cuda")]
fn chunked_wanted(low_precision: bool) -> bool {
    match prefill_form() {
        PrefillForm::Chunked => true,
        PrefillForm::Recurrent => false,
        PrefillForm::Auto => low_precision,
    }
}

/// Whether the fused kernel can run this layer on this device.
pub fn supports(dims: &GdnDims, device: &Device) -> bool {
    cfg!(feature = "cuda")
        && device.is_cuda()
        && matches!(dims.key_dim, 32 | 64 | 128 | 256)
        && dims.key_heads > 0
        && dims.value_heads.is_multiple_of(dims.key_heads)
}

/// Run the delta rule over `qkv` from `state`. See the module docs for shapes.
/// `low_precision`: the layer computes in bf16 / f16, so long calls may take the TF32 chunked
/// form ([`PrefillForm::Auto`]). `keep_state` false: nobody reads the new state (a scoring
/// pass), so the kernels skip writing it and the returned state is `(B, Hv, 0, dv)`.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    qkv: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    slot_of_row: Option<&Tensor>,
    dims: &GdnDims,
    low_precision: bool,
    keep_state: bool,
) -> Result<(Tensor, Tensor)> {
    cuda::run(
        qkv,
        beta,
        g,
        state,
        slot_of_row,
        dims,
        chunked_wanted(low_precision),
        keep_state,
    )
}

/// Causal depthwise conv + SiLU with its new conv state, in one kernel: the same function as
/// [`super::conv::causal_conv_silu`] (`p: (B, L, Cc)` f32 or bf16 — bf16 is upcast exactly in
/// the kernel, so no cast pass runs —, `state: (S, Kc−1, Cc)` with `slot_of_row` as for the
/// delta rule (`S == B` without it), `weight: (Cc, Kc)` f32; `lengths`: each row's real tokens
/// when right-padded). Outputs at padded positions are unspecified, as there.
/// `packed`: `p` is `(1, T, Cc)` holding the rows back to back, `(row starts, L)` — each row's
/// tokens are read in place and positions past its length as zeros, bit-identical to the call on
/// the right-padded copy (only where [`conv_reads_packed`] holds).
#[cfg(feature = "cuda")]
pub fn causal_conv_silu(
    p: &Tensor,
    state: &Tensor,
    slot_of_row: Option<&Tensor>,
    weight: &Tensor,
    lengths: Option<&[usize]>,
    packed: Option<(&[usize], usize)>,
) -> Result<(Tensor, Tensor)> {
    cuda_conv::conv(p, state, slot_of_row, weight, lengths, packed)
}

/// Whether [`causal_conv_silu`] can read a packed `p (1, T, Cc)` of `rows` rows of at most
/// `lmax` tokens in place.
#[cfg(feature = "cuda")]
pub fn conv_reads_packed(p: &Tensor, weight: &Tensor, rows: usize, lmax: usize) -> bool {
    cuda_conv::reads_packed(p, weight, rows, lmax)
}

/// Without the `cuda` feature there is no fused kernel.
#[cfg(not(feature = "cuda"))]
pub fn conv_reads_packed(_p: &Tensor, _weight: &Tensor, _rows: usize, _lmax: usize) -> bool {
    false
}

/// Without the `cuda` feature there is no fused kernel ([`supports`] is false).
#[cfg(not(feature = "cuda"))]
pub fn causal_conv_silu(
    _p: &Tensor,
    _state: &Tensor,
    _slot_of_row: Option<&Tensor>,
    _weight: &Tensor,
    _lengths: Option<&[usize]>,
    _packed: Option<(&[usize], usize)>,
) -> Result<(Tensor, Tensor)> {
    candle_core::bail!("the fused Gated DeltaNet kernels need the `cuda` feature")
}

/// Without the `cuda` feature there is no fused kernel ([`supports`] is false).
#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    _qkv: &Tensor,
    _beta: &Tensor,
    _g: &Tensor,
    _state: &Tensor,
    _slot_of_row: Option<&Tensor>,
    _dims: &GdnDims,
    _low_precision: bool,
    _keep_state: bool,
) -> Result<(Tensor, Tensor)> {
    candle_core::bail!("the fused Gated DeltaNet kernel needs the `cuda` feature")
}

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_conv;
