//! Row compilation: code tokens, candidate union, and clear failures for tokenizers or models
//! that cannot do code scoring.

mod support;

use forkscore_engine::rows::CompileError;
use forkscore_engine::template::ChatTemplate;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine, EngineError, Schema,
};
use forkscore_testkit::fake::FakeBackend;
use forkscore_testkit::tokenizers::Family;

/// GPT-2 byte → printable char map (byte-level BPE alphabet).
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.into_iter().zip(cs) {
        out[b as usize] = char::from_u32(c).unwrap();
    }
    out
}

/// A byte-level BPE without merges: every byte is its own token, so " A" is two tokens.
fn bytes_only_tokenizer() -> tokenizers::Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> = byte_chars()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
        .collect();
    let added: Vec<serde_json::Value> = ["<|im_start|>", "<|im_end|>"]
        .iter()
        .enumerate()
        .map(|(i, t)| serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null, "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                   "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []}
    });
    tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap()
}

#[test]
fn a_tokenizer_without_single_token_codes_fails_clearly() {
    let tok = ChatTokenizer::new(
        bytes_only_tokenizer(),
        ChatTemplate::built_in(Family::Qwen2),
    );
    let engine = Engine::new(
        FakeBackend::new(1),
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    )
    .unwrap();
    let schema =
        Schema::from_json_str(r#"{"risk": {"type": "enum", "choices": ["low", "high"]}}"#).unwrap();
    match engine.compile(&schema) {
        Err(EngineError::Compile(e @ CompileError::CodeNotSingleToken { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains("risk") && msg.contains("\" A\"") && msg.contains("2 tokens"),
                "{msg}"
            );
        }
        other => panic!("expected CodeNotSingleToken, got {other:?}"),
    }
}

#[test]
fn a_tokenizer_larger_than_the_embedding_is_refused() {
    let tok = support::chat_tokenizer(Family::Qwen2);
    let small = FakeBackend::new(1).with_vocab_size(151_000);
    match Engine::new(
        small,
        tok,
        CheckpointIdentity::default(),
        CalibrationRegistry::built_in(),
    ) {
        Err(e @ EngineError::TokenizerLargerThanEmbedding { .. }) => {
            assert!(e.to_string().contains("151000"), "{e}");
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a 151,665-id tokenizer must not pair with a 151,000-row embedding"),
    }
}

#[test]
fn codes_are_single_tokens_and_the_candidate_union_is_shared() {
    for fam in Family::ALL {
        let engine = support::fake_engine(fam);
        let schema = Schema::from_json_str(&support::example("support_triage.json")).unwrap();
        let compiled = engine.compile(&schema).unwrap();
        // Codes A..F are used (max 6 choices): the union has one id per letter.
        assert_eq!(compiled.candidates().len(), 6, "{fam:?}");
        for f in compiled.fields() {
            for (i, &id) in f.code_ids.iter().enumerate() {
                assert_eq!(
                    engine.tokenizer().decode(&[id]).unwrap(),
                    format!(" {}", f.codes[i])
                );
                assert_eq!(compiled.candidates()[f.candidate_index[i]], id);
            }
        }
    }
}

#[test]
fn rows_compiled_for_another_tokenizer_are_refused() {
    let schema = Schema::from_json_str(r#"{"flag": {"type": "boolean"}}"#).unwrap();
    let qwen25 = support::fake_engine(Family::Qwen2);
    let qwen35 = support::fake_engine(Family::Qwen3_5);
    let compiled = qwen25.compile(&schema).unwrap();
    assert!(matches!(
        qwen35.decide(
            "context",
            &compiled,
            &forkscore_engine::ScoreOptions::default()
        ),
        Err(EngineError::ForeignSchema)
    ));
    // The same tokenizer loaded twice is the same identity.
    let again = support::fake_engine_with(Family::Qwen2, CheckpointIdentity::default(), 9);
    assert!(again
        .decide(
            "context",
            &compiled,
            &forkscore_engine::ScoreOptions::default()
        )
        .is_ok());
}

#[test]
fn a_literal_field_compiles_without_code_letters_past_26_choices() {
    let engine = support::fake_engine(Family::Qwen2);
    let example = include_str!("../../fixtures/examples/high_cardinality_255.json");
    let literal = "literal".parse().unwrap();
    let schema = Schema::from_json_str_with(example, literal).unwrap();
    let compiled = engine.compile(&schema).unwrap();
    let f = &compiled.fields()[0];
    assert_eq!(f.name, "tariff_classification");
    assert!(f.codes.is_empty() && f.code_ids.is_empty() && compiled.candidates().is_empty());
    let lit = f.literal.as_ref().expect("a literal field");
    assert_eq!(lit.paths.len(), 255);
    assert!(!compiled.tree_candidates().is_empty());
}
