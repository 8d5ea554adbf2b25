//! GGUF checkpoints on the tiny fixtures of `fixtures/gguf/`, written by
//! `fixtures/scripts/make_gguf.py` with PyPI's `gguf` (llama.cpp's writer) from the tiny demo
//! checkpoints (see `fixtures/gguf/README.md`; committed, so no Python and no download here):
//! - the F32 GGUF gives exactly the logits of the safetensors folder it was converted from (the
//!   fixture keeps the first 2,048 embedding rows, so ids and candidates stay below that), and
//!   the Q8_0 GGUF keeps its linear weights in Q8_0 and stays within the Q8_0 tolerance;
//! - the tokenizer rebuilt from the metadata gives the ids of the Hugging Face tokenizer.json
//!   of the same (truncated) vocabulary, special tokens and Unicode included; the chat template
//!   comes through; a tokenizer.json / chat_template.jinja beside the file wins;
//! - broken files (truncated, wrong magic, unsupported architecture, unknown tensor type,
//!   missing tensor) are typed errors, never panics; the parser survives random corruption.

use std::path::{Path, PathBuf};

use forkscore_backends::candle::gguf::file::parse;
use forkscore_backends::candle::gguf::GgufTokenizer;
use forkscore_backends::{
    Backend, CandleBackend, CandleError, Family, LoadOptions, Quantization, ResolvedCheckpoint,
};
use forkscore_pipeline::gguf_tokenizer::{chat_tokenizer, TextSource};
use forkscore_testkit::tiny_model::{ensure_tiny_model, TinySpec};
use forkscore_testkit::tokenizers::Fixture;
use forkscore_testkit::tolerance::Tolerance;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gguf")
        .join(name)
}

/// The fixture's entry of SOURCES.json.
fn source_entry(file: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("SOURCES.json")).expect("SOURCES.json");
    let all: serde_json::Value = serde_json::from_str(&text).expect("SOURCES.json is JSON");
    all["fixtures"]
        .as_array()
        .and_then(|a| a.iter().find(|f| f["file"] == file))
        .cloned()
        .unwrap_or_else(|| panic!("{file} is not in SOURCES.json"))
}

/// The demo folder a fixture was converted from, checked to hold the very same weights.
fn source_folder(spec: &TinySpec, file: &str) -> PathBuf {
    let dir = ensure_tiny_model(spec);
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("model.safetensors");
    let have = hex::encode(Sha256::digest(&bytes));
    let want = source_entry(file)["source_model_safetensors_sha256"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        have, want,
        "the tiny {file} source changed: regenerate fixtures/gguf with fixtures/scripts/make_gguf.py"
    );
    dir
}

fn load(checkpoint: &ResolvedCheckpoint, quantization: Option<Quantization>) -> CandleBackend {
    let options = LoadOptions {
        quantization,
        ..LoadOptions::default()
    };
    CandleBackend::load(checkpoint, &options).expect("load")
}

fn gguf(file: &str) -> ResolvedCheckpoint {
    ResolvedCheckpoint::from_gguf(&fixture(file), "fixture").expect("resolve GGUF")
}

/// 37 ids and 150 candidates, all below the fixtures' 2,048 embedding rows.
fn prompt() -> (Vec<u32>, Vec<u32>) {
    let ids = (0..37u32).map(|i| (i * 331 + 17) % 2048).collect();
    let candidates = (0..150u32).map(|i| (i * 13 + 5) % 2048).collect();
    (ids, candidates)
}

#[test]
fn f32_gguf_logits_equal_the_safetensors_folder() {
    for (spec, file) in [
        (TinySpec::qwen25(), "qwen25_f32.gguf"),
        (TinySpec::qwen3(), "qwen3_f32.gguf"),
    ] {
        let folder = source_folder(&spec, file);
        let reference = load(
            &ResolvedCheckpoint::from_folder(&folder, "fixture").unwrap(),
            None,
        );
        let from_gguf = load(&gguf(file), None);
        let (ids, candidates) = prompt();
        let want = reference.forward_full(&ids, &candidates).unwrap();
        let got = from_gguf.forward_full(&ids, &candidates).unwrap();
        // the same f32 values through the same code path
        Tolerance::EXACT.assert_close(file, &got, &want);
        // and through the forked path: prefill + one scored row
        let state = from_gguf.prefill(&ids[..30]).unwrap();
        let rows = [forkscore_backends::ScoreRow {
            state: 0,
            suffix: &ids[30..],
        }];
        let scored = from_gguf.score_rows(&[&state], &rows, &candidates).unwrap();
        Tolerance::CPU_F32_LOGITS.assert_close(&format!("{file} forked"), &scored.data, &want);
        assert_eq!(from_gguf.facts().family, reference.facts().family);
        assert_eq!(from_gguf.tied_head(), reference.tied_head(), "{file}");
        let summary = from_gguf.gguf_summary().expect("a GGUF load has a summary");
        assert!(summary.dequantized.is_empty(), "{file}: {summary:?}");
        assert_eq!(summary.stored_types.keys().collect::<Vec<_>>(), ["F32"]);
    }
}

