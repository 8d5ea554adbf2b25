//! The model configuration of a GGUF file, from its metadata.
//!
//! In: the parsed metadata and tensor infos. Out: the `config.json` object transformers would
//! read for the same model, validated by the one config parser ([`ModelConfig::from_json`]), so
//! a GGUF model passes exactly the checks and class defaults a Hugging Face folder does.
//!
//! Keys read under the `{arch}.` prefix of `general.architecture` (`qwen2`, `qwen3`):
//! `block_count`, `embedding_length`, `feed_forward_length`, `attention.head_count`,
//! `attention.head_count_kv` (default: `head_count`, as llama.cpp), `attention.key_length`
//! (Qwen3's `head_dim`; for Qwen2 it must equal `embedding_length / head_count`),
//! `attention.layer_norm_rms_epsilon`, `rope.freq_base` (default 10000, as llama.cpp and
//! transformers), `context_length`. The vocabulary size is the row count of
//! `token_embd.weight`; the head is tied exactly when `output.weight` is absent; Qwen3's
//! `attention_bias` is whether `blk.0.attn_q.bias` is stored. Rope scaling (`rope.scaling.type`
//! other than `none`) and partial rotary dimensions are refused: the backend implements plain
//! RoPE only.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::file::{MetaValue, TensorInfo};
use crate::candle::load::config::ModelConfig;
use crate::error::CandleError;

/// `general.architecture` values read, and the `config.json` class each stands for.
const ARCHITECTURES: &[(&str, &str)] =
    &[("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")];

