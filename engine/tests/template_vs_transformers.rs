//! The checkpoint's own chat template rendered by forkscore (minijinja) equals what Hugging Face
//! transformers' `apply_chat_template` rendered for the committed references
//! (fixtures/reference/*.json: messages, template arguments and the rendered text).

use forkscore_engine::template::{ChatTemplate, TemplateOrigin};
use forkscore_testkit::tokenizers::{Family, Fixture};

#[test]
fn fixture_templates_render_exactly_like_transformers() {
    let root = format!("{}/../fixtures/reference", env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for (file, family) in [
        ("qwen25.json", Family::Qwen2),
        ("qwen3.json", Family::Qwen3),
        ("qwen35.json", Family::Qwen3_5),
        ("qwen35_text.json", Family::Qwen3_5),
    ] {
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{root}/{file}")).unwrap())
                .unwrap();
        let template = ChatTemplate::new(
            family.chat_template().to_string(),
            TemplateOrigin::ChatTemplateFile,
            None,
            Some("<|im_end|>".into()),
        )
        .unwrap();
        for p in reference["prompts"].as_array().unwrap() {
            let kwargs = p["template_kwargs"].as_object().unwrap();
            let got = template.render_with(&p["messages"], true, kwargs).unwrap();
            assert_eq!(
                got,
                p["rendered"].as_str().unwrap(),
                "{file} prompt {}",
                p["name"]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 16);
}
