//! Replays the fuzz seed corpus (`fuzz/corpus/<target>/`) and every crash reproducer
//! (`fuzz/regressions/<target>/`) through the same entry points and invariants as the fuzz
//! targets in `fuzz/fuzz_targets/`, so `cargo test --workspace` keeps them fixed without
//! libFuzzer. See fuzz/README.md.

use forkscore_backends::candle::inspect_weights;
use forkscore_backends::candle::limits::MAX_DIMS;
use forkscore_backends::candle::ModelConfig;
use forkscore_engine::prepare::split::split_exact;
use forkscore_engine::{CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine, Schema};
use forkscore_pipeline::batch::openai::LineFormat;
use forkscore_pipeline::batch::reader::read_lines_bounded;
use forkscore_pipeline::input_bounds::parse_bounded;
use forkscore_testkit::fake::FakeBackend;
use forkscore_testkit::tokenizers::{Family, Fixture};
use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            if e.path().is_file() {
                out.push((e.path(), std::fs::read(e.path()).expect("read")));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn schema_corpus() {
    let all = inputs("schema");
    assert!(!all.is_empty());
    for (path, data) in all {
        let Ok(text) = std::str::from_utf8(&data) else {
            continue;
        };
        if let Ok(schema) = Schema::from_json_str(text) {
            let value: serde_json::Value = serde_json::from_str(text).expect("parsed once");
            let again = Schema::from_value(&value).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            assert_eq!(again.hash(), schema.hash(), "{path:?}");
        }
    }
}

#[test]
fn jsonl_record_corpus() {
    let all = inputs("jsonl_record");
    assert!(!all.is_empty());
    for (path, data) in all {
        let (tx, rx) = crossbeam_channel::unbounded();
        let lines = read_lines_bounded(data.as_slice(), 3, 1, 64, &tx).expect("slice");
        drop(tx);
        let mut last = 0;
        for raw in rx.iter().flatten() {
            assert!(raw.line > last && raw.line <= lines, "{path:?}");
            last = raw.line;
            let cases = [
                (false, LineFormat::Native),
                (true, LineFormat::Native),
                (false, LineFormat::Openai),
            ];
            for (shared, format) in cases {
                let line = match parse_bounded(&raw, shared, format) {
                    Ok(r) => r.line,
                    Err(f) => f.line,
                };
                assert_eq!(line, raw.line, "{path:?}");
            }
        }
    }
}

#[test]
fn safetensors_corpus() {
    let all = inputs("safetensors");
    assert!(!all.is_empty());
    for (path, data) in all {
        let dir = tempfile::tempdir().expect("tmp");
        if let Some(rest) = data.strip_prefix(b"I") {
            let (index, shard) = match rest.iter().position(|&b| b == 0) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &[][..]),
            };
            std::fs::write(dir.path().join("model.safetensors.index.json"), index).expect("w");
            std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), shard).expect("w");
        } else {
            std::fs::write(dir.path().join("model.safetensors"), &data).expect("w");
        }
        // a typed error or a listing, never a panic
        let _ = inspect_weights(dir.path()).map_err(|e| e.to_string());
        let _ = path;
    }
}

#[test]
fn config_corpus() {
    let all = inputs("config");
    assert!(!all.is_empty());
    for (path, data) in all {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&data) else {
            continue;
        };
        if let Ok(c) = ModelConfig::from_json(Path::new("config.json"), &value) {
            let limit = |k: &str| {
                MAX_DIMS
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map_or(u64::MAX, |d| d.1)
            };
            assert!(
                c.text.num_layers as u64 <= limit("num_hidden_layers"),
                "{path:?}"
            );
            assert_eq!(c.text.layer_kinds.len(), c.text.num_layers, "{path:?}");
            assert!(c.text.head_dim > 0 && c.text.head_dim % 2 == 0, "{path:?}");
        }
    }
}

#[test]
fn prompt_split_corpus() {
    let all = inputs("prompt_split");
    assert!(!all.is_empty());
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
    let schema =
        Schema::from_json_str(include_str!("../../fixtures/examples/parallel_schema.json"))
            .expect("schema");
    let compiled = engine.compile(&schema).expect("compile");
    let t = engine.tokenizer();
    let special: Vec<u32> = t
        .special_tokens()
        .iter()
        .filter_map(|s| t.encode(s).ok())
        .filter(|ids| ids.len() == 1)
        .map(|ids| ids[0])
        .collect();
    let count = |ids: &[u32]| ids.iter().filter(|i| special.contains(i)).count();
    let benign = count(
        &engine
            .prepare("benign", &compiled, 1 << 20)
            .expect("b")
            .split()
            .prefix_ids,
    );
    for (path, data) in all {
        let Ok(context) = std::str::from_utf8(&data) else {
            continue;
        };
        let Ok(p) = engine.prepare(context, &compiled, 1 << 20) else {
            continue;
        };
        let split = p.split();
        assert!(split.suffix_ids.iter().all(|x| !x.is_empty()), "{path:?}");
        assert_eq!(count(&split.prefix_ids), benign, "{path:?}");
        if !t
            .special_tokens()
            .iter()
            .any(|s| context.contains(s.as_str()))
        {
            let plain = split_exact(t, &split.prefix_text, &compiled.selectors()).expect("split");
            assert_eq!(&plain, split, "{path:?}");
        }
    }
}