#[test]
fn q8_0_gguf_keeps_its_linear_weights_quantized() {
    for (spec, file) in [
        (TinySpec::qwen25(), "qwen25_q8_0.gguf"),
        (TinySpec::qwen3(), "qwen3_q8_0.gguf"),
    ] {
        let folder = source_folder(&spec, file);
        let reference = load(
            &ResolvedCheckpoint::from_folder(&folder, "fixture").unwrap(),
            None,
        );
        let from_gguf = load(&gguf(file), None);
        let linear = 7 * spec.layers;
        let summary = from_gguf.quant_summary();
        assert_eq!(
            summary.by_type.get("q8_0"),
            Some(&linear),
            "{file}: {summary:?}"
        );
        assert_eq!(summary.by_type.len(), 1, "{file}: {summary:?}");
        // on the CPU the embedding (and an untied head) stay in Q8_0 too: nothing is
        // dequantized at load
        let g = from_gguf.gguf_summary().unwrap();
        assert!(g.dequantized.is_empty(), "{file}: {g:?}");
        let (ids, candidates) = prompt();
        let want = reference.forward_full(&ids, &candidates).unwrap();
        let got = from_gguf.forward_full(&ids, &candidates).unwrap();
        eprintln!(
            "{file}: max |Q8_0 GGUF - f32 folder| = {}",
            Tolerance::max_abs_diff(&got, &want)
        );
        Tolerance::Q8_0_TINY_LOGITS.assert_close(file, &got, &want);
        assert!(
            Tolerance::max_abs_diff(&got, &want) > 0.0,
            "{file}: Q8_0 weights gave f32 logits bit for bit: the blocks were not used"
        );
    }
}

/// Strings with special tokens (control and user-defined), Unicode (NFC composition, CJK,
/// emoji with joiners), whitespace runs, contractions and digits.
const STRINGS: &[&str] = &[
    "Hello, world!",
    "<|im_start|>system\nYou are a classifier.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<tool_call>{\"a\": 1}</tool_call> <|fim_prefix|>x<|fim_suffix|>",
    "naïve café — 日本語のテキスト 😀👩‍👩‍👧 Ünïcödé",
    "e\u{301} vs \u{e9}: NFC composes the first",
    "  two  spaces,\n\n\ttab and\r\nnewlines   \n",
    "Don't, I'LL, we've; they'd 12345 3.14159",
    "topic: A B C D E F G H I J K L M N O P Q R S T U V W X Y Z\n",
    "",
];

fn reference_tokenizer(name: &str) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(fixture(name)).expect("reference tokenizer.json")
}

#[test]
fn tokenizer_from_metadata_matches_the_tokenizer_json() {
    for (file, reference, family) in [
        ("qwen25_f32.gguf", "qwen25_tokenizer.json", Family::Qwen2),
        ("qwen3_q8_0.gguf", "qwen3_tokenizer.json", Family::Qwen3),
    ] {
        let path = fixture(file);
        let meta = GgufTokenizer::read(&path).unwrap();
        let (tok, tokenizer_source, template_source) =
            chat_tokenizer(&path, &meta, Some(family)).unwrap();
        assert_eq!(tokenizer_source, TextSource::GgufMetadata);
        assert_eq!(template_source, TextSource::GgufMetadata);
        let reference = reference_tokenizer(reference);
        for s in STRINGS {
            let want = reference.encode_fast(*s, false).unwrap().get_ids().to_vec();
            assert_eq!(tok.encode(s).unwrap(), want, "{file}: {s:?}");
        }
        assert_eq!(
            tok.token_id("<|im_end|>"),
            reference.token_to_id("<|im_end|>")
        );
        // the chat template is the family's real one, and its eos token is the metadata's
        let want = hex::encode(Sha256::digest(family.chat_template().as_bytes()));
        assert_eq!(tok.template().source_sha256(), want, "{file}");
        assert_eq!(tok.template().eos_token(), Some("<|im_end|>"));
    }
}

