//! The prompt split: any context text in (with the real Qwen2.5 tokenizer and chat template,
//! the example schema). Never a panic; a prepared context has a non-empty prefix, one non-empty
//! suffix per field, the same number of special tokens as a benign context (a context cannot
//! forge turns), and — when it holds no special-token text — exactly the plain tokenizer's split.
#![no_main]

use forkscore_engine::prepare::split::split_exact;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, CompiledSchema, Engine, Schema,
};
use forkscore_testkit::fake::FakeBackend;
use forkscore_testkit::tokenizers::{Family, Fixture};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

struct Setup {
    engine: Engine<FakeBackend>,
    compiled: CompiledSchema,
    special_ids: Vec<u32>,
    benign_specials: usize,
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        let f = Family::Qwen2;
        let tok = ChatTokenizer::from_parts(
            &f.tokenizer_json().expect("fixture"),
            Some(f.tokenizer_config_json()),
            None,
            "qwen2",
            Path::new("fixtures"),
        )
        .expect("tokenizer");
        let engine = Engine::new(
            FakeBackend::new(1),
            tok,
            CheckpointIdentity::default(),
            CalibrationRegistry::built_in(),
        )
        .expect("engine");
        let schema = Schema::from_json_str(include_str!(
            "../../fixtures/examples/parallel_schema.json"
        ))
        .expect("schema");
        let compiled = engine.compile(&schema).expect("compile");
        let t = engine.tokenizer();
        let special_ids: Vec<u32> = t
            .special_tokens()
            .iter()
            .filter_map(|s| t.encode(s).ok())
            .filter(|ids| ids.len() == 1)
            .map(|ids| ids[0])
            .collect();
        let benign = engine.prepare("benign", &compiled, 1 << 20).expect("benign").split().clone();
        let benign_specials = benign
            .prefix_ids
            .iter()
            .filter(|i| special_ids.contains(i))
            .count();
        Setup {
            engine,
            compiled,
            special_ids,
            benign_specials,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(context) = std::str::from_utf8(data) else {
        return;
    };
    let s = setup();
    let Ok(p) = s.engine.prepare(context, &s.compiled, 1 << 20) else {
        return;
    };
    let split = p.split();
    assert!(!split.prefix_ids.is_empty());
    assert_eq!(split.suffix_ids.len(), s.compiled.fields().len());
    assert!(split.suffix_ids.iter().all(|x| !x.is_empty()));
    let specials = split
        .prefix_ids
        .iter()
        .filter(|i| s.special_ids.contains(i))
        .count();
    assert_eq!(specials, s.benign_specials, "a context changed the special-token count");
    let tok = s.engine.tokenizer();
    if !tok.special_tokens().iter().any(|t| context.contains(t.as_str())) {
        let plain = split_exact(tok, &split.prefix_text, &s.compiled.selectors()).expect("split");
        assert_eq!(&plain, split);
    }
});
