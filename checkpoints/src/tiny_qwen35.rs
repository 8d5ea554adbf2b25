//! Tiny Qwen3.5 checkpoints in the exact Hugging Face layout, from a seed.
//!
//! In: a [`TinyQwen35`] description (seed, layout, dimensions). Out: a folder holding
//! `config.json`, `model.safetensors`, the real Qwen3.5 `tokenizer.json`,
//! `tokenizer_config.json` and `chat_template.jinja` — loadable by the candle backend and by
//! transformers (`Qwen3_5ForConditionalGeneration` / `Qwen3_5ForCausalLM`).
//!
//! Layouts: [`Qwen35Layout::Multimodal`] nests the text fields under `text_config`, stores the
//! text weights under `model.language_model.` and adds a few `model.visual.*` and `mtp.*`
//! tensors (which a text backbone must never read); [`Qwen35Layout::TextOnly`] is the flat
//! `Qwen3_5ForCausalLM` layout under `model.`. For one seed both layouts hold the same text
//! parameters, so they must give identical logits.
//!
//! Invariants: every parameter comes from one ChaCha stream seeded by `seed`, generated in a
//! fixed order with exact integer-to-float arithmetic, so files are byte-identical across
//! machines. Both layer types are present; offset-convention norms (`1 + w`) are small
//! non-zero values, the GDN output norm (plain `w`) is around 1, `A_log` and `dt_bias` are in
//! ranges that give visible but not vanishing decay. Weights are stored BF16 except `A_log` and
//! `linear_attn.norm.weight` (F32), as in the real checkpoints.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use rand::RngCore;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use safetensors::Dtype;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::tiny_model::{write_safetensors, TinyModelError, TinyTensor, GENERATOR_VERSION};
use crate::tokenizers::{Family, Fixture, TokenizerFixtureError};

/// Which checkpoint layout to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen35Layout {
    /// `Qwen3_5ForConditionalGeneration`: `text_config`, `model.language_model.*`, plus
    /// `model.visual.*` and `mtp.*` tensors.
    Multimodal,
    /// `Qwen3_5ForCausalLM`: flat config, `model.*`.
    TextOnly,
}

/// A tiny Qwen3.5 model description. [`TinyQwen35::new`] gives the default shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyQwen35 {
    pub seed: u64,
    pub layout: Qwen35Layout,
    pub hidden: usize,
    /// `"linear_attention"` / `"full_attention"` per layer.
    pub layer_types: Vec<&'static str>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub linear_key_heads: usize,
    pub linear_value_heads: usize,
    pub linear_key_dim: usize,
    pub linear_value_dim: usize,
    pub conv_kernel: usize,
    /// Embedding rows; the real 248,320 so every real token id is valid.
    pub vocab: usize,
    pub rope_theta: f64,
    pub partial_rotary_factor: f64,
}

/// Failure to write a tiny checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum TinyQwen35Error {
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerFixtureError),
    #[error(transparent)]
    Safetensors(#[from] TinyModelError),
}

/// Uniform values in `[lo, hi)` from a ChaCha stream, with exact arithmetic: a 24-bit integer
/// scaled by a power of two, then one multiply-add in f64 rounded once to f32.
struct Params(ChaCha8Rng);

