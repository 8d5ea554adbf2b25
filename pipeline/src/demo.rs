//! `forkscore demo-model DIR`: write a tiny, seeded, random-weight checkpoint in the exact
//! Hugging Face layout (config.json, model.safetensors, the real Qwen tokenizer and chat
//! template), so the whole tool runs on a fresh machine without downloads. Its scores carry no
//! meaning: the weights are random.

use anyhow::{bail, Context, Result};
use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use std::path::PathBuf;

/// Marks a folder as a demo model, so writing it again (same command) may replace it.
const MARKER: &str = "FORKSCORE_DEMO_MODEL";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoArch {
    #[value(name = "qwen2.5")]
    Qwen25,
    #[value(name = "qwen3")]
    Qwen3,
    /// Qwen3.5 hybrid (Gated DeltaNet + gated attention), multimodal checkpoint layout.
    #[value(name = "qwen3.5")]
    Qwen35,
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Folder to write (must not exist, or be empty).
    pub dir: PathBuf,
    /// Architecture of the tiny model.
    #[arg(long, value_enum, default_value = "qwen2.5")]
    pub arch: DemoArch,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let marker = args.dir.join(MARKER);
    let non_empty = std::fs::read_dir(&args.dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if non_empty && !marker.is_file() {
        bail!(
            "{} already exists and is not an earlier demo model; choose a new or empty folder",
            args.dir.display()
        );
    }
    let written = match args.arch {
        DemoArch::Qwen25 => {
            write_hf_folder(&args.dir, &TinySpec::qwen25()).map_err(anyhow::Error::from)
        }
        DemoArch::Qwen3 => {
            write_hf_folder(&args.dir, &TinySpec::qwen3()).map_err(anyhow::Error::from)
        }
        DemoArch::Qwen35 => TinyQwen35::new(35, Qwen35Layout::Multimodal)
            .write(&args.dir)
            .map(|_| ())
            .map_err(anyhow::Error::from),
    };
    written.with_context(|| format!("cannot write the demo model to {}", args.dir.display()))?;
    std::fs::write(
        &marker,
        "written by `forkscore demo-model`: random weights, scores carry no meaning\n",
    )
    .with_context(|| format!("cannot write {}", marker.display()))?;
    eprintln!(
        "wrote a tiny {:?} demo checkpoint (random weights: its scores carry no meaning) to {}",
        args.arch,
        args.dir.display()
    );
    Ok(())
}
