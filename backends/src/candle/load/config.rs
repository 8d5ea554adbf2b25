//! `config.json`, parsed once into typed, validated structs.
//!
//! In: the path of a Hugging Face `config.json`. Out: [`ModelConfig`] — the architecture (from
//! `architectures[0]`, else `model_type`; unknown names are rejected by name) and the text
//! backbone's [`TextConfig`].
//!
//! Both config generations are read: transformers 5 (`rope_parameters { rope_theta, .. }`,
//! `dtype`) and older files (top-level `rope_theta`, `torch_dtype`). Multimodal checkpoints keep
//! the text fields under `text_config`; [`text_root`] picks that object when present, so an
//! architecture whose text model is nested (Qwen3.5) reuses the same parser. Fields only some
//! architectures use are parsed here too (as options) and checked by the architecture's loader.
//! A key transformers' config class has a default for may be missing; it then takes that default
//! ([`Architecture::class_defaults`]), never a value of our own choosing.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::CandleError;

pub mod qwen3_5;

pub use qwen3_5::LinearAttentionConfig;

/// A model architecture this backend implements. Adding one: a variant here, its names in
/// [`Architecture::hf_names`], and a loader in `models/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Qwen2 / Qwen2.5 dense (`Qwen2ForCausalLM`, `model_type: qwen2`).
    Qwen2,
    /// Qwen3 dense (`Qwen3ForCausalLM`, `model_type: qwen3`).
    Qwen3,
    /// Qwen3.5 hybrid text backbone (Gated DeltaNet + gated attention), multimodal
    /// (`Qwen3_5ForConditionalGeneration`, text under `text_config`) or text-only.
    Qwen3_5,
}

impl Architecture {
    pub const ALL: &'static [Architecture] = &[
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3_5,
    ];

    /// `(architectures[0] names, model_type names)` that select this architecture.
    pub fn hf_names(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Architecture::Qwen2 => (&["Qwen2ForCausalLM"], &["qwen2"]),
            Architecture::Qwen3 => (&["Qwen3ForCausalLM"], &["qwen3"]),
            Architecture::Qwen3_5 => (
                &["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"],
                &["qwen3_5", "qwen3_5_text"],
            ),
        }
    }

    /// The family reported in [`forkscore_seam::ModelFacts::family`].
    pub fn family(self) -> forkscore_seam::Family {
        match self {
            Architecture::Qwen2 => forkscore_seam::Family::Qwen2,
            Architecture::Qwen3 => forkscore_seam::Family::Qwen3,
            Architecture::Qwen3_5 => forkscore_seam::Family::Qwen3_5,
        }
    }

    /// The model class reported when `config.json` names none of its own.
    pub fn model_class(self) -> forkscore_seam::Architecture {
        match self {
            Architecture::Qwen2 => forkscore_seam::Architecture::Qwen2ForCausalLM,
            Architecture::Qwen3 => forkscore_seam::Architecture::Qwen3ForCausalLM,
            Architecture::Qwen3_5 => forkscore_seam::Architecture::Qwen3_5ForConditionalGeneration,
        }
    }

    /// transformers' class defaults (5.24) for the keys this parser lets a `config.json` omit:
    /// a missing key means what `from_pretrained` would use, so a hand-trimmed config loads the
    /// same model in both (`save_pretrained` always writes these keys).
    pub fn class_defaults(self) -> ClassDefaults {
        match self {
            Architecture::Qwen2 => ClassDefaults {
                head_dim: None,
                num_key_value_heads: 32,
                rms_norm_eps: 1e-6,
            },
            Architecture::Qwen3 => ClassDefaults {
                head_dim: Some(128),
                num_key_value_heads: 32,
                rms_norm_eps: 1e-6,
            },
            Architecture::Qwen3_5 => ClassDefaults {
                head_dim: Some(256),
                num_key_value_heads: 4,
                rms_norm_eps: 1e-6,
            },
        }
    }

    fn supported_list() -> String {
        Self::ALL
            .iter()
            .flat_map(|a| a.hf_names().0.iter().copied())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn from_names(arch: Option<&str>, model_type: Option<&str>) -> Result<Self, CandleError> {
        let unsupported = |name: &str| CandleError::UnsupportedArchitecture {
            name: name.to_string(),
            supported: Self::supported_list(),
        };
        if let Some(name) = arch {
            return Self::ALL
                .iter()
                .copied()
                .find(|a| a.hf_names().0.contains(&name))
                .ok_or_else(|| unsupported(name));
        }
        if let Some(mt) = model_type {
            return Self::ALL
                .iter()
                .copied()
                .find(|a| a.hf_names().1.contains(&mt))
                .ok_or_else(|| unsupported(mt));
        }
        Err(unsupported(
            "<none: config.json has neither architectures nor model_type>",
        ))
    }
}