impl Params {
    fn uniform(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u = (self.0.next_u32() >> 8) as f64 / (1u64 << 24) as f64;
                (lo + (hi - lo) * u) as f32
            })
            .collect()
    }
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl TinyQwen35 {
    /// Default shapes: hidden 32, 4 layers (linear, full, linear, full), attention 4 heads /
    /// 2 KV heads / head_dim 16 (4 rotary dims), GDN 2 key heads / 4 value heads / dk 8 / dv 8 /
    /// kernel 4, MLP 64, the real 248,320-row embedding.
    pub fn new(seed: u64, layout: Qwen35Layout) -> Self {
        TinyQwen35 {
            seed,
            layout,
            hidden: 32,
            layer_types: vec![
                "linear_attention",
                "full_attention",
                "linear_attention",
                "full_attention",
            ],
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 64,
            linear_key_heads: 2,
            linear_value_heads: 4,
            linear_key_dim: 8,
            linear_value_dim: 8,
            conv_kernel: 4,
            vocab: Family::Qwen3_5.embedding_rows(),
            rope_theta: 1e7,
            partial_rotary_factor: 0.25,
        }
    }

    /// The text fields of `config.json` (nested under `text_config` in the multimodal layout).
    pub fn text_config(&self) -> Value {
        json!({
            "model_type": "qwen3_5_text",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layer_types.len(),
            "layer_types": self.layer_types,
            "full_attention_interval": 2,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "attention_bias": false,
            "attn_output_gate": true,
            "linear_num_key_heads": self.linear_key_heads,
            "linear_num_value_heads": self.linear_value_heads,
            "linear_key_head_dim": self.linear_key_dim,
            "linear_value_head_dim": self.linear_value_dim,
            "linear_conv_kernel_dim": self.conv_kernel,
            "intermediate_size": self.intermediate,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "vocab_size": self.vocab,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": true,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": [1, 1, 0],
                "mrope_interleaved": true
            },
            "mamba_ssm_dtype": "float32",
            "mtp_num_hidden_layers": 1,
            "eos_token_id": 248044,
            "dtype": "bfloat16"
        })
    }

    /// The whole `config.json`.
    pub fn config(&self) -> Value {
        match self.layout {
            Qwen35Layout::TextOnly => {
                let mut c = self.text_config();
                c["architectures"] = json!(["Qwen3_5ForCausalLM"]);
                c
            }
            Qwen35Layout::Multimodal => json!({
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "model_type": "qwen3_5",
                "text_config": self.text_config(),
                "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 16,
                                  "num_heads": 2, "patch_size": 2, "out_hidden_size": self.hidden},
                "image_token_id": 248056,
                "video_token_id": 248057,
                "vision_start_token_id": 248053,
                "vision_end_token_id": 248054,
                "tie_word_embeddings": true
            }),
        }
    }

    fn text_prefix(&self) -> &'static str {
        match self.layout {
            Qwen35Layout::Multimodal => "model.language_model.",
            Qwen35Layout::TextOnly => "model.",
        }
    }

    /// Every tensor, generated in a fixed order from the seed. Text parameters do not depend
    /// on the layout; vision / MTP extras come from a separate stream after them.
    pub fn tensors(&self) -> Vec<TinyTensor> {
        let mut p = Params(ChaCha8Rng::seed_from_u64(self.seed));
        let mut out = BTreeMap::new();
        let pre = self.text_prefix();
        let d = self.hidden;
        let mut put = |name: String, shape: Vec<usize>, values: Vec<f32>, f32_store: bool| {
            let (dtype, bytes) = if f32_store {
                (Dtype::F32, f32_bytes(&values))
            } else {
                (Dtype::BF16, bf16_bytes(&values))
            };
            out.insert(
                name.clone(),
                TinyTensor {
                    name,
                    shape,
                    dtype,
                    bytes,
                },
            );
        };
        let lin = |p: &mut Params, rows: usize, cols: usize| {
            let s = 1.0 / (cols as f64).sqrt();
            p.uniform(rows * cols, -s, s)
        };
        put(
            format!("{pre}embed_tokens.weight"),
            vec![self.vocab, d],
            p.uniform(self.vocab * d, -1.0, 1.0),
            false,
        );
        let (hk, hv, dk, dv, kc) = (
            self.linear_key_heads,
            self.linear_value_heads,
            self.linear_key_dim,
            self.linear_value_dim,
            self.conv_kernel,
        );
        let (cc, cv) = (2 * hk * dk + hv * dv, hv * dv);
        for (i, kind) in self.layer_types.iter().enumerate() {
            let l = format!("{pre}layers.{i}.");
            put(
                format!("{l}input_layernorm.weight"),
                vec![d],
                p.uniform(d, -0.3, 0.3),
                false,
            );
            if *kind == "full_attention" {
                let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
                put(
                    format!("{l}self_attn.q_proj.weight"),
                    vec![2 * h * hd, d],
                    lin(&mut p, 2 * h * hd, d),
                    false,
                );
                put(
                    format!("{l}self_attn.k_proj.weight"),
                    vec![kvh * hd, d],
                    lin(&mut p, kvh * hd, d),
                    false,
                );
                put(
                    format!("{l}self_attn.v_proj.weight"),
                    vec![kvh * hd, d],
                    lin(&mut p, kvh * hd, d),
                    false,
                );
                put(
                    format!("{l}self_attn.o_proj.weight"),
                    vec![d, h * hd],
                    lin(&mut p, d, h * hd),
                    false,
                );
                put(
                    format!("{l}self_attn.q_norm.weight"),
                    vec![hd],
                    p.uniform(hd, -0.3, 0.3),
                    false,
                );
                put(
                    format!("{l}self_attn.k_norm.weight"),
                    vec![hd],
                    p.uniform(hd, -0.3, 0.3),
                    false,
                );
            } else {
                let a = format!("{l}linear_attn.");
                put(
                    format!("{a}in_proj_qkv.weight"),
                    vec![cc, d],
                    lin(&mut p, cc, d),
                    false,
                );
                put(
                    format!("{a}in_proj_z.weight"),
                    vec![cv, d],
                    lin(&mut p, cv, d),
                    false,
                );
                put(
                    format!("{a}in_proj_b.weight"),
                    vec![hv, d],
                    lin(&mut p, hv, d),
                    false,
                );
                put(
                    format!("{a}in_proj_a.weight"),
                    vec![hv, d],
                    lin(&mut p, hv, d),
                    false,
                );
                put(
                    format!("{a}conv1d.weight"),
                    vec![cc, 1, kc],
                    p.uniform(cc * kc, -0.6, 0.6),
                    false,
                );
                put(
                    format!("{a}A_log"),
                    vec![hv],
                    p.uniform(hv, -1.5, 1.5),
                    true,
                );
                put(
                    format!("{a}dt_bias"),
                    vec![hv],
                    p.uniform(hv, -2.0, 1.0),
                    false,
                );
                put(
                    format!("{a}norm.weight"),
                    vec![dv],
                    p.uniform(dv, 0.6, 1.4),
                    true,
                );
                put(
                    format!("{a}out_proj.weight"),
                    vec![d, cv],
                    lin(&mut p, d, cv),
                    false,
                );
            }
            put(
                format!("{l}post_attention_layernorm.weight"),
                vec![d],
                p.uniform(d, -0.3, 0.3),
                false,
            );
            let f = self.intermediate;
            put(
                format!("{l}mlp.gate_proj.weight"),
                vec![f, d],
                lin(&mut p, f, d),
                false,
            );
            put(
                format!("{l}mlp.up_proj.weight"),
                vec![f, d],
                lin(&mut p, f, d),
                false,
            );
            put(
                format!("{l}mlp.down_proj.weight"),
                vec![d, f],
                lin(&mut p, d, f),
                false,
            );
        }
        put(
            format!("{pre}norm.weight"),
            vec![d],
            p.uniform(d, -0.3, 0.3),
            false,
        );
        if self.layout == Qwen35Layout::Multimodal {
            let mut x = Params(ChaCha8Rng::seed_from_u64(self.seed ^ 0x5649_5349_4f4e));
            for (name, shape) in [
                ("model.visual.patch_embed.proj.weight", vec![16, 3, 2, 2, 2]),
                ("model.visual.blocks.0.attn.qkv.weight", vec![48, 16]),
                ("model.visual.merger.linear_fc2.weight", vec![d, 64]),
                ("mtp.fc.weight", vec![d, 2 * d]),
                ("mtp.layers.0.input_layernorm.weight", vec![d]),
                ("mtp.norm.weight", vec![d]),
            ] {
                let n = shape.iter().product();
                put(name.to_string(), shape, x.uniform(n, -0.1, 0.1), false);
            }
        }
        out.into_values().collect()
    }

    /// Write the checkpoint folder into `dir` (created if missing). Returns `dir`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, TinyQwen35Error> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TinyQwen35Error::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tensors = self.tensors();
        write_safetensors(
            &dir.join("model.safetensors"),
            &tensors.iter().collect::<Vec<_>>(),
        )?;
        let files: [(&str, Vec<u8>); 4] = [
            ("config.json", pretty(&self.config())),
            ("tokenizer.json", Family::Qwen3_5.tokenizer_json()?),
            (
                "tokenizer_config.json",
                Family::Qwen3_5.tokenizer_config_json().as_bytes().to_vec(),
            ),
            (
                "chat_template.jinja",
                Family::Qwen3_5.chat_template().as_bytes().to_vec(),
            ),
        ];
        for (name, data) in files {
            let path = dir.join(name);
            std::fs::write(&path, data).map_err(io(&path))?;
        }
        Ok(dir.to_path_buf())
    }
}

