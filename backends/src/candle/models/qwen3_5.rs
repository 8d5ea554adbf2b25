//! Qwen3.5 text backbone: Gated DeltaNet layers ([`LinearAttention`]) and
//! gated full-attention layers, in the order of `layer_types`.
//!
//! In: the parsed [`ModelConfig`] and the checkpoint rooted at its top level. The text model is
//! found under `model.language_model.` (multimodal `Qwen3_5ForConditionalGeneration`) or
//! `model.` (text-only), whichever holds `embed_tokens.weight`;
//! nothing under `model.visual.` or `mtp.` is ever requested. Out: a [`Backbone`].
//!
//! Conventions kept: layer / final / q / k norms use `1 + w` (offset); the GDN output norm uses
//! plain `w`; `q_proj` emits per head `[query (hd) | gate (hd)]`; q/k norm before partial RoPE on
//! the first `R = hd · partial_rotary_factor` dims; `σ(gate)` multiplies the attention output
//! before `o_proj`; no biases unless `attention_bias`. GDN parameters `A_log`, `dt_bias`,
//! `conv1d` and `norm` are read in f32 whatever the compute dtype.
//!
//! State: a GDN layer continues from `LayerPast::Linear` (one shared prefix state read by every
//! row, or the states of several slots with each row's slot after a slot merge) and returns its new conv +
//! recurrent state as the update; right-padded rows of a scoring call leave it exactly where
//! their last real token put it (β = 0, g = 0, per-row conv gather, see `gated_deltanet`).

use candle_core::{Device, Tensor};

use super::self_attn::{NormConvention, SelfAttention, SelfAttentionSpec};
use super::{output_head, Backbone, DecoderLayer, Mixer};
use crate::candle::gated_deltanet::{GdnDims, GdnLayer, GdnState, GdnWeights, RightPadding};
use crate::candle::layers::linear::QuantSummary;
use crate::candle::layers::mlp::Mlp;
use crate::candle::layers::norm::RmsNorm;
use crate::candle::layers::rope::Rope;
use crate::candle::load::config::{LayerKind, LinearAttentionConfig, ModelConfig};
use crate::candle::load::weights::Weights;
use crate::candle::state::{LayerPast, LayerUpdate, StateRows};
use crate::candle::step::Step;
use crate::error::CandleError;

/// Where the text model may live, in the order tried. mlx-style conversions
/// (`language_model.model.*`) are deliberately not accepted: they also store the conv weight as
/// `[Cc, Kc, 1]` and the offset norms already shifted by `+1`, so reading them as HF tensors
/// would silently double-shift the norms.
pub(crate) const TEXT_PREFIXES: [&str; 2] = ["model.language_model.", "model."];