/// The configuration of the model stored in a GGUF file at `path`.
pub fn model_config(
    path: &Path,
    metadata: &BTreeMap<String, MetaValue>,
    tensors: &BTreeMap<String, TensorInfo>,
) -> Result<ModelConfig, CandleError> {
    let invalid = |reason: String| CandleError::InvalidConfig {
        path: path.to_path_buf(),
        reason,
    };
    let arch = metadata
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .ok_or_else(|| invalid("GGUF metadata has no string `general.architecture`".into()))?;
    let class = ARCHITECTURES
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|&(_, c)| c)
        .ok_or_else(|| CandleError::UnsupportedArchitecture {
            name: format!("{arch} (GGUF general.architecture)"),
            supported: ARCHITECTURES
                .iter()
                .map(|(a, _)| *a)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| metadata.get(&key(k));
    let uint = |k: &str| -> Result<Option<u64>, CandleError> {
        match get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                invalid(format!(
                    "`{}` is a {}, not a non-negative integer",
                    key(k),
                    v.type_name()
                ))
            }),
        }
    };
    let required = |k: &str| -> Result<u64, CandleError> {
        uint(k)?.ok_or_else(|| invalid(format!("GGUF metadata has no `{}`", key(k))))
    };
    let float = |k: &str| -> Result<Option<f64>, CandleError> {
        match get(k) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                invalid(format!("`{}` is a {}, not a number", key(k), v.type_name()))
            }),
        }
    };
    let layers = required("block_count")?;
    let hidden = required("embedding_length")?;
    let heads = required("attention.head_count")?;
    let kv_heads = uint("attention.head_count_kv")?.unwrap_or(heads);
    let eps = float("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
        invalid(format!(
            "GGUF metadata has no `{}`",
            key("attention.layer_norm_rms_epsilon")
        ))
    })?;
    if let Some(kind) = get("rope.scaling.type") {
        if kind.as_str() != Some("none") {
            return Err(invalid(format!(
                "`{}` is {kind:?}: rope scaling is not supported (plain RoPE only)",
                key("rope.scaling.type")
            )));
        }
    }
    let embed = tensors
        .get("token_embd.weight")
        .ok_or_else(|| CandleError::MissingTensor {
            name: "token_embd.weight".into(),
            path: path.to_path_buf(),
        })?;
    let vocab = match embed.shape.as_slice() {
        [rows, _] => *rows,
        other => {
            return Err(invalid(format!(
                "token_embd.weight has shape {other:?}, not (vocabulary, hidden)"
            )))
        }
    };
    let mut text = Map::new();
    text.insert("architectures".into(), json!([class]));
    text.insert("model_type".into(), json!(arch));
    text.insert("num_hidden_layers".into(), json!(layers));
    text.insert("hidden_size".into(), json!(hidden));
    text.insert(
        "intermediate_size".into(),
        json!(required("feed_forward_length")?),
    );
    text.insert("num_attention_heads".into(), json!(heads));
    text.insert("num_key_value_heads".into(), json!(kv_heads));
    text.insert("rms_norm_eps".into(), json!(eps));
    text.insert("hidden_act".into(), json!("silu"));
    text.insert("vocab_size".into(), json!(vocab));
    text.insert(
        "rope_theta".into(),
        json!(float("rope.freq_base")?.unwrap_or(10_000.0)),
    );
    if let Some(ctx) = uint("context_length")? {
        text.insert("max_position_embeddings".into(), json!(ctx));
    }
    text.insert(
        "tie_word_embeddings".into(),
        json!(!tensors.contains_key("output.weight")),
    );
    let key_length = uint("attention.key_length")?;
    let derived = (heads > 0 && hidden % heads == 0).then(|| hidden / heads);
    match arch {
        "qwen3" => {
            let head_dim = key_length.or(derived).ok_or_else(|| {
                invalid(format!(
                    "no `{}` and embedding_length is not a multiple of head_count",
                    key("attention.key_length")
                ))
            })?;
            text.insert("head_dim".into(), json!(head_dim));
            text.insert(
                "attention_bias".into(),
                json!(tensors.contains_key("blk.0.attn_q.bias")),
            );
        }
        _ => {
            if key_length.is_some() && key_length != derived {
                return Err(invalid(format!(
                    "`{}` is {key_length:?}, but Qwen2 heads are embedding_length / head_count = {derived:?} wide",
                    key("attention.key_length")
                )));
            }
        }
    }
    let head_dim = text.get("head_dim").and_then(Value::as_u64).or(derived);
    for k in ["attention.value_length", "rope.dimension_count"] {
        if let (Some(v), Some(d)) = (uint(k)?, head_dim) {
            if v != d {
                return Err(invalid(format!(
                    "`{}` is {v}, not the head width {d}: unsupported (full RoPE and equal key / value widths only)",
                    key(k)
                )));
            }
        }
    }
    ModelConfig::from_json(path, &Value::Object(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::candle::load::gguf::file::TensorType;

    fn meta(pairs: &[(&str, MetaValue)]) -> BTreeMap<String, MetaValue> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn qwen2() -> BTreeMap<String, MetaValue> {
        meta(&[
            ("general.architecture", MetaValue::String("qwen2".into())),
            ("qwen2.block_count", MetaValue::U32(2)),
            ("qwen2.embedding_length", MetaValue::U32(32)),
            ("qwen2.feed_forward_length", MetaValue::U32(64)),
            ("qwen2.attention.head_count", MetaValue::U32(4)),
            ("qwen2.attention.head_count_kv", MetaValue::U32(2)),
            (
                "qwen2.attention.layer_norm_rms_epsilon",
                MetaValue::F32(1e-6),
            ),
            ("qwen2.rope.freq_base", MetaValue::F32(1e6)),
            ("qwen2.context_length", MetaValue::U32(4096)),
        ])
    }

    fn tensors() -> BTreeMap<String, TensorInfo> {
        let info = TensorInfo {
            shape: vec![100, 32],
            dtype: TensorType::from_id(0).unwrap(),
            start: 0,
            end: 0,
        };
        [("token_embd.weight".to_string(), info)].into()
    }

    #[test]
    fn qwen2_metadata_gives_the_config() {
        let c = model_config(Path::new("m.gguf"), &qwen2(), &tensors()).unwrap();
        assert_eq!(
            c.architecture,
            crate::candle::load::config::Architecture::Qwen2
        );
        let t = &c.text;
        assert_eq!(
            (
                t.num_layers,
                t.hidden_size,
                t.num_heads,
                t.num_kv_heads,
                t.head_dim
            ),
            (2, 32, 4, 2, 8)
        );
        assert_eq!((t.vocab_size, t.max_positions), (100, Some(4096)));
        assert_eq!(t.rope.theta, 1e6);
        assert_eq!(c.tie_word_embeddings, Some(true), "no output.weight: tied");
    }

    #[test]
    fn unusable_metadata_is_refused_by_name() {
        let cases: [(&str, Option<MetaValue>, &str); 6] = [
            (
                "general.architecture",
                Some(MetaValue::String("llama".into())),
                "llama",
            ),
            ("qwen2.block_count", None, "qwen2.block_count"),
            (
                "qwen2.embedding_length",
                Some(MetaValue::String("x".into())),
                "is a string",
            ),
            (
                "qwen2.rope.scaling.type",
                Some(MetaValue::String("yarn".into())),
                "rope scaling",
            ),
            (
                "qwen2.attention.key_length",
                Some(MetaValue::U32(16)),
                "key_length",
            ),
            (
                "qwen2.rope.dimension_count",
                Some(MetaValue::U32(4)),
                "full RoPE",
            ),
        ];
        for (key, value, says) in cases {
            let mut m = qwen2();
            match value {
                Some(v) => m.insert(key.to_string(), v),
                None => m.remove(key),
            };
            let e = model_config(Path::new("m.gguf"), &m, &tensors())
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{key}: {e}");
        }
        let e = model_config(Path::new("m.gguf"), &qwen2(), &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("token_embd.weight"), "{e}");
    }
}