impl TinyQwen35 {
    /// The folder of this model, written once and reused (keyed by a hash of the description
    /// and [`GENERATOR_VERSION`], under the system temp dir; written under a private name then
    /// renamed, so concurrent test processes never see a half-written folder).
    pub fn ensure(&self) -> Result<PathBuf, TinyQwen35Error> {
        static DONE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
        let key = {
            let digest = Sha256::digest(format!("qwen35 v{GENERATOR_VERSION} {self:?}"));
            hex::encode(&digest[..8])
        };
        let done = DONE.get_or_init(|| Mutex::new(HashMap::new()));
        let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = done.get(&key) {
            return Ok(p.clone());
        }
        let root = std::env::temp_dir().join("forkscore-tiny-models");
        let dir = root.join(format!("qwen35-{key}"));
        if !dir.join("config.json").is_file() {
            let tmp = root.join(format!("qwen35-{key}.tmp-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            self.write(&tmp)?;
            if std::fs::rename(&tmp, &dir).is_err() {
                // another process won the race; its folder is byte-identical
                let _ = std::fs::remove_dir_all(&tmp);
            }
        }
        done.insert(key, dir.clone());
        Ok(dir)
    }
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// The files are a pure function of the seed: these digests must not change across machines
    /// or runs (a change means every recorded reference for the tiny model is stale).
    #[test]
    fn files_are_byte_identical_for_a_seed() -> Result<(), TinyQwen35Error> {
        let dir = std::env::temp_dir().join(format!(
            "forkscore-tiny-qwen35-golden-{}",
            std::process::id()
        ));
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| TinyQwen35Error::Io {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut digests = Vec::new();
        for layout in [Qwen35Layout::Multimodal, Qwen35Layout::TextOnly] {
            TinyQwen35::new(35, layout).write(&dir)?;
            digests.push(sha(&read(&dir.join("model.safetensors"))?));
            digests.push(sha(&read(&dir.join("config.json"))?));
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(digests[0], GOLDEN_MULTIMODAL);
        assert_eq!(digests[2], GOLDEN_TEXT_ONLY);
        assert_eq!(digests[3], GOLDEN_TEXT_ONLY_CONFIG);
        Ok(())
    }

    const GOLDEN_MULTIMODAL: &str =
        "d0587b5b20e2e3d5d9a780221b1a1ad8c62849aed494adea0d84c05981d22088";
    const GOLDEN_TEXT_ONLY: &str =
        "dff92e9696072dc165e4c63db5b9f6089431ab21bf3d55ba9b0cfb290894710c";
    const GOLDEN_TEXT_ONLY_CONFIG: &str =
        "95b7b3ff1c838dac2a9cbb6ca5175e25fe159e83c5229b3f3b1457ca82102ea1";
}
