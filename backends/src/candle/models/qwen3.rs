//! Qwen3 dense (`Qwen3ForCausalLM`): like Qwen2 but with no biases (unless `attention_bias`,
//! which then applies to q/k/v/o), a per-head plain RMSNorm on q and k before RoPE, and an
//! explicit `head_dim` (`heads * head_dim` may differ from `hidden`).

use super::self_attn::{NormConvention, SelfAttention, SelfAttentionSpec};
use super::{output_head, require_full_attention, Backbone, DecoderLayer};
use crate::candle::config::ModelConfig;
use crate::candle::mlp::Mlp;
use crate::candle::norm::RmsNorm;
use crate::candle::rope::Rope;
use crate::candle::weights::Weights;
use crate::BackendError;

pub(crate) fn load(cfg: &ModelConfig, root: &Weights<'_>) -> Result<Backbone, BackendError> {
    require_full_attention(cfg)?;
    let t = &cfg.text;
    let w = root.with_prefix("model.");
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
    let mut layers = Vec::with_capacity(t.num_layers);
    for i in 0..t.num_layers {
        let p = format!("layers.{i}");
        layers.push(DecoderLayer {
            input_norm: RmsNorm::plain(&w, &format!("{p}.input_layernorm.weight"), t.hidden_size, t.rms_norm_eps)?,
            mixer: Box::new(SelfAttention::load(&w, &format!("{p}.self_attn"), spec)?),
            post_norm: RmsNorm::plain(&w, &format!("{p}.post_attention_layernorm.weight"), t.hidden_size, t.rms_norm_eps)?,
            mlp: Mlp::load(&w, &format!("{p}.mlp"), t.hidden_size, t.intermediate_size)?,
        });
    }
    let embed = w.get("embed_tokens.weight", &[t.vocab_size, t.hidden_size])?;
    Ok(Backbone {
        head: output_head(cfg, root, &embed)?,
        embed,
        layers,
        final_norm: RmsNorm::plain(&w, "norm.weight", t.hidden_size, t.rms_norm_eps)?,
        rope: Rope::new(t.rope.theta, t.rotary_dim()),
        dtype: w.dtype(),
        device: w.device().clone(),
    })
}
