//! Qwen3 dense (`Qwen3ForCausalLM`): like Qwen2 but with no biases (unless `attention_bias`,
//! which then applies to q/k/v/o), a per-head plain RMSNorm on q and k before RoPE, and an
//! explicit `head_dim` (`heads * head_dim` may differ from `hidden`).

use super::self_attn::{NormConvention, SelfAttentionSpec};
use super::{dense_backbone, Backbone};
use crate::candle::load::config::ModelConfig;
use crate::candle::load::weights::Weights;
use crate::error::CandleError;

pub(crate) fn load(cfg: &ModelConfig, root: &Weights<'_>) -> Result<Backbone, CandleError> {
    let t = &cfg.text;
    let bias = t.attention_bias.unwrap_or(false);
    let spec = SelfAttentionSpec {
        hidden: t.hidden_size,
        heads: t.num_heads,
        kv_heads: t.num_kv_heads,
        head_dim: t.head_dim,
        qkv_bias: bias,
        o_bias: bias,
        qk_norm: Some(NormConvention::Plain),
        output_gate: false,
        eps: t.rms_norm_eps,
    };
    dense_backbone(cfg, root, spec)
}