/// Values transformers' config class gives keys missing from `config.json`
/// ([`Architecture::class_defaults`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassDefaults {
    /// `head_dim`; `None`: `hidden_size / num_attention_heads` (Qwen2 has no `head_dim` key).
    pub head_dim: Option<usize>,
    pub num_key_value_heads: usize,
    pub rms_norm_eps: f64,
}

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Softmax attention over a K/V cache (`full_attention`).
    FullAttention,
    /// Linear attention with a conv + recurrent state (`linear_attention`, Gated DeltaNet).
    LinearAttention,
}

/// Rotary position embedding parameters (plain `default` RoPE only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    /// Fraction of each head's dims that rotate (1.0 for Qwen2/Qwen3).
    pub partial_rotary_factor: f64,
}

/// The text backbone's hyper-parameters, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// Explicit `head_dim` when given (Qwen3, Qwen3.5), else `hidden_size / num_heads`.
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// Embedding / output-head rows.
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope: RopeConfig,
    /// `attention_bias` when present in the file.
    pub attention_bias: Option<bool>,
    /// One entry per layer; from `layer_types` when present, else all full attention.
    pub layer_kinds: Vec<LayerKind>,
    pub tie_word_embeddings: Option<bool>,
    /// `max_position_embeddings` when present: the longest sequence the model was built for.
    pub max_positions: Option<usize>,
}

impl TextConfig {
    /// Number of rotating dims per head: `head_dim * partial_rotary_factor`, rounded down to even.
    pub fn rotary_dim(&self) -> usize {
        let r = (self.head_dim as f64 * self.rope.partial_rotary_factor) as usize;
        r - r % 2
    }
}

/// A parsed `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub path: PathBuf,
    pub architecture: Architecture,
    /// The name as written in the file (`architectures[0]`, else `model_type`).
    pub architecture_name: String,
    pub text: TextConfig,
    /// `tie_word_embeddings` (root level, else text level) when present.
    pub tie_word_embeddings: Option<bool>,
    /// `dtype` (transformers 5) or `torch_dtype` (older) when present.
    pub stored_dtype: Option<String>,
    /// Gated DeltaNet dimensions (`linear_*` fields); `Some` for Qwen3.5 with linear layers.
    pub linear_attention: Option<LinearAttentionConfig>,
}

/// The object holding the text model's fields: `text_config` when present, else the root.
pub fn text_root(root: &Value) -> &Value {
    match root.get("text_config") {
        Some(v) if v.is_object() => v,
        _ => root,
    }
}

#[derive(Deserialize)]
struct RawRope {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    partial_rotary_factor: Option<f64>,
}

#[derive(Deserialize)]
struct RawText {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RawRope>,
    rope_scaling: Option<RawRope>,
    partial_rotary_factor: Option<f64>,
    attention_bias: Option<bool>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    use_sliding_window: Option<bool>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
}

impl ModelConfig {
    /// Read and validate `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, CandleError> {
        let bytes = super::limits::read_regular(path, super::limits::MAX_CONFIG_BYTES)?
            .ok_or_else(|| CandleError::MissingFile {
                path: path.to_path_buf(),
                reason: "the checkpoint has no config.json".into(),
            })?;
        let root: Value =
            serde_json::from_slice(&bytes).map_err(|e| CandleError::InvalidConfig {
                path: path.to_path_buf(),
                reason: format!("not valid JSON: {e}"),
            })?;
        Self::from_json(path, &root)
    }

    /// Validate an already-read `config.json` value (`path` is only used in messages).
    pub fn from_json(path: &Path, root: &Value) -> Result<Self, CandleError> {
        let invalid = |reason: String| CandleError::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let arch_name = root
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str);
        let model_type = root.get("model_type").and_then(Value::as_str);
        let architecture = Architecture::from_names(arch_name, model_type)?;
        let architecture_name = arch_name.or(model_type).unwrap_or_default().to_string();

        super::limits::check_config_sizes(text_root(root), &invalid)?;
        let raw: RawText = serde_json::from_value(text_root(root).clone())
            .map_err(|e| invalid(format!("text fields: {e}")))?;
        let mut text = validate_text(raw, architecture.class_defaults(), &invalid)?;
        let linear_attention = qwen3_5::extend(architecture, text_root(root), &mut text, &invalid)?;
        let tie_word_embeddings = root
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .or(text.tie_word_embeddings);
        let stored_dtype = ["dtype", "torch_dtype"]
            .iter()
            .find_map(|k| root.get(*k).and_then(Value::as_str))
            .map(str::to_string);
        Ok(ModelConfig {
            path: path.to_path_buf(),
            architecture,
            architecture_name,
            text,
            tie_word_embeddings,
            stored_dtype,
            linear_attention,
        })
    }
}

