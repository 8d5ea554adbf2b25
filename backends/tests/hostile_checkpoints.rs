//! Hostile checkpoints, table-driven: absurd config sizes, configs that disagree with the
//! stored tensors, implausible safetensors header lengths, non-regular files. Each must give a
//! clear typed error quickly, without allocating from the hostile number.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use forkscore_backends::{CandleBackend, CandleError, LoadOptions, ResolvedCheckpoint};
use forkscore_testkit::tiny_model::{
    config_json, tiny_tensors, write_safetensors, TinySpec, TinyTensor,
};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use serde_json::{json, Value};

fn small() -> TinySpec {
    TinySpec {
        vocab: 1000,
        tokenizer: false,
        ..TinySpec::qwen25()
    }
}

fn write_folder(dir: &Path, config: &Value, tensors: &[TinyTensor]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let refs: Vec<&TinyTensor> = tensors.iter().collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).expect("write");
    dir.to_path_buf()
}

fn load(dir: &Path) -> Result<CandleBackend, CandleError> {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "test")?;
    CandleBackend::load(&ckpt, &LoadOptions::default())
}

fn with(mut v: Value, key: &str, x: Value) -> Value {
    v[key] = x;
    v
}

#[test]
fn absurd_and_mismatched_config_sizes_table() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small();
    let base = config_json(&spec);
    let tensors = tiny_tensors(&spec).expect("tensors");
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "layers 3e9",
            with(base.clone(), "num_hidden_layers", json!(3_000_000_000u64)),
            "implausibly large",
        ),
        (
            "layers 2^40",
            with(base.clone(), "num_hidden_layers", json!(1u64 << 40)),
            "implausibly large",
        ),
        (
            "hidden 1e12",
            with(base.clone(), "hidden_size", json!(1_000_000_000_000u64)),
            "implausibly large",
        ),
        (
            "vocab 2^60",
            with(base.clone(), "vocab_size", json!(1u64 << 60)),
            "implausibly large",
        ),
        (
            "layers +1",
            with(base.clone(), "num_hidden_layers", json!(spec.layers + 1)),
            "stores tensors for",
        ),
        (
            "layers 4000",
            with(base.clone(), "num_hidden_layers", json!(4000)),
            "stores tensors for",
        ),
        (
            "vocab mismatch",
            with(base.clone(), "vocab_size", json!(999)),
            "does not match the stored embedding",
        ),
        (
            "negative",
            with(base.clone(), "hidden_size", json!(-5)),
            "non-negative integer",
        ),
    ];
    for (i, (name, config, want)) in cases.iter().enumerate() {
        let dir = write_folder(&tmp.path().join(format!("c{i}")), config, &tensors);
        let t = Instant::now();
        let err = load(&dir).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(want), "{name}: {err}");
        assert!(t.elapsed() < Duration::from_secs(10), "{name}: slow");
    }
}

#[test]
fn qwen35_with_absurd_linear_dims_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = TinyQwen35::new(3, Qwen35Layout::TextOnly);
    let dir = model.write(&tmp.path().join("q35")).expect("write");
    for (key, value) in [
        ("linear_key_head_dim", json!(1_000_000_000_000u64)),
        ("num_hidden_layers", json!(1_000_000_000_000u64)),
        ("linear_num_value_heads", json!(1u64 << 40)),
    ] {
        let mut config = model.config();
        config[key] = value;
        std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
        let err = load(&dir).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("implausibly large"), "{key}: {err}");
    }
}

/// A `model.safetensors` whose 8-byte length declares `declared` bytes, padded (sparsely) to
/// `file_len` bytes.
fn fake_header_file(path: &Path, declared: u64, file_len: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(&declared.to_le_bytes()).expect("write");
    f.write_all(b"{").expect("write");
    f.set_len(file_len).expect("set_len");
}

#[test]
fn implausible_header_lengths_are_refused_before_reading() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small();
    let cases: &[(&str, u64, u64, &str)] = &[
        (
            "3 GiB header in a 3 GiB file",
            3 << 30,
            (3 << 30) + 16,
            "over the limit",
        ),
        ("longer than the file", 1 << 20, 1_000, "but the file has"),
        ("u64::MAX", u64::MAX, 1_000, "but the file has"),
        ("shorter than 8 bytes", 0, 4, "corrupt"),
    ];
    for (i, (name, declared, len, want)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("h{i}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("config.json"), config_json(&spec).to_string()).expect("config");
        let path = dir.join("model.safetensors");
        if *len < 8 {
            std::fs::write(&path, vec![0u8; *len as usize]).expect("write");
        } else {
            fake_header_file(&path, *declared, *len);
        }
        let t = Instant::now();
        let err = load(&dir).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(want), "{name}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{name}: took {:?}",
            t.elapsed()
        );
    }
}

#[cfg(unix)]
#[test]
fn a_fifo_config_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().expect("tmp");
    let spec = small();
    let dir = write_folder(
        &tmp.path().join("f"),
        &config_json(&spec),
        &tiny_tensors(&spec).expect("t"),
    );
    std::fs::remove_file(dir.join("config.json")).expect("rm");
    let made = std::process::Command::new("mkfifo")
        .arg(dir.join("config.json"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !made {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(load(&dir).err().map(|e| e.to_string()));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("loading a FIFO config must not hang")
        .unwrap_or_default();
    assert!(err.contains("FIFO"), "{err}");
}
