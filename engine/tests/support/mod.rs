//! Shared test setup: engines over the fake backend with the real Qwen tokenizers.
#![allow(dead_code)]

use forkscore_engine::{CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine};
use forkscore_testkit::fake::FakeBackend;
use forkscore_testkit::tokenizers::{Family, Fixture};
use std::path::Path;
use std::sync::OnceLock;

pub fn model_family(f: Family) -> &'static str {
    match f {
        Family::Qwen2 => "qwen2",
        Family::Qwen3 => "qwen3",
        Family::Qwen3_5 => "qwen3_5",
    }
}

pub fn chat_tokenizer(f: Family) -> ChatTokenizer {
    let json = f.tokenizer_json().expect("tokenizer fixture");
    ChatTokenizer::from_parts(
        &json,
        Some(f.tokenizer_config_json()),
        None,
        model_family(f),
        Path::new("fixtures"),
    )
    .expect("fixture tokenizer loads")
}

pub fn fake_engine_with(f: Family, id: CheckpointIdentity, seed: u64) -> Engine<FakeBackend> {
    Engine::new(
        FakeBackend::new(seed),
        chat_tokenizer(f),
        id,
        CalibrationRegistry::built_in(),
    )
    .expect("engine")
}

/// One shared engine per family (tokenizers take ~0.5 s to load).
pub fn fake_engine(f: Family) -> &'static Engine<FakeBackend> {
    static E25: OnceLock<Engine<FakeBackend>> = OnceLock::new();
    static E3: OnceLock<Engine<FakeBackend>> = OnceLock::new();
    static E35: OnceLock<Engine<FakeBackend>> = OnceLock::new();
    let cell = match f {
        Family::Qwen2 => &E25,
        Family::Qwen3 => &E3,
        Family::Qwen3_5 => &E35,
    };
    cell.get_or_init(|| fake_engine_with(f, CheckpointIdentity::default(), 1))
}

pub fn example(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/examples")
            .join(name),
    )
    .expect("example schema")
}