fn validate_text(
    raw: RawText,
    defaults: ClassDefaults,
    invalid: &dyn Fn(String) -> CandleError,
) -> Result<TextConfig, CandleError> {
    if raw.use_sliding_window == Some(true) {
        return Err(invalid("use_sliding_window=true is not supported".into()));
    }
    if let Some(act) = &raw.hidden_act {
        if act != "silu" {
            return Err(invalid(format!(
                "hidden_act `{act}` is not supported (only silu)"
            )));
        }
    }
    for (name, rope) in [
        ("rope_parameters", &raw.rope_parameters),
        ("rope_scaling", &raw.rope_scaling),
    ] {
        if let Some(r) = rope {
            let kind = r
                .rope_type
                .as_deref()
                .or(r.legacy_type.as_deref())
                .unwrap_or("default");
            if kind != "default" {
                return Err(invalid(format!(
                    "{name}: rope type `{kind}` is not supported (only default)"
                )));
            }
        }
    }
    let param = |f: fn(&RawRope) -> Option<f64>| raw.rope_parameters.as_ref().and_then(f);
    let theta = param(|r| r.rope_theta)
        .or(raw.rope_theta)
        .unwrap_or(10_000.0);
    let partial = param(|r| r.partial_rotary_factor)
        .or(raw.partial_rotary_factor)
        .unwrap_or(1.0);

    let positive = [
        ("hidden_size", raw.hidden_size),
        ("num_hidden_layers", raw.num_hidden_layers),
        ("num_attention_heads", raw.num_attention_heads),
        ("intermediate_size", raw.intermediate_size),
        ("vocab_size", raw.vocab_size),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(invalid(format!("{name} must be positive")));
    }
    let num_kv_heads = raw
        .num_key_value_heads
        .unwrap_or(defaults.num_key_value_heads);
    let rms_norm_eps = raw.rms_norm_eps.unwrap_or(defaults.rms_norm_eps);
    if num_kv_heads == 0 || !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
        return Err(invalid(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {num_kv_heads}",
            raw.num_attention_heads
        )));
    }
    let head_dim = match raw.head_dim.or(defaults.head_dim) {
        Some(d) => d,
        None if raw.hidden_size.is_multiple_of(raw.num_attention_heads) => {
            raw.hidden_size / raw.num_attention_heads
        }
        None => {
            return Err(invalid(
                "hidden_size is not a multiple of num_attention_heads".into(),
            ))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(invalid(format!(
            "head_dim {head_dim} must be positive and even"
        )));
    }
    // written so that NaN fails every check
    let in_range = theta > 0.0 && partial > 0.0 && partial <= 1.0 && rms_norm_eps > 0.0;
    if !in_range {
        return Err(invalid(format!(
            "rope_theta {theta}, partial_rotary_factor {partial} or rms_norm_eps {rms_norm_eps} out of range"
        )));
    }
    let layer_kinds = layer_kinds(&raw, invalid)?;
    Ok(TextConfig {
        hidden_size: raw.hidden_size,
        num_layers: raw.num_hidden_layers,
        num_heads: raw.num_attention_heads,
        num_kv_heads,
        head_dim,
        intermediate_size: raw.intermediate_size,
        vocab_size: raw.vocab_size,
        rms_norm_eps,
        rope: RopeConfig {
            theta,
            partial_rotary_factor: partial,
        },
        attention_bias: raw.attention_bias,
        layer_kinds,
        tie_word_embeddings: raw.tie_word_embeddings,
        max_positions: raw.max_position_embeddings,
    })
}

fn layer_kinds(
    raw: &RawText,
    invalid: &dyn Fn(String) -> CandleError,
) -> Result<Vec<LayerKind>, CandleError> {
    let n = raw.num_hidden_layers;
    match (&raw.layer_types, raw.full_attention_interval) {
        (Some(types), _) => {
            if types.len() != n {
                return Err(invalid(format!(
                    "layer_types has {} entries for {n} layers",
                    types.len()
                )));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(LayerKind::FullAttention),
                    "linear_attention" => Ok(LayerKind::LinearAttention),
                    other => Err(invalid(format!("layer type `{other}` is not supported"))),
                })
                .collect()
        }
        (None, Some(interval)) if interval > 0 => Ok((0..n)
            .map(|i| {
                if (i + 1) % interval == 0 {
                    LayerKind::FullAttention
                } else {
                    LayerKind::LinearAttention
                }
            })
            .collect()),
        _ => Ok(vec![LayerKind::FullAttention; n]),
    }
}

