//! The tokenizer and chat template of a GGUF checkpoint.
//!
//! What wins, in order:
//! - tokenizer: a `tokenizer.json` beside the GGUF file; else one built from the file's
//!   `tokenizer.*` metadata ([`tokenizer_json`]);
//! - chat template: `chat_template` of a `tokenizer_config.json` beside the file, or a
//!   `chat_template.jinja` beside it (the folder rules); else `tokenizer.chat_template` of the
//!   metadata; else the family's built-in template.
//!
//! Files beside the file win because they are what a user puts there on purpose (e.g. the
//! original Hugging Face tokenizer of a model whose GGUF metadata was written differently).
//!
//! The metadata tokenizer is the Hugging Face `tokenizer.json` the Qwen checkpoints ship,
//! rebuilt from llama.cpp's fields: `tokenizer.ggml.model = gpt2` (byte-level BPE) with
//! `tokenizer.ggml.pre = qwen2` (Qwen's pre-tokenizer regex, split isolated, then byte-level
//! without its own regex), an NFC normalizer, tokens of type 1 (normal) as the BPE vocabulary,
//! `tokenizer.ggml.merges` as the merges, and tokens of type 3 (control) and 4 (user-defined)
//! as added tokens — control ones `special`. Type 5 (unused: llama.cpp's `[PAD…]` fillers up to
//! the embedding's row count) are left out, as they are absent from the Hugging Face file.
//! One difference is inherent: llama.cpp's converter marks every added token that looks like
//! `<|…|>` as control, so `<|fim_prefix|>`, `<|repo_name|>` and the like, `special: false` in
//! Qwen's own tokenizer.json, are special here. Ids are the same; only a context holding that
//! text differs — it is then encoded as plain text (forkscore's default for special-token text
//! in contexts), where the Hugging Face tokenizer would match the added token.

use std::path::Path;

use forkscore_backends::candle::gguf::GgufTokenizer;
use forkscore_backends::Family;
use forkscore_engine::prepare::untrusted::{read_checkpoint_file, read_checkpoint_text};
use forkscore_engine::template::{ChatTemplate, TemplateOrigin};
use forkscore_engine::tokenizer::{ChatTokenizer, TokenizerError};
use serde::Serialize;
use serde_json::{json, Value};

/// Qwen's pre-tokenizer regex (Qwen2, Qwen2.5, Qwen3 tokenizer.json: `Split`, `Isolated`).
pub const QWEN2_PRE_TOKENIZER: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// Where the tokenizer and the chat template of a GGUF checkpoint came from (provenance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TextSource {
    /// The GGUF file's metadata.
    GgufMetadata,
    /// `tokenizer.json` beside the file.
    TokenizerJson,
    /// `tokenizer_config.json` or `chat_template.jinja` beside the file.
    BesideFile,
    /// The family's built-in template (neither the metadata nor a file beside has one).
    BuiltIn,
}

/// The Hugging Face `tokenizer.json` equivalent of `t` (see the module doc), or why there is
/// none.
pub fn tokenizer_json(t: &GgufTokenizer) -> Result<Value, String> {
    if t.model != "gpt2" {
        return Err(format!(
            "tokenizer.ggml.model is `{}`; only `gpt2` (byte-level BPE) is rebuilt from GGUF metadata",
            t.model
        ));
    }
    match t.pre.as_deref() {
        Some("qwen2") => {}
        other => {
            return Err(format!(
                "tokenizer.ggml.pre is {other:?}; only `qwen2` (the Qwen pre-tokenizer) is rebuilt from GGUF metadata"
            ))
        }
    }
    if t.tokens.is_empty() {
        return Err("tokenizer.ggml.tokens is missing or empty".into());
    }
    if t.token_types.len() != t.tokens.len() {
        return Err("tokenizer.ggml.token_type is missing or does not match the tokens".into());
    }
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (token, &ty)) in t.tokens.iter().zip(&t.token_types).enumerate() {
        match ty {
            NORMAL => {
                if vocab.insert(token.clone(), json!(id)).is_some() {
                    return Err(format!("token `{token}` appears twice in the vocabulary"));
                }
            }
            CONTROL | USER_DEFINED => added.push(json!({
                "id": id,
                "content": token,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": ty == CONTROL,
            })),
            UNUSED => {}
            other => {
                return Err(format!(
                    "token {id} (`{token}`) has type {other}, which a byte-level BPE tokenizer does not use"
                ))
            }
        }
    }
    let merges = t
        .merges
        .iter()
        .map(|m| match m.split(' ').collect::<Vec<_>>().as_slice() {
            [a, b] if !a.is_empty() && !b.is_empty() => Ok(json!([a, b])),
            _ => Err(format!(
                "merge `{m}` is not two tokens separated by one space"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let byte_level = json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false,
    });
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_PRE_TOKENIZER},
                    "behavior": "Isolated",
                    "invert": false,
                },
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}

