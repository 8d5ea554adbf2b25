//! Write every tiny model preset that `fixtures/reference/` covers, as Hugging Face folders.
//!
//! In: one argument, an output folder. Out: `OUTDIR/<preset>/` per preset (config.json,
//! generation_config.json, model.safetensors, the family's real tokenizer.json and
//! tokenizer_config.json), exactly the bytes `backends/tests/reference_transformers.rs`
//! regenerates. Feed OUTDIR to `fixtures/scripts/make_reference.py`.
//!
//! ```sh
//! cargo run -p forkscore-testkit --example write_tiny_models -- /tmp/tiny-models
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use forkscore_testkit::tiny_model::{write_hf_folder, TinySpec};

/// Preset name (= folder name = reference file stem) and its spec.
fn presets() -> Vec<(&'static str, TinySpec)> {
    vec![("qwen25", TinySpec::qwen25()), ("qwen3", TinySpec::qwen3())]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: write_tiny_models OUTDIR");
        return ExitCode::from(2);
    };
    let out = PathBuf::from(out);
    for (name, spec) in presets() {
        let dir = out.join(name);
        if let Err(e) = write_hf_folder(&dir, &spec) {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
        println!("{}", dir.display());
    }
    ExitCode::SUCCESS
}
