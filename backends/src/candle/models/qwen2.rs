//! Qwen2 / Qwen2.5 dense (`Qwen2ForCausalLM`): pre-norm decoder, GQA attention with q/k/v
//! biases (no o bias, no q/k norm), full rotate-half RoPE, plain RMSNorm, SwiGLU MLP,
//! `head_dim = hidden / heads` unless given. Weights under `model.`; `lm_head.weight` at the
//! root unless tied.

use super::self_attn::SelfAttentionSpec;
use super::{dense_backbone, Backbone};
use crate::candle::load::config::ModelConfig;
use crate::candle::load::weights::Weights;
use crate::error::CandleError;

pub(crate) fn load(cfg: &ModelConfig, root: &Weights<'_>) -> Result<Backbone, CandleError> {
    let t = &cfg.text;
    let spec = SelfAttentionSpec {
        hidden: t.hidden_size,
        heads: t.num_heads,
        kv_heads: t.num_kv_heads,
        head_dim: t.head_dim,
        qkv_bias: true,
        o_bias: false,
        qk_norm: None,
        output_gate: false,
        eps: t.rms_norm_eps,
    };
    dense_backbone(cfg, root, spec)
}
