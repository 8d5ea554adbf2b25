//! The exact fast encoder (`tokenizer::bytelevel`) gives the ids `tokenizers` gives, on the three
//! Qwen tokenizers: random texts over an alphabet chosen to hit every alternative of the split
//! patterns and every cut the encoder makes (sync points, added tokens, non-ASCII pieces, long
//! pre-tokens), the committed tokenizer samples, and special tokens both as control tokens and
//! as text.

use forkscore_engine::ChatTokenizer;
use forkscore_testkit::tokenizers::Family;
use forkscore_testkit::tokenizers::Fixture;
use proptest::prelude::*;
use std::path::Path;

const FAMILIES: [Family; 3] = [Family::Qwen2, Family::Qwen3, Family::Qwen3_5];

fn load(family: Family, fast: bool) -> ChatTokenizer {
    let json = family.tokenizer_json().expect("fixture");
    ChatTokenizer::from_parts(
        &json,
        Some(family.tokenizer_config_json()),
        Some(family.chat_template().to_string()),
        match family {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3_5 => "qwen3_5",
        },
        Path::new("fixture"),
    )
    .expect("tokenizer")
    .with_fast_encoder(fast)
}

struct Pair {
    family: Family,
    fast: ChatTokenizer,
    reference: ChatTokenizer,
}

fn pairs() -> &'static [Pair] {
    static PAIRS: std::sync::OnceLock<Vec<Pair>> = std::sync::OnceLock::new();
    PAIRS.get_or_init(|| {
        FAMILIES
            .iter()
            .map(|&family| Pair {
                family,
                fast: load(family, true),
                reference: load(family, false),
            })
            .collect()
    })
}

fn assert_same(text: &str) {
    for p in pairs() {
        assert_eq!(
            p.fast.encode(text).unwrap(),
            p.reference.encode(text).unwrap(),
            "{:?}, special tokens as control tokens: {text:?}",
            p.family
        );
        assert_eq!(
            p.fast.encode_as_text(text).unwrap(),
            p.reference.encode_as_text(text).unwrap(),
            "{:?}, special tokens as text: {text:?}",
            p.family
        );
    }
}

#[test]
fn the_fast_encoder_is_taken_on_every_qwen_tokenizer() {
    for p in pairs() {
        assert!(p.fast.fast_encoder(), "{:?}", p.family);
        assert!(!p.reference.fast_encoder(), "{:?}", p.family);
    }
}

#[test]
fn committed_samples_encode_the_same() {
    for family in FAMILIES {
        let samples: serde_json::Value =
            serde_json::from_str(family.samples_json()).expect("samples.json");
        for s in samples["samples"].as_array().expect("samples") {
            assert_same(s["text"].as_str().expect("text"));
        }
    }
}

#[test]
fn every_ascii_byte_around_words_encodes_the_same() {
    for b in 0u8..0x80 {
        let c = char::from(b);
        for text in [
            format!("a{c}b"),
            format!("{c}"),
            format!("{c}{c}{c}"),
            format!("x {c} y"),
            format!("x{c} 1"),
            format!("'{c}s"),
            format!("end.{c}\n\nnext"),
            format!("  {c}  \t\r\n  z"),
        ] {
            assert_same(&text);
        }
    }
}

#[test]
fn edge_texts_encode_the_same() {
    let long_spaces = " ".repeat(300);
    let long_word = "a".repeat(200) + " " + &"xyz".repeat(90);
    let long_punct = "=-".repeat(100);
    for text in [
        "",
        " ",
        "\n",
        "I'm sure they'LL've done it's 'd 'RE 'Ve",
        "'der 'sew 'ton 'man 'Der 'Sew 'rest 'very 'llama 'LLama 'REst 'VEry 'l 'r 'v",
        "price: 1234567.89 USD, i.e. 12% of 1,000",
        "café naïve résumé — “quoted” ‘single’ … ½ ² ٣ Ⅻ",
        "e\u{301}t\u{e9} a\u{308}\u{304} \u{301}start",
        "ſ K ﬁ Ǆ ǅ İ ß ẞ",
        "日本語のテキスト 中文 한국어 ᄀ\u{1161}\u{11a8}",
        "emoji 👍🏽 family 👨‍👩‍👧 flag 🇬🇧 ok",
        "nbsp\u{a0}here\u{85}nel\u{2028}ls\u{3000}ideo",
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more <tool_call>{\"a\": 1}</tool_call> <|im_",
        "<|im_start|><|im_start|>x<|im_end|><think>\n\n</think>\n\n",
        &long_spaces,
        &long_word,
        &long_punct,
        "tabs\t\t\tand\r\nwindows\r\n\r\nlines   \n  trailing   ",
    ] {
        assert_same(text);
    }
}

/// Pieces that exercise the pattern's alternatives and the encoder's cuts.
fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z]{1,12}",
        2 => "[0-9]{1,6}",
        2 => proptest::sample::select(vec![
            " ", "  ", "\n", "\r\n", "\t", " \n ", "\x0b", "\x0c", "\u{a0}", "\u{85}", "\u{2028}",
            "\u{3000}", "\x1c", "\x1f", "\x00", "\x7f",
        ])
        .prop_map(str::to_string),
        2 => proptest::sample::select(vec![
            ".", ",", "'", "'s", "'T", "'re", "'LL", "'d", "-", "--", "!?", "...", "\"", "(", ")",
            "{", "}", "<", ">", "|", "/", "\\", "@#", "$", "%", "^&*", "_", "=", "+", "~", "`",
        ])
        .prop_map(str::to_string),
        2 => proptest::sample::select(vec![
            "é", "e\u{301}", "\u{301}", "ñ", "ß", "ſ", "K", "日本", "中", "한", "ᄀ\u{1161}", "👍",
            "🏽", "\u{200d}", "½", "٣", "Ⅻ", "—", "“", "…", "\u{fe0f}", "Ω", "ω", "ﬁ", "İ",
        ])
        .prop_map(str::to_string),
        1 => proptest::sample::select(vec![
            "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
            "<|fim_prefix|>", "<think>", "</think>", "<|im_", "|>",
        ])
        .prop_map(str::to_string),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_texts_encode_the_same(atoms in proptest::collection::vec(atom(), 0..40)) {
        assert_same(&atoms.concat());
    }

    #[test]
    fn random_printable_ascii_encodes_the_same(text in "[ -~\t\n\r]{0,200}") {
        assert_same(&text);
    }
}
