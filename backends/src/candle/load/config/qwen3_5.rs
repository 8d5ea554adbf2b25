//! Qwen3.5 additions to `config.json` parsing (the `linear_*` keys, layer types, partial rotary).
//!
//! In: the architecture, the text-config object (`text_config` for
//! `Qwen3_5ForConditionalGeneration`, the root for `Qwen3_5ForCausalLM` / `qwen3_5_text`) and the
//! generic [`TextConfig`] already parsed from it. Out: the Gated DeltaNet dimensions
//! ([`LinearAttentionConfig`]) and two Qwen3.5 defaults applied to the text config:
//! `partial_rotary_factor` 0.25 when neither `rope_parameters` nor the text level carries one
//! (HF's default), and, without `layer_types`, layer `i` is full attention iff
//! `(i + 1) % full_attention_interval == 0` with the interval defaulting to 4.
//! Missing `linear_*` keys take transformers' class defaults (16 / 32 key / value heads, head dims
//! 128, kernel 4); every one of them is shape-checked against the stored tensors at load.
//! Other architectures pass through untouched (`None`).

use serde::Deserialize;
use serde_json::Value;

use super::{Architecture, LayerKind, TextConfig};
use crate::error::CandleError;

/// HF's default `partial_rotary_factor` for Qwen3.5.
pub const DEFAULT_PARTIAL_ROTARY_FACTOR: f64 = 0.25;
/// HF's default `full_attention_interval` for Qwen3.5.
pub const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// Gated DeltaNet (linear attention) dimensions of a Qwen3.5 text config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearAttentionConfig {
    /// `linear_num_key_heads` (`Hk`).
    pub num_key_heads: usize,
    /// `linear_num_value_heads` (`Hv`, a multiple of `Hk`).
    pub num_value_heads: usize,
    /// `linear_key_head_dim` (`dk`).
    pub key_head_dim: usize,
    /// `linear_value_head_dim` (`dv`).
    pub value_head_dim: usize,
    /// `linear_conv_kernel_dim` (`Kc`).
    pub conv_kernel_dim: usize,
}

/// Missing `linear_*` keys take transformers' `Qwen3_5TextConfig` defaults (5.24).
#[derive(Deserialize)]
struct RawLinear {
    #[serde(default = "default_key_heads")]
    linear_num_key_heads: usize,
    #[serde(default = "default_value_heads")]
    linear_num_value_heads: usize,
    #[serde(default = "default_head_dim")]
    linear_key_head_dim: usize,
    #[serde(default = "default_head_dim")]
    linear_value_head_dim: usize,
    #[serde(default = "default_conv_kernel")]
    linear_conv_kernel_dim: usize,
}

fn default_key_heads() -> usize {
    16
}
fn default_value_heads() -> usize {
    32
}
fn default_head_dim() -> usize {
    128
}
fn default_conv_kernel() -> usize {
    4
}

fn has_partial_factor(text: &Value) -> bool {
    text.get("partial_rotary_factor").is_some()
        || text
            .get("rope_parameters")
            .and_then(|r| r.get("partial_rotary_factor"))
            .is_some()
}