/// The first of [`TEXT_PREFIXES`] under which `embed_tokens.weight` is stored.
fn text_prefix(root: &Weights<'_>, cfg: &ModelConfig) -> Result<&'static str, CandleError> {
    TEXT_PREFIXES
        .iter()
        .copied()
        .find(|p| root.contains(&format!("{p}embed_tokens.weight")))
        .ok_or_else(|| CandleError::MissingTensor {
            name: format!("embed_tokens.weight (under any of {TEXT_PREFIXES:?})"),
            path: cfg
                .path
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_default(),
        })
}

/// A Gated DeltaNet layer as a decoder-layer mixer.
pub(crate) struct LinearAttention {
    layer: GdnLayer,
}

impl LinearAttention {
    /// Load `prefix.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias,
    /// norm, out_proj}`.
    fn load(w: &Weights<'_>, prefix: &str, dims: GdnDims) -> Result<Self, CandleError> {
        let (d, cc, cv, hv) = (
            dims.hidden,
            dims.conv_channels(),
            dims.value_channels(),
            dims.value_heads,
        );
        let name = |n: &str| format!("{prefix}.{n}");
        // projections: in the compute dtype on the device, or f32 on the host to be quantized
        let proj = |n: &str, shape: &[usize]| match w.quantization() {
            None => w.get(&name(n), shape),
            Some(_) => w.host_f32(&name(n), shape),
        };
        let weights = GdnWeights {
            in_proj_qkv: proj("in_proj_qkv.weight", &[cc, d])?,
            in_proj_z: proj("in_proj_z.weight", &[cv, d])?,
            in_proj_b: proj("in_proj_b.weight", &[hv, d])?,
            in_proj_a: proj("in_proj_a.weight", &[hv, d])?,
            conv1d: w.get_f32(&name("conv1d.weight"), &[cc, 1, dims.conv_kernel])?,
            a_log: w.get_f32(&name("A_log"), &[hv])?,
            dt_bias: w.get_f32(&name("dt_bias"), &[hv])?,
            norm: w.get_f32(&name("norm.weight"), &[dims.value_dim])?,
            out_proj: proj("out_proj.weight", &[d, cv])?,
        };
        let layer = match w.quantization() {
            None => GdnLayer::new(dims, weights, w.dtype())?,
            Some(q) => GdnLayer::new_quantized(dims, weights, w.dtype(), q, w.device())?,
        };
        Ok(LinearAttention { layer })
    }

    /// The state the `rows` of this call start from: zeros, or retained states with the state
    /// row each call row continues (`None`: row b continues row b). A shared prefix state is
    /// not copied per row: every row reads its one row through the map.
    fn start_state(
        &self,
        past: &LayerPast,
        rows: usize,
        device: &Device,
    ) -> Result<(GdnState, Option<Vec<u32>>), CandleError> {
        let op = CandleError::tensor("gdn start state");
        match past {
            LayerPast::Empty => Ok((
                GdnState::zeros(self.layer.dims(), rows, device).map_err(op)?,
                None,
            )),
            LayerPast::Linear {
                conv,
                recurrent,
                rows: which,
            } => {
                let state = GdnState {
                    conv: conv.clone(),
                    recurrent: recurrent.clone(),
                };
                let slots = match which {
                    StateRows::Shared if rows == state.batch() => None,
                    // (1, ...) read by every row
                    StateRows::Shared => Some(vec![0u32; rows]),
                    StateRows::Slots(slots) => Some(slots.clone()),
                };
                Ok((state, slots))
            }
            LayerPast::Attention { .. } | LayerPast::AttentionSlots(_) => {
                Err(CandleError::InvalidRequest {
                    reason: "linear-attention layer given an attention K/V state".into(),
                })
            }
        }
    }
}

impl Mixer for LinearAttention {
    fn kind(&self) -> LayerKind {
        LayerKind::LinearAttention
    }

    fn summarize(&self, summary: &mut QuantSummary) {
        self.layer.summarize(summary);
    }

    fn forward(
        &self,
        x: &Tensor,
        past: &LayerPast,
        step: &Step,
    ) -> Result<(Tensor, LayerUpdate), CandleError> {
        if let Some(packing) = &step.packed {
            // independent prefixes back to back: each segment's conv and scan from zero state
            if !matches!(past, LayerPast::Empty) {
                return Err(CandleError::InvalidRequest {
                    reason: "a packed prefill starts from no retained state".into(),
                });
            }
            let segments: Vec<(usize, usize)> =
                packing.segments.iter().map(|s| (s.start, s.len)).collect();
            let (y, next) = self.layer.forward_packed(x, &segments)?;
            return Ok((
                y,
                LayerUpdate::Linear {
                    conv: next.conv,
                    recurrent: next.recurrent,
                },
            ));
        }
        let (state, slots) = self.start_state(past, step.rows, x.device())?;
        let padding = if step.valid.iter().any(|&v| v < step.len) {
            let pad = RightPadding::new(step.valid.clone(), step.len).ok_or_else(|| {
                CandleError::InvalidRequest {
                    reason: "a row has more valid tokens than the call".into(),
                }
            })?;
            Some(pad)
        } else {
            None
        };
        let (y, next) = match (&slots, step.keeps_state) {
            // a scoring pass: nobody reads the new state, the fused kernels skip it
            (slots, false) => {
                self.layer
                    .forward_discarding(x, &state, slots.as_deref(), padding.as_ref())?
            }
            (Some(slots), true) => {
                self.layer
                    .forward_from_slots(x, &state, slots, padding.as_ref())?
            }
            (None, true) => self.layer.forward(x, &state, padding.as_ref())?,
        };
        Ok((
            y,
            LayerUpdate::Linear {
                conv: next.conv,
                recurrent: next.recurrent,
            },
        ))
    }
}

fn gdn_dims(cfg: &ModelConfig, la: &LinearAttentionConfig) -> GdnDims {
    GdnDims {
        hidden: cfg.text.hidden_size,
        key_heads: la.num_key_heads,
        value_heads: la.num_value_heads,
        key_dim: la.key_head_dim,
        value_dim: la.value_head_dim,
        conv_kernel: la.conv_kernel_dim,
        rms_norm_eps: cfg.text.rms_norm_eps,
    }
}

pub(crate) fn load(cfg: &ModelConfig, root: &Weights<'_>) -> Result<Backbone, CandleError> {
    let t = &cfg.text;
    let w = root.with_prefix(text_prefix(root, cfg)?);
    let bias = t.attention_bias.unwrap_or(false);
    let spec = SelfAttentionSpec {
        hidden: t.hidden_size,
        heads: t.num_heads,
        kv_heads: t.num_kv_heads,
        head_dim: t.head_dim,
        qkv_bias: bias,
        o_bias: bias,
        qk_norm: Some(NormConvention::Offset),
        output_gate: true,
        eps: t.rms_norm_eps,
    };
    let gdn = cfg.linear_attention.as_ref().map(|la| gdn_dims(cfg, la));
    let eps = t.rms_norm_eps;
    let mut layers = Vec::with_capacity(t.num_layers);
    for (i, kind) in t.layer_kinds.iter().enumerate() {
        let p = format!("layers.{i}");
        let mixer: Box<dyn Mixer> = match (kind, gdn) {
            (LayerKind::FullAttention, _) => {
                Box::new(SelfAttention::load(&w, &format!("{p}.self_attn"), spec)?)
            }
            (LayerKind::LinearAttention, Some(dims)) => Box::new(LinearAttention::load(
                &w,
                &format!("{p}.linear_attn"),
                dims,
            )?),
            (LayerKind::LinearAttention, None) => {
                return Err(CandleError::InvalidConfig {
                    path: cfg.path.clone(),
                    reason: format!(
                        "layer {i} is linear attention but the config has no linear_* fields"
                    ),
                })
            }
        };
        layers.push(DecoderLayer {
            input_norm: RmsNorm::offset(
                &w,
                &format!("{p}.input_layernorm.weight"),
                t.hidden_size,
                eps,
            )?,
            mixer,
            post_norm: RmsNorm::offset(
                &w,
                &format!("{p}.post_attention_layernorm.weight"),
                t.hidden_size,
                eps,
            )?,
            mlp: Mlp::load(&w, &format!("{p}.mlp"), t.hidden_size, t.intermediate_size)?,
        });
    }
    let embed = w.table("embed_tokens.weight", &[t.vocab_size, t.hidden_size])?;
    Ok(Backbone {
        head: output_head(cfg, root, &embed, &w.full_name("embed_tokens.weight"))?,
        embed,
        layers,
        final_norm: RmsNorm::offset(&w, "norm.weight", t.hidden_size, eps)?,
        rope: Rope::new(t.rope.theta, t.rotary_dim()),
        dtype: w.dtype(),
        device: w.device().clone(),
    })
}
