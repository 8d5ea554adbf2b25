//! Typed facts about a loaded model: what the engine sizes groups with, what provenance records,
//! and which built-in chat template a checkpoint without one gets. User strings (`--device`,
//! `--dtype`) and `config.json` names are parsed into these types once, at the boundary.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use crate::error::BackendError;

/// The model families forkscore knows: one name per family, used by the backends (which loader),
/// the engine (which built-in chat template) and the test kit (which tiny checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Qwen2 / Qwen2.5 dense.
    Qwen2,
    /// Qwen3 dense.
    Qwen3,
    /// Qwen3.5 hybrid (Gated DeltaNet + gated attention).
    Qwen3_5,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Qwen2, Family::Qwen3, Family::Qwen3_5];

    /// The `config.json` `model_type` of the family's text model.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3_5 => "qwen3_5",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of a type's known names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}`")]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
}

impl FromStr for Family {
    type Err = UnknownName;
    /// Exactly the names [`Family::as_str`] writes.
    fn from_str(s: &str) -> Result<Family, UnknownName> {
        Family::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownName {
                what: "model family",
                name: s.to_string(),
            })
    }
}

/// The model class a checkpoint declares (`architectures[0]` of `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
    /// Qwen3.5 with its vision tower (text model under `text_config`).
    Qwen3_5ForConditionalGeneration,
    /// Qwen3.5 text-only.
    Qwen3_5ForCausalLM,
    /// A test double with no real model behind it (no family, no chat template).
    Fake,
}

impl Architecture {
    pub const ALL: [Architecture; 5] = [
        Architecture::Qwen2ForCausalLM,
        Architecture::Qwen3ForCausalLM,
        Architecture::Qwen3_5ForConditionalGeneration,
        Architecture::Qwen3_5ForCausalLM,
        Architecture::Fake,
    ];

    /// The class name as `config.json` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Qwen2ForCausalLM => "Qwen2ForCausalLM",
            Architecture::Qwen3ForCausalLM => "Qwen3ForCausalLM",
            Architecture::Qwen3_5ForConditionalGeneration => "Qwen3_5ForConditionalGeneration",
            Architecture::Qwen3_5ForCausalLM => "Qwen3_5ForCausalLM",
            Architecture::Fake => "FakeForTests",
        }
    }

    /// The family of a real architecture; None for the test double.
    pub fn family(self) -> Option<Family> {
        match self {
            Architecture::Qwen2ForCausalLM => Some(Family::Qwen2),
            Architecture::Qwen3ForCausalLM => Some(Family::Qwen3),
            Architecture::Qwen3_5ForConditionalGeneration | Architecture::Qwen3_5ForCausalLM => {
                Some(Family::Qwen3_5)
            }
            Architecture::Fake => None,
        }
    }

    /// The class a `config.json` without `architectures` means: the family's text model class
    /// (`model_type` `qwen3_5` is the multimodal class, `qwen3_5_text` the text-only one).
    pub fn from_model_type(model_type: &str) -> Option<Architecture> {
        match model_type {
            "qwen2" => Some(Architecture::Qwen2ForCausalLM),
            "qwen3" => Some(Architecture::Qwen3ForCausalLM),
            "qwen3_5" => Some(Architecture::Qwen3_5ForConditionalGeneration),
            "qwen3_5_text" => Some(Architecture::Qwen3_5ForCausalLM),
            _ => None,
        }
    }

    /// A class name or, failing that, a `model_type`.
    pub fn from_name(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| *a != Architecture::Fake && a.as_str() == name)
            .or_else(|| Architecture::from_model_type(name))
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Architecture {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Where the model runs. Parsed once from `cpu` | `cuda` | `cuda:N` | `metal` | `metal:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl Device {
    /// The dtype used when the caller does not choose one: f32 on CPU, bf16 on accelerators.
    pub fn default_dtype(self) -> DType {
        match self {
            Device::Cpu => DType::F32,
            Device::Cuda(_) | Device::Metal(_) => DType::Bf16,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for Device {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| BackendError::Device {
            reason: format!(
                "cannot parse device `{s}` ({why}); expected cpu, cuda[:N] or metal[:N]"
            ),
        };
        let lower = s.trim().to_ascii_lowercase();
        let (kind, ordinal) = match lower.split_once(':') {
            Some((kind, n)) => {
                let n: usize = n.parse().map_err(|_| bad("the ordinal is not a number"))?;
                (kind.to_string(), Some(n))
            }
            None => (lower.clone(), None),
        };
        match (kind.as_str(), ordinal) {
            ("cpu", None) => Ok(Device::Cpu),
            ("cpu", Some(_)) => Err(bad("cpu takes no ordinal")),
            ("cuda", n) => Ok(Device::Cuda(n.unwrap_or(0))),
            ("metal", n) => Ok(Device::Metal(n.unwrap_or(0))),
            _ => Err(bad("unknown device kind")),
        }
    }
}

/// The dtype of the backbone's weights and activations. Softmax and the candidate head always
/// run in f32 whatever this is. Parsed once from `f32` | `bf16` | `f16` (or the long names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DType {
    #[default]
    F32,
    Bf16,
    F16,
}

impl DType {
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for DType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(DType::F32),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f16" | "float16" => Ok(DType::F16),
            _ => Err(BackendError::Device {
                reason: format!("cannot parse dtype `{s}`; expected f32, bf16 or f16"),
            }),
        }
    }
}

/// In-memory quantization of the backbone's linear weights at load time (the stored
/// checkpoint is unchanged). Parsed once from `q8_0` | `q4k` | `bf16` (also `q8`, `q4_k`, `q4`,
/// `bfloat16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantization {
    /// 8-bit blocks of 32 weights with one f16 scale (ggml `Q8_0`, 8.5 bits per weight).
    Q8_0,
    /// 4-bit super-blocks of 256 weights with 6-bit sub-block scales and minimums (ggml `Q4_K`,
    /// 4.5 bits per weight).
    Q4K,
    /// Each weight rounded to bf16 (16 bits per weight); the products multiply bf16 weights by
    /// activations rounded to bf16, summing in f32.
    Bf16,
    /// Each weight row (output channel) rounded to int8 with one f32 scale; the products
    /// multiply it by the activations rounded to int8 per row, summing exactly in i32 over the
    /// whole input (8 bits per weight). CPU only, on the AMX-INT8 tiles.
    Int8,
}

impl Quantization {
    pub const ALL: [Quantization; 4] = [
        Quantization::Q8_0,
        Quantization::Q4K,
        Quantization::Bf16,
        Quantization::Int8,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Quantization::Q8_0 => "q8_0",
            Quantization::Q4K => "q4k",
            Quantization::Bf16 => "bf16",
            Quantization::Int8 => "int8",
        }
    }
}