#[test]
fn tokenizer_and_template_beside_the_file_win() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.gguf");
    std::fs::copy(fixture("qwen25_f32.gguf"), &file).unwrap();
    let before = ResolvedCheckpoint::from_gguf(&file, "x")
        .unwrap()
        .fingerprint;
    // a tokenizer.json without the first merge ("Ġ Ġ"): two spaces stay two tokens
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen25_tokenizer.json")).unwrap())
            .unwrap();
    json["model"]["merges"].as_array_mut().unwrap().remove(0);
    std::fs::write(dir.path().join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ 'custom' }}").unwrap();
    let meta = GgufTokenizer::read(&file).unwrap();
    let (tok, tokenizer_source, template_source) =
        chat_tokenizer(&file, &meta, Some(Family::Qwen2)).unwrap();
    assert_eq!(tokenizer_source, TextSource::TokenizerJson);
    assert_eq!(template_source, TextSource::BesideFile);
    let from_metadata = {
        let plain = fixture("qwen25_f32.gguf");
        chat_tokenizer(&plain, &meta, Some(Family::Qwen2))
            .unwrap()
            .0
    };
    // "a", "ĠĠ" (two of the three spaces), "Ġb"; without the merge those two spaces stay apart
    assert_eq!(from_metadata.encode("a   b").unwrap().len(), 3);
    assert_eq!(
        tok.encode("a   b").unwrap().len(),
        4,
        "the file beside was not used"
    );
    assert_eq!(
        tok.template().source_sha256(),
        hex::encode(Sha256::digest(b"{{ 'custom' }}"))
    );
    // the files beside it are part of the fingerprint
    let after = ResolvedCheckpoint::from_gguf(&file, "x")
        .unwrap()
        .fingerprint;
    assert_ne!(before, after);
}

#[test]
fn gguf_model_loads_through_the_cli_loader_and_scores() {
    let args = forkscore_pipeline::load::ModelArgs {
        model: fixture("qwen3_q8_0.gguf").display().to_string(),
        revision: Some("fixture".into()),
        device: "cpu".parse().unwrap(),
        dtype: None,
        prefill_chunk: None,
        quantize: None,
        calibration_file: None,
        deterministic: false,
    };
    let loaded = forkscore_pipeline::load::open(&args).expect("open the GGUF fixture");
    let p = serde_json::to_value(&loaded.provenance).unwrap();
    assert_eq!(p["source"], "gguf");
    assert!(p["fingerprint"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(p["gguf"]["tokenizer"], "gguf_metadata");
    assert_eq!(p["gguf"]["chat_template"], "gguf_metadata");
    assert_eq!(p["gguf"]["dequantized_at_load"], serde_json::json!({}));
    assert_eq!(p["gguf"]["stored_types"]["Q8_0"], 23);
    let schema = forkscore_engine::schema::Schema::from_json_str(
        r#"{"topic": {"type": "enum", "choices": ["business", "sport", "tech"]}}"#,
    )
    .unwrap();
    let compiled = loaded.engine.compile(&schema).unwrap();
    let options = forkscore_engine::ScoreOptions::default();
    let decision = loaded
        .engine
        .decide("The match ended two to one.", &compiled, &options)
        .unwrap();
    let field = &decision.fields["topic"];
    let total: f64 = field.scores.values().sum();
    assert!((total - 1.0).abs() < 1e-9, "{total}");
}

#[test]
fn a_folder_with_one_gguf_resolves_to_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("qwen3_f32.gguf"), dir.path().join("m.gguf")).unwrap();
    let c = ResolvedCheckpoint::resolve(dir.path().to_str().unwrap(), "x").unwrap();
    assert_eq!(c.gguf.as_deref(), Some(dir.path().join("m.gguf").as_path()));
    std::fs::copy(fixture("qwen3_q8_0.gguf"), dir.path().join("n.gguf")).unwrap();
    let e = ResolvedCheckpoint::resolve(dir.path().to_str().unwrap(), "x").unwrap_err();
    assert!(
        matches!(&e, CandleError::InvalidModelRef { reason } if reason.contains("m.gguf, n.gguf")),
        "{e}"
    );
}

/// Write `bytes` as a .gguf file and load it as far as it goes.
fn load_bytes(bytes: &[u8]) -> Result<CandleBackend, CandleError> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.gguf");
    std::fs::write(&file, bytes).unwrap();
    let checkpoint = ResolvedCheckpoint::from_gguf(&file, "broken")?;
    CandleBackend::load(&checkpoint, &LoadOptions::default())
}

