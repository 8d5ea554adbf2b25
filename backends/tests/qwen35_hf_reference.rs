//! Qwen3.5 against the external oracle: Hugging Face transformers in float32.
//!
//! `backends/tests/data/qwen35_tiny_hf_reference.json` holds transformers' last-position logits
//! (at a few candidate ids) for prompts of 1 to 150 tokens on the tiny seeded Qwen3.5 checkpoint
//! (text-only layout; the multimodal layout is proven identical in `qwen35_backend.rs`). It was
//! produced by the ignored test [`export_for_transformers`] followed by
//! `python backends/tests/data/qwen35_hf_reference.py EXPORT_DIR` (pure-torch GDN kernels,
//! eager attention); the file records the transformers and torch versions, and transformers'
//! load report for the composite layout (`Qwen3_5ForConditionalGeneration`: every text tensor
//! loaded, `mtp.*` ignored, no mismatched shape; the partial vision tower is left missing).

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
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
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
    backend_in(dir, Qwen35Layout::TextOnly)
}

fn backend_in(dir: &std::path::Path, layout: Qwen35Layout) -> Result<CandleBackend> {
    TinyQwen35::new(SEED, layout).write(dir)?;
    let ckpt = ResolvedCheckpoint::from_folder(dir, "tiny-qwen35")?;
    Ok(CandleBackend::load(&ckpt, &LoadOptions::default())?)
}

/// Writes `$FORKSCORE_HF_EXPORT/model` and `prompts.json` for the Python generator.
#[test]
#[ignore = "generator step: run by hand with FORKSCORE_HF_EXPORT set"]
fn export_for_transformers() -> Result<()> {
    let out = std::path::PathBuf::from(
        std::env::var("FORKSCORE_HF_EXPORT").context("FORKSCORE_HF_EXPORT")?,
    );
    let model_dir = out.join("model");
    let b = backend(&model_dir)?;
    // transformers does not need the tokenizer to run ids; keep the export small.
    std::fs::remove_file(model_dir.join("tokenizer.json"))?;
    // The same parameters in the composite layout (text_config, model.language_model.*, plus
    // model.visual.* and mtp.* tensors), to check transformers loads it as this crate does.
    let mm_dir = out.join("model_multimodal");
    TinyQwen35::new(SEED, Qwen35Layout::Multimodal).write(&mm_dir)?;
    std::fs::remove_file(mm_dir.join("tokenizer.json"))?;
    let rust: Vec<Vec<f32>> = prompts()
        .iter()
        .map(|p| b.forward_full(p, &CANDIDATES))
        .collect::<Result<_, _>>()?;
    let spec =
        json!({"seed": SEED, "candidates": CANDIDATES, "prompts": prompts(), "rust_logits": rust});
    std::fs::write(out.join("prompts.json"), serde_json::to_vec_pretty(&spec)?)?;
    Ok(())
}

#[test]
fn matches_transformers_float32_reference() -> Result<()> {
    let reference: Value =
        serde_json::from_str(include_str!("data/qwen35_tiny_hf_reference.json"))?;
    assert_eq!(reference["seed"].as_u64(), Some(SEED));
    let want_prompts: Vec<Vec<u32>> = serde_json::from_value(reference["prompts"].clone())?;
    assert_eq!(
        want_prompts,
        prompts(),
        "reference was made for other prompts"
    );
    let logits: Vec<Vec<f32>> = serde_json::from_value(reference["logits"].clone())?;
    // transformers' Qwen3_5ForConditionalGeneration on the composite layout of the same seed.
    let mm = &reference["multimodal"];
    assert_eq!(
        mm["model_class"].as_str(),
        Some("Qwen3_5ForConditionalGeneration")
    );
    let unexpected = mm["loading_info"]["unexpected_keys"]
        .as_array()
        .map(Vec::len);
    let mismatched = mm["loading_info"]["mismatched_keys"]
        .as_array()
        .map(Vec::len);
    assert_eq!(
        (unexpected, mismatched),
        (Some(0), Some(0)),
        "transformers did not load the layout cleanly"
    );
    let mm_logits: Vec<Vec<f32>> = serde_json::from_value(mm["logits"].clone())?;
    let mut worst = 0f32;
    for (layout, want_all) in [
        (Qwen35Layout::TextOnly, &logits),
        (Qwen35Layout::Multimodal, &mm_logits),
    ] {
        let dir = tempfile::tempdir()?;
        let b = backend_in(dir.path(), layout)?;
        for (p, want) in prompts().iter().zip(want_all) {
            let got = b.forward_full(p, &CANDIDATES)?;
            let what = format!("{layout:?}, prompt of {} tokens", p.len());
            Tolerance::VS_TRANSFORMERS_F32.assert_close(&what, &got, want);
            worst = worst.max(Tolerance::max_abs_diff(&got, want));
        }
    }
    println!(
        "vs transformers {}: max |diff| = {worst:e}",
        reference["transformers"]
    );
    Ok(())
}
