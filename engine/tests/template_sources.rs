//! Where the chat template comes from: tokenizer_config.json, else chat_template.jinja (what
//! transformers 5 writes), else the family's built-in template — recorded as the origin.

use forkscore_engine::template::TemplateOrigin;
use forkscore_engine::tokenizer::TokenizerError;
use forkscore_engine::ChatTokenizer;
use forkscore_testkit::tokenizers::{Family, Fixture};

fn folder(config_has_template: bool, jinja: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        Family::Qwen3.tokenizer_json().unwrap(),
    )
    .unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(Family::Qwen3.tokenizer_config_json()).unwrap();
    if !config_has_template {
        cfg.as_object_mut().unwrap().remove("chat_template");
    }
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    if jinja {
        std::fs::write(
            dir.path().join("chat_template.jinja"),
            Family::Qwen3.chat_template(),
        )
        .unwrap();
    }
    dir
}

fn render(tok: &ChatTokenizer) -> String {
    forkscore_engine::prepare::render::render_prefix(
        tok.template(),
        "ctx",
        &[],
        forkscore_engine::Layout::ContextFirst,
    )
    .unwrap()
}

#[test]
fn template_lookup_order_and_origin() {
    let both = ChatTokenizer::from_folder(folder(true, true).path(), "qwen3").unwrap();
    assert_eq!(both.template().origin(), &TemplateOrigin::TokenizerConfig);
    let jinja = ChatTokenizer::from_folder(folder(false, true).path(), "qwen3").unwrap();
    assert_eq!(jinja.template().origin(), &TemplateOrigin::ChatTemplateFile);
    let neither = ChatTokenizer::from_folder(folder(false, false).path(), "qwen3").unwrap();
    assert_eq!(
        neither.template().origin(),
        &TemplateOrigin::BuiltIn {
            family: Family::Qwen3
        }
    );
    // The real template and the separate file render the same prompt; the built-in fallback
    // renders the same single-turn, non-thinking prompt as the real Qwen3 template.
    assert_eq!(render(&both), render(&jinja));
    assert_eq!(render(&both), render(&neither));
}

#[test]
fn no_template_and_unknown_family_is_a_clear_error() {
    let dir = folder(false, false);
    match ChatTokenizer::from_folder(dir.path(), "llama") {
        Err(e @ TokenizerError::NoTemplate { .. }) => {
            assert!(e.to_string().contains("llama"), "{e}")
        }
        other => panic!("expected NoTemplate, got {other:?}"),
    }
    let empty = tempfile::tempdir().unwrap();
    let err = ChatTokenizer::from_folder(empty.path(), "qwen3").unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn truncation_and_padding_in_tokenizer_json_are_ignored() {
    let mut json: serde_json::Value =
        serde_json::from_slice(&Family::Qwen2.tokenizer_json().unwrap()).unwrap();
    json["truncation"] = serde_json::json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0});
    json["padding"] = serde_json::json!({"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
                                         "pad_id": 151643, "pad_type_id": 0, "pad_token": "<|endoftext|>"});
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        Family::Qwen2.tokenizer_config_json(),
    )
    .unwrap();
    let tok = ChatTokenizer::from_folder(dir.path(), "qwen2").unwrap();
    let text = "one two three four five six seven eight nine ten eleven twelve";
    let ids = tok.encode(text).unwrap();
    assert_eq!(
        ids.len(),
        12,
        "neither truncated to 8 nor padded to 64: {ids:?}"
    );
}
