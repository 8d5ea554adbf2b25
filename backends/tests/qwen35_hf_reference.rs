//! Qwen3.5 against the external oracle: Hugging Face transformers in float32.
//!
//! `backends/tests/data/qwen35_tiny_hf_reference.json` holds transformers' last-position logits
//! (at a few candidate ids) for prompts of 1 to 150 tokens on the tiny seeded Qwen3.5 checkpoint
//! (text-only layout; the multimodal layout is proven identical in `qwen35_backend.rs`). It was
//! produced by the ignored test [`export_for_transformers`] followed by
//! `python backends/tests/data/qwen35_hf_reference.py EXPORT_DIR` (pure-torch GDN kernels,
//! eager attention); the file records the transformers and torch versions.

use anyhow::{Context, Result};
use forkscore_backends::candle::{CandleBackend, LoadOptions, ResolvedCheckpoint};
use forkscore_backends::Backend;
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use forkscore_testkit::tolerance::Tolerance;
use serde_json::{json, Value};

const SEED: u64 = 35;
const CANDIDATES: [u32; 6] = [15, 1000, 90_000, 248_044, 248_046, 248_319];

fn prompts() -> Vec<Vec<u32>> {
    [1usize, 5, 64, 70, 150]
        .iter()
        .enumerate()
        .map(|(p, &n)| {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ p as u64;
            (0..n)
                .map(|i| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    if i == 0 {
                        248_045
                    } else {
                        ((x >> 33) % 248_000) as u32
                    }
                })
                .collect()
        })
        .collect()
}

fn backend(dir: &std::path::Path) -> Result<CandleBackend> {
    TinyQwen35::new(SEED, Qwen35Layout::TextOnly).write(dir)?;
    let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-qwen35")?;
    Ok(CandleBackend::load(&ckpt, &LoadOptions::default())?)
}

/// Writes `$FORKSCORE_HF_EXPORT/model` and `prompts.json` for the Python generator.
#[test]
#[ignore = "generator step: run by hand with FORKSCORE_HF_EXPORT set"]
fn export_for_transformers() -> Result<()> {
    let out = std::path::PathBuf::from(std::env::var("FORKSCORE_HF_EXPORT").context("FORKSCORE_HF_EXPORT")?);
    let model_dir = out.join("model");
    let b = backend(&model_dir)?;
    // transformers does not need the tokenizer to run ids; keep the export small.
    std::fs::remove_file(model_dir.join("tokenizer.json"))?;
    let rust: Vec<Vec<f32>> =
        prompts().iter().map(|p| b.forward_full(p, &CANDIDATES)).collect::<Result<_, _>>()?;
    let spec = json!({"seed": SEED, "candidates": CANDIDATES, "prompts": prompts(), "rust_logits": rust});
    std::fs::write(out.join("prompts.json"), serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

#[test]
fn matches_transformers_float32_reference() -> Result<()> {
    let reference: Value = serde_json::from_str(include_str!("data/qwen35_tiny_hf_reference.json"))?;
    assert_eq!(reference["seed"].as_u64(), Some(SEED));
    let want_prompts: Vec<Vec<u32>> = serde_json::from_value(reference["prompts"].clone())?;
    assert_eq!(want_prompts, prompts(), "reference was made for other prompts");
    let logits: Vec<Vec<f32>> = serde_json::from_value(reference["logits"].clone())?;
    let dir = tempfile::tempdir()?;
    let b = backend(dir.path())?;
    let mut worst = 0f32;
    for (p, want) in prompts().iter().zip(&logits) {
        let got = b.forward_full(p, &CANDIDATES)?;
        Tolerance::VS_TRANSFORMERS_F32.assert_close(&format!("prompt of {} tokens", p.len()), &got, want);
        worst = worst.max(Tolerance::max_abs_diff(&got, want));
    }
    println!("vs transformers {}: max |diff| = {worst:e}", reference["transformers"]);
    Ok(())
}