/// The chat tokenizer of the GGUF file `file` (metadata `meta`, files beside it in `dir`), and
/// where its tokenizer and template came from.
pub fn chat_tokenizer(
    file: &Path,
    meta: &GgufTokenizer,
    family: Option<Family>,
) -> Result<(ChatTokenizer, TextSource, TextSource), TokenizerError> {
    use forkscore_backends::candle::limits::{MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES};
    let dir = file.parent().unwrap_or(Path::new("."));
    let invalid = |reason: String| TokenizerError::Invalid {
        path: file.to_path_buf(),
        reason,
    };
    let (json_bytes, tokenizer_source) =
        match read_checkpoint_file(&dir.join("tokenizer.json"), MAX_TOKENIZER_BYTES)? {
            Some(bytes) => (bytes, TextSource::TokenizerJson),
            None => {
                let built = tokenizer_json(meta).map_err(|e| {
                    invalid(format!(
                        "{e}; put the model's tokenizer.json beside the GGUF file to use it instead"
                    ))
                })?;
                let bytes = serde_json::to_vec(&built).map_err(|e| invalid(e.to_string()))?;
                (bytes, TextSource::GgufMetadata)
            }
        };
    let config = read_checkpoint_text(&dir.join("tokenizer_config.json"), MAX_CONFIG_BYTES)?;
    let jinja = read_checkpoint_text(&dir.join("chat_template.jinja"), MAX_CONFIG_BYTES)?;
    let config_has_template = config
        .as_deref()
        .and_then(|c| serde_json::from_str::<Value>(c).ok())
        .is_some_and(|c| c.get("chat_template").is_some());
    let family_name = family.map_or("", Family::as_str);
    if config_has_template || jinja.is_some() {
        let t = ChatTokenizer::from_parts(&json_bytes, config.as_deref(), jinja, family_name, dir)?;
        return Ok((t, tokenizer_source, TextSource::BesideFile));
    }
    let Some(source) = meta.chat_template.clone() else {
        let t = ChatTokenizer::from_parts(&json_bytes, config.as_deref(), None, family_name, dir)?;
        return Ok((t, tokenizer_source, TextSource::BuiltIn));
    };
    let tokenizer =
        tokenizers::Tokenizer::from_bytes(&json_bytes).map_err(|e| TokenizerError::Invalid {
            path: dir.join("tokenizer.json"),
            reason: e.to_string(),
        })?;
    let token = |id: Option<u32>| id.and_then(|i| meta.tokens.get(i as usize).cloned());
    // `bos_token` is given to the template only where llama.cpp would add it
    let bos = match meta.add_bos_token {
        Some(true) => token(meta.bos_token_id),
        _ => None,
    };
    let template = ChatTemplate::new(
        source,
        TemplateOrigin::Custom,
        bos,
        token(meta.eos_token_id),
    )?;
    Ok((
        ChatTokenizer::new(tokenizer, template),
        tokenizer_source,
        TextSource::GgufMetadata,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> GgufTokenizer {
        GgufTokenizer {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens: ["a", "b", "ab", "<|x|>", "<y>", "[PAD5]"]
                .map(String::from)
                .to_vec(),
            token_types: vec![NORMAL, NORMAL, NORMAL, CONTROL, USER_DEFINED, UNUSED],
            merges: vec!["a b".into()],
            bos_token_id: None,
            eos_token_id: Some(3),
            padding_token_id: None,
            add_bos_token: Some(false),
            chat_template: None,
        }
    }

    #[test]
    fn metadata_becomes_a_byte_level_bpe_tokenizer() {
        let json = tokenizer_json(&tiny()).unwrap();
        let t = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
        let ids = t
            .encode_fast("ab<|x|><y>", false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, [2, 3, 4]);
        let added = t.get_added_tokens_decoder();
        assert!(added[&3].special && !added[&4].special);
        assert_eq!(t.token_to_id("[PAD5]"), None, "unused fillers are left out");
    }

    #[test]
    fn metadata_it_cannot_rebuild_is_refused_by_name() {
        type Break = fn(&mut GgufTokenizer);
        let cases: [(Break, &str); 6] = [
            (|t| t.model = "llama".into(), "`llama`"),
            (|t| t.pre = Some("llama-bpe".into()), "llama-bpe"),
            (|t| t.pre = None, "tokenizer.ggml.pre is None"),
            (|t| t.token_types.truncate(2), "token_type"),
            (|t| t.merges = vec!["ab".into()], "merge `ab`"),
            (|t| t.token_types[1] = 6, "has type 6"),
        ];
        for (break_it, says) in cases {
            let mut t = tiny();
            break_it(&mut t);
            let e = tokenizer_json(&t).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