/// `bytes` with the first occurrence of `from` replaced by `to` (same length).
fn patched(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("pattern in the fixture");
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

/// `bytes` with the ggml type of tensor `name` set to `id`.
fn with_tensor_type(bytes: &[u8], name: &str, id: u32) -> Vec<u8> {
    // tensor info: u64 name length, name, u32 n_dims, n_dims × u64, u32 type, u64 offset
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("tensor info in the fixture")
        + key.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * dims;
    let mut out = bytes.to_vec();
    out[ty..ty + 4].copy_from_slice(&id.to_le_bytes());
    out
}

#[test]
fn broken_gguf_files_are_typed_errors() {
    let good = std::fs::read(fixture("qwen25_f32.gguf")).unwrap();
    let header_len = parse(&good).unwrap().header_len;
    let invalid = |e: &CandleError, says: &str| matches!(e, CandleError::InvalidCheckpoint { reason, .. } if reason.contains(says));
    // truncated: inside the magic, the metadata, the tensor infos, the tensor data
    for cut in [2, 30, header_len / 2, header_len - 3, good.len() - 1] {
        let e = load_bytes(&good[..cut])
            .err()
            .expect("a truncated file loads");
        assert!(
            invalid(&e, "truncated") || invalid(&e, "beyond the end") || invalid(&e, "magic"),
            "cut at {cut}: {e}"
        );
    }
    let e = load_bytes(&patched(&good, b"GGUF", b"GGML")).err().unwrap();
    assert!(invalid(&e, "magic"), "{e}");
    let e = load_bytes(&patched(
        &good,
        b"\x05\x00\x00\x00\x00\x00\x00\x00qwen2",
        b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
    ))
    .err()
    .unwrap();
    assert!(
        matches!(&e, CandleError::UnsupportedArchitecture { name, .. } if name.contains("llama")),
        "{e}"
    );
    for (id, says) in [(99u32, "ggml type 99 (unknown)"), (23, "(IQ4_XS)")] {
        let e = load_bytes(&with_tensor_type(&good, "output_norm.weight", id))
            .err()
            .unwrap();
        assert!(
            invalid(&e, says) && invalid(&e, "output_norm.weight"),
            "{e}"
        );
    }
    let e = load_bytes(&patched(
        &good,
        b"blk.1.ffn_up.weight",
        b"blk.1.ffn_uq.weight",
    ))
    .err()
    .unwrap();
    assert!(
        matches!(&e, CandleError::MissingTensor { name, .. } if name.contains("blk.1.ffn_up.weight")),
        "{e}"
    );
}

#[test]
fn the_parser_survives_corrupted_headers() {
    let good = std::fs::read(fixture("qwen3_f32.gguf")).unwrap();
    let header_len = parse(&good).unwrap().header_len;
    // a fixed xorshift stream: byte flips and truncations all over the header
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..400 {
        let mut bytes = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % header_len as u64) as usize;
            bytes[at] = next() as u8;
        }
        let cut = (next() % (header_len as u64 + 64)) as usize;
        let bytes = if next() % 2 == 0 {
            &bytes[..cut]
        } else {
            &bytes[..]
        };
        match parse(bytes) {
            Ok(_) => ok += 1,
            Err(reason) => {
                assert!(!reason.is_empty());
                refused += 1
            }
        }
    }
    eprintln!("corrupted headers: {ok} parsed, {refused} refused");
    assert!(refused > 0 && ok > 0, "{ok} parsed, {refused} refused");
}

/// The tokenizer rebuilt from a real Qwen2.5 GGUF's metadata (151,936 tokens) against the
/// committed Qwen2.5 tokenizer.json on its ~300 samples and the strings above. Needs the file:
/// `FORKSCORE_REAL_GGUF=path/to/qwen2.5-coder-0.5b-instruct.gguf cargo test -p
/// forkscore-pipeline --test gguf -- --ignored` (`scripts/real-models.sh` fetches it).
#[test]
#[ignore = "needs FORKSCORE_REAL_GGUF (a real Qwen2.5 GGUF; scripts/real-models.sh)"]
fn real_qwen25_gguf_tokenizer_matches_the_fixture() {
    let path = PathBuf::from(std::env::var("FORKSCORE_REAL_GGUF").expect("FORKSCORE_REAL_GGUF"));
    let meta = GgufTokenizer::read(&path).unwrap();
    let json = forkscore_pipeline::gguf_tokenizer::tokenizer_json(&meta).unwrap();
    let rebuilt = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
    let reference =
        tokenizers::Tokenizer::from_bytes(Family::Qwen2.tokenizer_json().unwrap()).unwrap();
    let samples: serde_json::Value = serde_json::from_str(Family::Qwen2.samples_json()).unwrap();
    let mut texts: Vec<String> = samples["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect();
    texts.extend(STRINGS.iter().map(|s| s.to_string()));
    for t in &texts {
        let want = reference
            .encode_fast(t.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let got = rebuilt
            .encode_fast(t.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(got, want, "{t:?}");
    }
    eprintln!("{} strings tokenized identically", texts.len());
}