/// The config agrees with the stored tensors: the stored layer indices cover exactly
/// `0..num_hidden_layers`, and the text model's `embed_tokens.weight` has shape
/// `[vocab_size, hidden_size]`. `tensors` are all stored tensor names with their shapes. Runs
/// before the model is built, so a config that disagrees with its weights allocates nothing.
pub(crate) fn check_against_tensors<'a>(
    config: &ModelConfig,
    tensors: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> Result<(), CandleError> {
    let invalid = |reason: String| CandleError::InvalidConfig {
        path: config.path.clone(),
        reason,
    };
    let t = &config.text;
    let mut max_layer: Option<u64> = None;
    let mut embed: Option<&[usize]> = None;
    for (name, shape) in tensors {
        // vision towers and MTP heads have layers of their own; only the text model's count
        if name.contains("visual") || name.starts_with("mtp") || name.contains(".mtp.") {
            continue;
        }
        if let Some(i) = layer_index(name) {
            max_layer = Some(max_layer.map_or(i, |m| m.max(i)));
        }
        if name.ends_with("embed_tokens.weight") {
            embed = Some(shape);
        }
    }
    let stored_layers = max_layer.map_or(0, |m| m + 1);
    if stored_layers != t.num_layers as u64 {
        return Err(invalid(format!(
            "num_hidden_layers is {} but the checkpoint stores tensors for {stored_layers} layers",
            t.num_layers
        )));
    }
    if let Some(shape) = embed {
        if shape != [t.vocab_size, t.hidden_size] {
            return Err(invalid(format!(
                "vocab_size {} x hidden_size {} does not match the stored embedding of shape {shape:?}",
                t.vocab_size, t.hidden_size
            )));
        }
    }
    Ok(())
}

/// Layer indices `i` of tensor names containing `layers.{i}.`.
fn layer_index(name: &str) -> Option<u64> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    let digits = &rest[..rest.find('.')?];
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 1000,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
            "tie_word_embeddings": true, "hidden_act": "silu"
        })
    }

    #[test]
    fn reads_old_and_new_rope_keys() {
        let c = ModelConfig::from_json(Path::new("c"), &base()).ok();
        let c = c
            .as_ref()
            .map(|c| (c.text.rope.theta, c.text.head_dim, c.stored_dtype.clone()));
        assert_eq!(c, Some((1e6, 16, Some("bfloat16".into()))));
        let mut v = base();
        if let Some(o) = v.as_object_mut() {
            o.remove("rope_theta");
            o.remove("torch_dtype");
            o.insert(
                "rope_parameters".into(),
                json!({"rope_theta": 5e6, "rope_type": "default"}),
            );
            o.insert("dtype".into(), json!("float32"));
        }
        let c = ModelConfig::from_json(Path::new("c"), &v).ok();
        assert_eq!(
            c.map(|c| (c.text.rope.theta, c.stored_dtype)),
            Some((5e6, Some("float32".into())))
        );
    }

    #[test]
    fn missing_keys_take_transformers_class_defaults() {
        let mut v = base();
        if let Some(o) = v.as_object_mut() {
            o.remove("rms_norm_eps");
            o.remove("num_key_value_heads");
            o.insert("num_attention_heads".into(), json!(32));
            o.insert("hidden_size".into(), json!(128));
        }
        let c = ModelConfig::from_json(Path::new("c"), &v).ok();
        let got = |c: Option<ModelConfig>| {
            c.map(|c| (c.text.head_dim, c.text.num_kv_heads, c.text.rms_norm_eps))
        };
        // Qwen2: head_dim = hidden / heads
        assert_eq!(got(c), Some((4, 32, 1e-6)));
        v["architectures"] = json!(["Qwen3ForCausalLM"]);
        let c = ModelConfig::from_json(Path::new("c"), &v).ok();
        assert_eq!(got(c), Some((128, 32, 1e-6)));
        v["head_dim"] = json!(8);
        let c = ModelConfig::from_json(Path::new("c"), &v).ok();
        assert_eq!(got(c), Some((8, 32, 1e-6)));
    }

    #[test]
    fn rejects_unknown_architecture_by_name() {
        let mut v = base();
        v["architectures"] = json!(["LlamaForCausalLM"]);
        let err = ModelConfig::from_json(Path::new("c"), &v)
            .err()
            .map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("LlamaForCausalLM"));
    }

    #[test]
    fn nested_text_config_is_used() {
        let mut v = json!({"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": false});
        v["text_config"] = base();
        v["text_config"]["head_dim"] = json!(32);
        let c = ModelConfig::from_json(Path::new("c"), &v).ok();
        assert_eq!(
            c.map(|c| (c.architecture, c.text.head_dim, c.tie_word_embeddings)),
            Some((Architecture::Qwen3, 32, Some(false)))
        );
    }

    #[test]
    fn layer_indices_are_read_from_names() {
        assert_eq!(layer_index("model.layers.27.mlp.up_proj.weight"), Some(27));
        assert_eq!(layer_index("model.language_model.layers.3.x"), Some(3));
        assert_eq!(layer_index("model.norm.weight"), None);
        assert_eq!(layer_index("model.layers.x.y"), None);
    }
}
