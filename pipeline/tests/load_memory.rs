//! Peak memory of a load: a checkpoint stored in bf16 and computed in f32 must not hold the
//! touched file, or a copy in the stored dtype, beside its f32 weights.
//!
//! One test in its own binary: the peak comes from `getrusage(RUSAGE_CHILDREN)`, the largest
//! resident size of any child this process waited for, so no other child may run beside it.

#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;

use forkscore_checkpoints::tiny_model::{write_hf_folder, TinySpec, WeightDtype};

/// Largest resident size of the waited-for children so far, in bytes.
fn children_peak() -> u64 {
    // SAFETY: `getrusage` writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    usage.ru_maxrss as u64 * 1024
}

fn score(model: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_forkscore"))
        .args(["score", "--model"])
        .arg(model)
        .args([
            "--revision",
            "x",
            "--schema",
            r#"{"topic": {"type": "enum", "choices": ["sport", "tech"]}}"#,
            "--context",
            "The match ended in a draw after extra time.",
        ])
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .expect("run forkscore");
    assert!(
        out.status.success(),
        "forkscore score failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bf16 Qwen2.5-shaped checkpoint with 100 M values (an untied 151,936 × 320 embedding and
/// head: 401 MB in f32) peaks less than 0.6× its f32 weights above the peak of a tiny model of
/// the same vocabulary. The tiny model's peak holds vocabulary-sized work (the tokenizer) that
/// the big model's peak holds too, so the difference is well under the weights: 176 MB with
/// this loader, 318 MB with the one before it, which kept the touched file and a copy in the
/// stored dtype beside the f32 weights (bound: 240 MB).
#[test]
fn a_bf16_checkpoint_computed_in_f32_is_held_about_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let small = TinySpec::qwen25();
    write_hf_folder(&dir.path().join("small"), &small).expect("small checkpoint");
    let big = TinySpec {
        hidden: 320,
        heads: 5,
        kv_heads: 1,
        head_dim: 64,
        intermediate: 1280,
        layers: 2,
        tied: false,
        dtype: WeightDtype::Bf16,
        ..TinySpec::qwen25()
    };
    write_hf_folder(&dir.path().join("big"), &big).expect("big checkpoint");
    let f32_bytes: u64 = std::fs::metadata(dir.path().join("big/model.safetensors"))
        .expect("big weights")
        .len()
        * 2;

    score(&dir.path().join("small"));
    let base = children_peak();
    score(&dir.path().join("big"));
    let peak = children_peak();
    let bound = base + f32_bytes * 3 / 5;
    eprintln!("tiny model {base} B, bf16 model {peak} B, f32 weights {f32_bytes} B");
    assert!(
        peak <= bound,
        "peak {peak} B over the bound {bound} B (tiny model {base} B, f32 weights {f32_bytes} B)"
    );
}
