//! The text side of a checkpoint: its `tokenizer.json` and chat template, loaded once.
//!
//! Template lookup order: `chat_template` in `tokenizer_config.json` (a string, or the list of
//! named templates where `default` wins), then `chat_template.jinja`, then the built-in template
//! of the model family (the provenance then says so). Checkpoint files are untrusted input: each
//! is read only when it is a regular file of bounded size ([`read_checkpoint_file`]), so a FIFO
//! named `tokenizer.json` is refused instead of blocking forever.

mod bytelevel;

use crate::template::{ChatTemplate, Family, TemplateError, TemplateOrigin};
use bytelevel::ByteLevelBpe;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("invalid tokenizer {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("tokenizing failed: {reason}")]
    Encode { reason: String },
    #[error("no chat template in {dir} (neither tokenizer_config.json `chat_template` nor chat_template.jinja) and no built-in template for model family `{family}`")]
    NoTemplate { dir: PathBuf, family: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
}

/// A tokenizer plus the chat template prompts are rendered with.
#[derive(Debug)]
pub struct ChatTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: ChatTemplate,
    /// Text of every added token (tokenization segments the input at these first).
    added: Vec<String>,
    /// Text of every special added token (what an untrusted context must not inject).
    special: Vec<String>,
    /// The same tokenizer with special tokens encoded as text (built on first use).
    plain: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// Whether [`ChatTokenizer::encode`] may take the exact fast encoder.
    fast_enabled: bool,
    /// The exact fast encoder of a Qwen byte-level BPE pipeline (`None`: another pipeline, which
    /// `tokenizers` encodes), built on first use.
    fast: std::sync::OnceLock<Option<ByteLevelBpe>>,
    /// Fingerprint of what row compilation depends on (template, vocabulary, added tokens,
    /// how code-like text tokenizes): compiled rows carry it, and the engine refuses rows
    /// compiled for another tokenizer.
    identity: String,
}

impl ChatTokenizer {
    pub fn new(mut tokenizer: tokenizers::Tokenizer, template: ChatTemplate) -> ChatTokenizer {
        // A tokenizer.json may carry truncation or padding settings (fine-tuning leftovers);
        // forkscore never truncates or pads a prompt, so both are switched off here.
        tokenizer.with_padding(None);
        let _ = tokenizer.with_truncation(None);
        let mut added: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .filter(|c| !c.is_empty())
            .collect();
        added.sort();
        let mut special: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        special.sort();
        let probe = tokenizer
            .encode_fast(
                "field_name: A B C D E F G H I J K L M N O P Q R S T U V W X Y Z\n",
                false,
            )
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default();
        let identity = {
            use sha2::{Digest, Sha256};
            let mut h = Sha256::new();
            h.update(template.source_sha256());
            h.update(tokenizer.get_vocab_size(true).to_le_bytes());
            for a in &added {
                h.update(a.as_bytes());
                h.update([0]);
            }
            for id in probe {
                h.update(id.to_le_bytes());
            }
            hex::encode(h.finalize())
        };
        ChatTokenizer {
            tokenizer,
            template,
            added,
            special,
            plain: std::sync::OnceLock::new(),
            fast_enabled: true,
            fast: std::sync::OnceLock::new(),
            identity,
        }
    }

    /// Take (`true`, the default) or leave the exact fast encoder of the Qwen byte-level BPE
    /// pipelines (`bytelevel`); `false` encodes everything with `tokenizers`, the reference.
    /// The ids are the same either way (tested); `FORKSCORE_TOKENIZER=reference` sets `false`
    /// in the front ends.
    pub fn with_fast_encoder(mut self, on: bool) -> ChatTokenizer {
        self.fast_enabled = on;
        self
    }

    /// Whether encodes take the exact fast encoder (enabled, and the pipeline is one it covers).
    pub fn fast_encoder(&self) -> bool {
        self.fast().is_some()
    }

    fn fast(&self) -> Option<&ByteLevelBpe> {
        if !self.fast_enabled {
            return None;
        }
        self.fast
            .get_or_init(|| ByteLevelBpe::new(&self.tokenizer))
            .as_ref()
    }

    /// Load `tokenizer.json` and the chat template from a checkpoint folder. `model_family` (a
    /// [`Family`] name, e.g. `qwen2`) picks the built-in template when the folder has none.
    pub fn from_folder(dir: &Path, model_family: &str) -> Result<ChatTokenizer, TokenizerError> {
        use forkscore_seam::files::{MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES};
        let tok_path = dir.join("tokenizer.json");
        let bytes = read_checkpoint_file(&tok_path, MAX_TOKENIZER_BYTES)?.ok_or_else(|| {
            TokenizerError::Read {
                path: tok_path.clone(),
                reason: "the checkpoint has no tokenizer.json".into(),
            }
        })?;
        let config = read_checkpoint_text(&dir.join("tokenizer_config.json"), MAX_CONFIG_BYTES)?;
        let jinja = read_checkpoint_text(&dir.join("chat_template.jinja"), MAX_CONFIG_BYTES)?;
        Self::from_parts(&bytes, config.as_deref(), jinja, model_family, dir)
    }