impl fmt::Display for Quantization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Quantization {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl FromStr for Quantization {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "q8_0" | "q8" => Ok(Quantization::Q8_0),
            "q4k" | "q4_k" | "q4" => Ok(Quantization::Q4K),
            "bf16" | "bfloat16" => Ok(Quantization::Bf16),
            "int8" | "i8" => Ok(Quantization::Int8),
            _ => Err(BackendError::Device {
                reason: format!(
                    "cannot parse quantization `{s}`; expected q8_0, q4k, bf16 or int8"
                ),
            }),
        }
    }
}

/// Facts about the loaded model the engine and the provenance record need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelFacts {
    pub architecture: Architecture,
    /// None only for test doubles ([`Architecture::Fake`]).
    pub family: Option<Family>,
    /// Number of rows of the embedding / output head (may exceed the tokenizer's vocabulary).
    pub vocab_size: usize,
    pub num_layers: usize,
    pub hidden_size: usize,
    /// Query heads of the attention layers.
    pub attention_heads: usize,
    /// Key/value heads of the attention layers (fewer than query heads under grouped-query
    /// attention).
    pub kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Bytes of state one sequence holds whatever its length: the f32 conv + recurrent states of
    /// linear-attention (Gated DeltaNet) layers; 0 for attention-only models. Memory budgets
    /// count it per retained context and, one layer at a time, per row of a scoring call (each
    /// row's branch state).
    pub fixed_state_bytes: usize,
    /// How many layers hold that fixed state (the linear-attention layers; 0 for attention-only
    /// models): `fixed_state_bytes / fixed_state_layers` is one layer's share.
    pub fixed_state_layers: usize,
    /// Compute dtype of the backbone.
    pub dtype: DType,
    pub device: Device,
    /// In-memory quantization of the linear weights, `None` when they are kept in `dtype`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// The longest sequence the model was built for (`max_position_embeddings`), when the
    /// checkpoint states one. Longer inputs are refused, never truncated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices_and_dtypes() {
        assert_eq!("cpu".parse::<Device>().ok(), Some(Device::Cpu));
        assert_eq!("cuda".parse::<Device>().ok(), Some(Device::Cuda(0)));
        assert_eq!("CUDA:3".parse::<Device>().ok(), Some(Device::Cuda(3)));
        assert_eq!("metal:1".parse::<Device>().ok(), Some(Device::Metal(1)));
        assert!("cpu:0".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
        assert_eq!("bf16".parse::<DType>().ok(), Some(DType::Bf16));
        assert!("f64".parse::<DType>().is_err());
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
        for q in Quantization::ALL {
            assert_eq!(q.as_str().parse::<Quantization>().ok(), Some(q));
        }
        assert_eq!("Q4_K".parse::<Quantization>().ok(), Some(Quantization::Q4K));
        let err = "q3k".parse::<Quantization>().unwrap_err().to_string();
        assert!(
            err.contains("q3k") && err.contains("q8_0, q4k, bf16 or int8"),
            "{err}"
        );
    }

    #[test]
    fn names_round_trip() {
        for f in Family::ALL {
            assert_eq!(f.as_str().parse::<Family>().ok(), Some(f));
        }
        for a in Architecture::ALL {
            if a != Architecture::Fake {
                assert_eq!(Architecture::from_name(a.as_str()), Some(a));
            }
        }
        assert!("llama".parse::<Family>().is_err());
    }
}
