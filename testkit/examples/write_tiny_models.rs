//! Write every tiny model preset that `fixtures/reference/` covers, as Hugging Face folders.
//!
//! In: one argument, an output folder. Out: `OUTDIR/<preset>/` per preset (config.json,
//! generation_config.json for the dense ones, model.safetensors, the family's real tokenizer.json,
//! tokenizer_config.json, and chat_template.jinja for Qwen3.5), exactly the bytes `backends/tests/reference_transformers.rs`
//! regenerates. Feed OUTDIR to `fixtures/scripts/make_reference.py`.
//!
//! ```sh
//! cargo run -p forkscore-testkit --example write_tiny_models -- /tmp/tiny-models
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};
use forkscore_testkit::tiny_qwen35::{Qwen35Layout, TinyQwen35};

/// Seed of the tiny Qwen3.5 presets (both layouts hold the same text parameters).
const QWEN35_SEED: u64 = 35;

/// One preset: a dense spec or a Qwen3.5 description.
enum Preset {
    Dense(TinySpec),
    Qwen35(TinyQwen35),
}

/// Preset name (= folder name = reference file stem) and what to write.
fn presets() -> Vec<(&'static str, Preset)> {
    vec![
        ("qwen25", Preset::Dense(TinySpec::qwen25())),
        ("qwen3", Preset::Dense(TinySpec::qwen3())),
        (
            "qwen35",
            Preset::Qwen35(TinyQwen35::new(QWEN35_SEED, Qwen35Layout::Multimodal)),
        ),
        (
            "qwen35_text",
            Preset::Qwen35(TinyQwen35::new(QWEN35_SEED, Qwen35Layout::TextOnly)),
        ),
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: write_tiny_models OUTDIR");
        return ExitCode::from(2);
    };
    let out = PathBuf::from(out);
    for (name, preset) in presets() {
        let dir = out.join(name);
        let written = match preset {
            Preset::Dense(spec) => write_hf_folder(&dir, &spec).map_err(|e| e.to_string()),
            Preset::Qwen35(tiny) => tiny.write(&dir).map(|_| ()).map_err(|e| e.to_string()),
        };
        if let Err(e) = written {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
        println!("{}", dir.display());
    }
    ExitCode::SUCCESS
}