/// Apply the Qwen3.5 defaults to `text` and parse the linear-attention dimensions.
pub(crate) fn extend(
    architecture: Architecture,
    text_json: &Value,
    text: &mut TextConfig,
    invalid: &dyn Fn(String) -> CandleError,
) -> Result<Option<LinearAttentionConfig>, CandleError> {
    if architecture != Architecture::Qwen3_5 {
        return Ok(None);
    }
    if !has_partial_factor(text_json) {
        text.rope.partial_rotary_factor = DEFAULT_PARTIAL_ROTARY_FACTOR;
    }
    let explicit_kinds = text_json.get("layer_types").is_some()
        || text_json.get("full_attention_interval").is_some();
    if !explicit_kinds {
        text.layer_kinds = (0..text.num_layers)
            .map(|i| {
                if (i + 1) % DEFAULT_FULL_ATTENTION_INTERVAL == 0 {
                    LayerKind::FullAttention
                } else {
                    LayerKind::LinearAttention
                }
            })
            .collect();
    }
    if !text.layer_kinds.contains(&LayerKind::LinearAttention) {
        return Ok(None);
    }
    let raw: RawLinear = serde_json::from_value(text_json.clone())
        .map_err(|e| invalid(format!("linear-attention fields: {e}")))?;
    let cfg = LinearAttentionConfig {
        num_key_heads: raw.linear_num_key_heads,
        num_value_heads: raw.linear_num_value_heads,
        key_head_dim: raw.linear_key_head_dim,
        value_head_dim: raw.linear_value_head_dim,
        conv_kernel_dim: raw.linear_conv_kernel_dim,
    };
    let dims = [
        cfg.num_key_heads,
        cfg.num_value_heads,
        cfg.key_head_dim,
        cfg.value_head_dim,
        cfg.conv_kernel_dim,
    ];
    if dims.contains(&0) || !cfg.num_value_heads.is_multiple_of(cfg.num_key_heads) {
        return Err(invalid(format!(
            "linear-attention dimensions must be positive with linear_num_value_heads a multiple \
             of linear_num_key_heads: {cfg:?}"
        )));
    }
    Ok(Some(cfg))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::candle::load::config::ModelConfig;

    fn text() -> Value {
        json!({
            "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "intermediate_size": 96, "vocab_size": 1000, "rms_norm_eps": 1e-6,
            "hidden_act": "silu", "attention_bias": false, "attn_output_gate": true,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
            "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": true}
        })
    }

    #[test]
    fn multimodal_layout_reads_text_config() -> Result<(), CandleError> {
        let root = json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": true, "image_token_id": 248056, "vision_config": {"depth": 2},
            "text_config": text()
        });
        let c = ModelConfig::from_json(Path::new("c"), &root)?;
        assert_eq!(c.architecture, Architecture::Qwen3_5);
        assert_eq!(c.text.rotary_dim(), 16);
        assert_eq!(c.text.rope.theta, 1e7);
        assert_eq!(c.text.layer_kinds[3], LayerKind::FullAttention);
        assert_eq!(c.tie_word_embeddings, Some(true));
        let la = c
            .linear_attention
            .ok_or_else(|| invalid_err("no linear config"))?;
        assert_eq!(
            (
                la.num_key_heads,
                la.num_value_heads,
                la.key_head_dim,
                la.value_head_dim
            ),
            (2, 4, 16, 8)
        );
        Ok(())
    }

    #[test]
    fn missing_keys_take_qwen3_5_class_defaults() -> Result<(), CandleError> {
        let mut t = text();
        t["architectures"] = json!(["Qwen3_5ForCausalLM"]);
        let o = t.as_object_mut().ok_or_else(|| invalid_err("object"))?;
        for k in [
            "head_dim",
            "num_key_value_heads",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ] {
            o.remove(k);
        }
        let c = ModelConfig::from_json(Path::new("c"), &t)?;
        assert_eq!((c.text.head_dim, c.text.num_kv_heads), (256, 4));
        assert_eq!(
            c.linear_attention,
            Some(LinearAttentionConfig {
                num_key_heads: 16,
                num_value_heads: 32,
                key_head_dim: 128,
                value_head_dim: 128,
                conv_kernel_dim: 4,
            })
        );
        Ok(())
    }

    fn invalid_err(s: &str) -> CandleError {
        CandleError::InvalidRequest { reason: s.into() }
    }

    #[test]
    fn text_only_layout_and_defaults() -> Result<(), CandleError> {
        let mut t = text();
        t["architectures"] = json!(["Qwen3_5ForCausalLM"]);
        let o = t.as_object_mut().ok_or_else(|| invalid_err("object"))?;
        o.remove("layer_types");
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 1e7}),
        );
        let c = ModelConfig::from_json(Path::new("c"), &t)?;
        // partial_rotary_factor defaults to 0.25 (head_dim 32 -> 8 rotary dims)
        assert_eq!(c.text.rotary_dim(), 8);
        use LayerKind::*;
        assert_eq!(
            c.text.layer_kinds,
            vec![
                LinearAttention,
                LinearAttention,
                LinearAttention,
                FullAttention
            ]
        );
        Ok(())
    }
}
