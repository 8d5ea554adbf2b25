//! `forkscore demo-model DIR`: write a tiny, seeded, random-weight checkpoint in the exact
//! Hugging Face layout (config.json, model.safetensors, the real Qwen tokenizer and chat
//! template), so the whole tool runs on a fresh machine without downloads. Its scores carry no
//! meaning: the weights are random.

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use forkscore_backends::Family;
use forkscore_checkpoints::tiny_model::{write_hf_folder, TinySpec};
use forkscore_checkpoints::tiny_qwen35::{Qwen35Layout, TinyQwen35};
use std::path::PathBuf;

/// Marks a folder as a demo model, so writing it again (same command) may replace it.
const MARKER: &str = "FORKSCORE_DEMO_MODEL";

/// The `--arch` names and the family each writes (Qwen3.5: the hybrid in the multimodal
/// checkpoint layout).
const ARCH_NAMES: [(&str, Family); 3] = [
    ("qwen2.5", Family::Qwen2),
    ("qwen3", Family::Qwen3),
    ("qwen3.5", Family::Qwen3_5),
];

fn parse_arch(name: String) -> Result<Family, String> {
    ARCH_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, f)| f)
        .ok_or_else(|| format!("unknown architecture `{name}`"))
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Folder to write (must not exist, or be empty).
    pub dir: PathBuf,
    /// Architecture of the tiny model.
    #[arg(
        long,
        default_value = "qwen2.5",
        value_parser = PossibleValuesParser::new(ARCH_NAMES.map(|(n, _)| n)).try_map(parse_arch)
    )]
    pub arch: Family,
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
        Family::Qwen2 => {
            write_hf_folder(&args.dir, &TinySpec::qwen25()).map_err(anyhow::Error::from)
        }
        Family::Qwen3 => {
            write_hf_folder(&args.dir, &TinySpec::qwen3()).map_err(anyhow::Error::from)
        }
        Family::Qwen3_5 => TinyQwen35::new(35, Qwen35Layout::Multimodal)
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
        "wrote a tiny {} demo checkpoint (random weights: its scores carry no meaning) to {}",
        args.arch,
        args.dir.display()
    );
    Ok(())
}
