//! Opening a model for scoring: resolve the checkpoint (local folder, offline Hugging Face
//! cache snapshot, or a GGUF file — see [`crate::gguf_tokenizer`] for its text side), load the candle backend on the requested device/dtype, load the tokenizer
//! and chat template, and pair them in an engine with the calibration registry.

use crate::provenance::{GgufProvenance, ModelProvenance, GIT_COMMIT, VERSION};
use forkscore_backends::candle::checkpoint::{CheckpointSource, ResolvedCheckpoint};
use forkscore_backends::candle::device::{ComputeDType, DeviceSpec};
use forkscore_backends::candle::gguf::{GgufTensors, GgufTokenizer};
use forkscore_backends::candle::{CandleBackend, LoadOptions};
use forkscore_backends::{Backend, CandleError, Quantization};
use forkscore_engine::calibration::{adapter_sha256_from_ready, CalibrationError};
use forkscore_engine::tokenizer::TokenizerError;
use forkscore_engine::{
    CalibrationRegistry, ChatTokenizer, CheckpointIdentity, Engine, EngineError,
};
use std::path::PathBuf;

/// How to find and load a model (the command line's `--model`, `--revision`, `--device`,
/// `--dtype`, `--prefill-chunk`, `--quantize` and `--calibration-file`; the Python package's
/// `Scorer.load` arguments).
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// A local Hugging Face checkpoint folder, a GGUF file (or a folder holding exactly one
    /// .gguf and no config.json), or ORG/NAME resolved offline in the HF cache.
    pub model: String,
    /// For ORG/NAME: the exact 40-hex commit (default: the commit the offline cache's
    /// refs/main names). For a folder or GGUF file: a free-text label recorded in provenance.
    pub revision: Option<String>,
    pub device: DeviceSpec,
    /// Default: f32 on CPU, bf16 on GPUs (see [`crate::precision::resolve`]).
    pub dtype: Option<ComputeDType>,
    /// Prefix tokens per prefill chunk (default: the device's).
    pub prefill_chunk: Option<usize>,
    /// In-memory quantization of the decoder's linear weights.
    pub quantize: Option<Quantization>,
    /// Extra temperature calibrations (same format as engine/data/calibration.json).
    pub calibration_file: Option<PathBuf>,
    /// Every context in GPU calls of its own, so results never depend on the batch (see
    /// `LoadOptions::deterministic`); no effect on the CPU.
    pub deterministic: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Precision(#[from] crate::precision::PrecisionError),
    #[error(transparent)]
    Backend(#[from] CandleError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    /// `--quantize` asked for a block scheme that fits none of the model's linear weights.
    #[error("--quantize {scheme} would quantize none of this model's {weights} linear weights: each weight's input width must be a multiple of the scheme's block (32 for q8_0; 256 for q4k, or 32 for its q4_0 fallback), and none is, so the model would run unquantized while its provenance claimed {scheme}; drop --quantize, or use bf16 (which fits any width)")]
    NothingQuantized {
        scheme: Quantization,
        weights: usize,
    },
}

/// Refuse a `--quantize` that quantized nothing: what provenance records must be what was
/// applied. `summary` counts the linear weights per type loaded (`"dense"`: left as they were).
pub fn check_quantization_applied(
    scheme: Option<Quantization>,
    summary: &std::collections::BTreeMap<String, usize>,
) -> Result<(), LoadError> {
    let Some(scheme) = scheme else {
        return Ok(());
    };
    let weights: usize = summary.values().sum();
    if weights > 0 && summary.keys().all(|t| t == "dense") {
        return Err(LoadError::NothingQuantized { scheme, weights });
    }
    Ok(())
}

/// A loaded model: the engine and what provenance records about it.
pub struct LoadedModel {
    pub engine: Engine<CandleBackend>,
    pub provenance: ModelProvenance,
}

pub fn open(args: &ModelSpec) -> Result<LoadedModel, LoadError> {
    let device = args.device;
    let bf16_kernel = match device {
        DeviceSpec::Cpu => forkscore_backends::candle::cpu::bf16_kernel(),
        _ => None,
    };
    let precision = crate::precision::resolve(device, args.dtype, args.quantize, bf16_kernel)?;
    if let Some(note) = &precision.note {
        eprintln!("note: {note}");
    }
    let checkpoint = ResolvedCheckpoint::resolve_optional(&args.model, args.revision.as_deref())?;
    let options = LoadOptions {
        device,
        dtype: precision.dtype,
        prefill_chunk: args
            .prefill_chunk
            .unwrap_or_else(|| LoadOptions::for_device(device).prefill_chunk),
        quantization: precision.quantization,
        deterministic: args.deterministic,
    };
    // A GGUF file's tokenizer is built from its metadata before the weights are loaded: the
    // build's transients (the metadata's strings, the tokenizer JSON) then never sit on top of
    // the loaded weights, which would raise the peak memory by tens of MB.
    let gguf_tokenizer = match &checkpoint.gguf {
        Some(file) => {
            let header = GgufTensors::open(file)?;
            let family = Some(header.config()?.architecture.family());
            let meta = GgufTokenizer::from_metadata(file, &header.file().metadata)?;
            drop(header);
            let built = crate::gguf_tokenizer::chat_tokenizer(file, &meta, family)?;
            Some(built)
        }
        None => None,
    };
    let backend = CandleBackend::load(&checkpoint, &options)?;
    check_quantization_applied(options.quantization, &backend.quant_summary().by_type)?;
    let family = backend.facts().family;
    let (tokenizer, gguf) = match (gguf_tokenizer, backend.gguf_summary()) {
        (Some((tokenizer, tokenizer_source, template_source)), Some(summary)) => {
            let gguf = GgufProvenance {
                tokenizer: tokenizer_source,
                chat_template: template_source,
                stored_types: summary.stored_types.clone(),
                dequantized_at_load: summary.dequantized.clone(),
            };
            (tokenizer, Some(gguf))
        }
        _ => (ChatTokenizer::for_model(&checkpoint.dir, family)?, None),
    };
    let tokenizer = tokenizer.with_fast_encoder(!forkscore_backends::switches::is(
        "FORKSCORE_TOKENIZER",
        "reference",
    ));
    let mut registry = CalibrationRegistry::built_in();
    if let Some(path) = &args.calibration_file {
        registry.extend_from_file(path)?;
    }
    let adapter_sha256 = adapter_sha256_from_ready(&checkpoint.dir);
    let identity = CheckpointIdentity {
        model_id: Some(checkpoint.model_id.clone()),
        revision: Some(checkpoint.revision.clone()),
        adapter_sha256: adapter_sha256.clone(),
    };
    let facts = backend.facts().clone();
    let chat_template = tokenizer.template().origin().clone();
    let engine = Engine::new(backend, tokenizer, identity, registry)?.with_shared_head(
        !forkscore_backends::switches::is("FORKSCORE_SHARED_HEAD", "off"),
    );
    let provenance = ModelProvenance {
        forkscore_version: VERSION,
        forkscore_commit: GIT_COMMIT,
        model_id: checkpoint.model_id.clone(),
        revision: checkpoint.revision.clone(),
        source: match checkpoint.source {
            CheckpointSource::Folder => "folder".into(),
            CheckpointSource::HfCache => "hf_cache".into(),
            CheckpointSource::Gguf => "gguf".into(),
        },
        fingerprint: checkpoint.fingerprint.clone(),
        architecture: facts.architecture,
        dtype: facts.dtype,
        device: facts.device,
        quantization: facts.quantization,
        deterministic: engine.backend().contexts_alone(),
        chat_template,
        adapter_sha256,
        gguf,
        switches: forkscore_backends::switches::Switches::current().recorded(),
    };
    Ok(LoadedModel { engine, provenance })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn summary(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
        pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn a_quantization_that_applied_to_nothing_is_refused() {
        let dense = summary(&[("dense", 14)]);
        match check_quantization_applied(Some(Quantization::Q8_0), &dense) {
            Err(e @ LoadError::NothingQuantized { weights: 14, .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("q8_0") && msg.contains("none"), "{msg}");
            }
            other => panic!("expected NothingQuantized, got {other:?}"),
        }
        // partly quantized (some widths fit), fully quantized, or not asked: fine
        let partly = summary(&[("dense", 2), ("q4_0", 12)]);
        assert!(check_quantization_applied(Some(Quantization::Q4K), &partly).is_ok());
        assert!(
            check_quantization_applied(Some(Quantization::Q8_0), &summary(&[("q8_0", 14)])).is_ok()
        );
        assert!(check_quantization_applied(None, &dense).is_ok());
    }
}