    /// Build from file contents: `tokenizer.json` bytes, the optional `tokenizer_config.json`
    /// text and the optional `chat_template.jinja` text. `origin_dir` only names the source in
    /// error messages.
    pub fn from_parts(
        tokenizer_json: &[u8],
        tokenizer_config: Option<&str>,
        chat_template_jinja: Option<String>,
        model_family: &str,
        origin_dir: &Path,
    ) -> Result<ChatTokenizer, TokenizerError> {
        let tok_path = origin_dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer_json).map_err(|e| {
            TokenizerError::Invalid {
                path: tok_path,
                reason: e.to_string(),
            }
        })?;
        let config: Option<Value> = tokenizer_config
            .map(|text| {
                serde_json::from_str(text).map_err(|e| TokenizerError::Invalid {
                    path: origin_dir.join("tokenizer_config.json"),
                    reason: e.to_string(),
                })
            })
            .transpose()?;
        let token_str = |key: &str| -> Option<String> {
            match config.as_ref()?.get(key)? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let (bos, eos) = (token_str("bos_token"), token_str("eos_token"));
        let from_config = config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(template_text);
        let template = if let Some(src) = from_config {
            ChatTemplate::new(src, TemplateOrigin::TokenizerConfig, bos, eos)?
        } else if let Some(src) = chat_template_jinja {
            ChatTemplate::new(src, TemplateOrigin::ChatTemplateFile, bos, eos)?
        } else {
            let family =
                model_family
                    .parse::<Family>()
                    .map_err(|_| TokenizerError::NoTemplate {
                        dir: origin_dir.to_path_buf(),
                        family: model_family.to_string(),
                    })?;
            ChatTemplate::built_in(family)
        };
        Ok(ChatTokenizer::new(tokenizer, template))
    }

    /// [`ChatTokenizer::from_folder`] for a model of `family` (None: a model with no family,
    /// which then needs a template in the folder).
    pub fn for_model(dir: &Path, family: Option<Family>) -> Result<ChatTokenizer, TokenizerError> {
        Self::from_folder(dir, family.map_or("", Family::as_str))
    }

    /// Fingerprint of this tokenizer + template (see the field docs).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Token ids of `text` (special tokens written in the text are recognised; nothing is added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if let Some(fast) = self.fast() {
            return fast.encode(&self.tokenizer, text, false);
        }
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode {
                reason: e.to_string(),
            })
    }

    /// Text of every special added token (e.g. `<|im_start|>`), sorted.
    pub fn special_tokens(&self) -> &[String] {
        &self.special
    }

    /// Token ids of `text` with special tokens written in it encoded as ordinary text (their
    /// characters), not as control tokens.
    pub fn encode_as_text(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if let Some(fast) = self.fast() {
            return fast.encode(&self.tokenizer, text, true);
        }
        let plain = self.plain.get_or_init(|| {
            let mut t = self.tokenizer.clone();
            t.set_encode_special_tokens(true);
            t
        });
        plain
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode {
                reason: e.to_string(),
            })
    }

    /// Byte offset just after the last added token (e.g. `<|im_start|>`) in `text`, if any.
    /// Tokenization first splits the input at added tokens, so text before that offset
    /// tokenizes the same whatever follows it (`split` checks this per context anyway).
    pub fn last_added_token_end(&self, text: &str) -> Option<usize> {
        self.added
            .iter()
            .filter_map(|t| text.rfind(t.as_str()).map(|i| i + t.len()))
            .max()
    }

    /// Text of `ids` (for debugging output).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| TokenizerError::Encode {
                reason: e.to_string(),
            })
    }

    /// The id of the token whose text is exactly `token` (a vocabulary or added token).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Largest id the tokenizer can produce plus one (vocabulary and added tokens).
    pub fn id_bound(&self) -> usize {
        let base = self.tokenizer.get_vocab_size(true);
        let added = self
            .tokenizer
            .get_added_tokens_decoder()
            .keys()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        base.max(added)
    }
}

/// Read a checkpoint file that must be a regular file of at most `max` bytes (`Ok(None)` when
/// it does not exist).
pub fn read_checkpoint_file(path: &Path, max: u64) -> Result<Option<Vec<u8>>, TokenizerError> {
    forkscore_seam::files::read_regular(path, max).map_err(|e| TokenizerError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// [`read_checkpoint_file`] for UTF-8 text.
pub fn read_checkpoint_text(path: &Path, max: u64) -> Result<Option<String>, TokenizerError> {
    read_checkpoint_file(path, max)?
        .map(|b| {
            String::from_utf8(b).map_err(|e| TokenizerError::Read {
                path: path.to_path_buf(),
                reason: format!("not UTF-8 text: {e}"),
            })
        })
        .transpose()
}

fn template_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |want: &str| {
                list.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == want)
                        .then(|| t.get("template")?.as_str().map(str::to_string))?
                })
            };
            named("default").or_else(|| list.first()?.get("template")?.as_str().map(str::to_string))
        }
        _ => None,
    }
}
