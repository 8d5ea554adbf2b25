//! `--model` and the flags beside it, and opening the model they name (through the front ends'
//! shared [`forkscore_frontend::load::open`], which the service and the Python package use too).

use forkscore_backends::candle::device::{ComputeDType, DeviceSpec};
use forkscore_backends::Quantization;
pub use forkscore_frontend::load::{check_quantization_applied, LoadError, LoadedModel, ModelSpec};
use std::path::PathBuf;

/// How to find and load a model.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// A local Hugging Face checkpoint folder, a GGUF file (Qwen2 / Qwen2.5 / Qwen3; or a
    /// folder holding exactly one .gguf and no config.json), or ORG/NAME resolved offline in
    /// the HF cache.
    #[arg(long)]
    pub model: String,
    /// For ORG/NAME: the exact 40-hex commit (default: the commit the offline cache's
    /// refs/main names). For a folder or GGUF file: a free-text label recorded in provenance
    /// (default: "unlabelled"; the fingerprint identifies the weights either way).
    #[arg(long)]
    pub revision: Option<String>,
    /// cpu, cuda[:N] or metal[:N] (parsed once, here, into the seam's typed device).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// f32, bf16 or f16 (default: f32 on CPU, bf16 on GPUs). On the CPU compute is always f32:
    /// bf16 runs as --quantize bf16 (bf16 weights on AMX / AVX-512 BF16) and is refused on a CPU
    /// with neither; f16 is refused.
    #[arg(long)]
    pub dtype: Option<ComputeDType>,
    /// Prefix tokens per prefill chunk (default: 512 on CPU, 4096 on GPUs).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Quantize the decoder's linear weights in memory at load time: q8_0 (8-bit blocks), q4k
    /// (4-bit), bf16 (weights and each product's activations rounded to bf16, sums in f32) or
    /// int8 (per-channel int8 weights times per-row int8 activations, exact integer sums; CPUs
    /// with AMX-INT8 only, the fastest CPU scheme there). The embedding, norms and candidate
    /// head stay in --dtype. Default: none.
    #[arg(long)]
    pub quantize: Option<Quantization>,
    /// Extra temperature calibrations (same format as engine/data/calibration.json).
    #[arg(long)]
    pub calibration_file: Option<PathBuf>,
    /// On a GPU: make a context's result independent of the contexts packed or merged with it
    /// (bit-identical to scoring it alone, also in bf16) by prefilling and scoring every context
    /// in calls of its own, never packed or merged with others — about the speed of
    /// `--batch-mode direct`; see docs/cuda-kernels.md. The CPU is
    /// batch-invariant without it (the flag changes nothing there).
    #[arg(long)]
    pub deterministic: bool,
}

impl ModelArgs {
    /// The model these flags name.
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            model: self.model.clone(),
            revision: self.revision.clone(),
            device: self.device,
            dtype: self.dtype,
            prefill_chunk: self.prefill_chunk,
            quantize: self.quantize,
            calibration_file: self.calibration_file.clone(),
            deterministic: self.deterministic,
        }
    }
}

/// Open the model `args` name.
pub fn open(args: &ModelArgs) -> Result<LoadedModel, LoadError> {
    forkscore_frontend::load::open(&args.spec())
}
