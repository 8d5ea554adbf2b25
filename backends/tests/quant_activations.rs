//! `FORKSCORE_QUANT_ACTIVATIONS=f32`: quantized layers multiply f32 activations by their
//! weights dequantized per call, so a quantized model decides as its dequantized weights
//! written out dense. This binary sets the switch before anything reads it (the switchboard
//! reads the environment once per process), so it holds one test.
//!
//! The weights are rounded through `Q8_0` first (quantize, dequantize): `--quantize q8_0` of the
//! rounded folder then holds exactly the blocks whose dequantized values the dense folder stores,
//! and the two must agree within f32 summation order — far inside the `Q8_0` tolerance that the
//! 8-bit activations need (`quantized.rs`).

mod common;

use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use forkscore_backends::{CandleBackend, LoadOptions, Quantization, ResolvedCheckpoint};
use forkscore_testkit::tiny_model::{config_json, tiny_tensors, write_safetensors, TinySpec};
use forkscore_testkit::tolerance::Tolerance;
use safetensors::Dtype;

fn load(dir: &Path, quantization: Option<Quantization>) -> CandleBackend {
    let ckpt = ResolvedCheckpoint::from_folder(dir, "quant-activations").expect("checkpoint");
    CandleBackend::load(
        &ckpt,
        &LoadOptions {
            quantization,
            ..LoadOptions::default()
        },
    )
    .expect("load")
}

/// `values (out, in)` through `Q8_0` and back.
fn q8_0_rounded(values: &[f32], shape: &[usize]) -> Vec<f32> {
    let t = Tensor::from_slice(values, shape, &Device::Cpu).expect("tensor");
    QTensor::quantize(&t, GgmlDType::Q8_0)
        .and_then(|q| q.dequantize(&Device::Cpu))
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.to_vec1::<f32>())
        .expect("round trip")
}

#[test]
fn q8_0_layers_with_f32_activations_equal_their_dequantized_weights() {
    // set before anything in this process reads the switchboard
    std::env::set_var("FORKSCORE_QUANT_ACTIVATIONS", "f32");
    let spec = TinySpec {
        vocab: 1000,
        tokenizer: false,
        ..TinySpec::qwen25()
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("rounded");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("config.json"), config_json(&spec).to_string()).expect("config");
    let mut tensors = tiny_tensors(&spec).expect("tensors");
    let mut rounded = 0;
    for t in tensors.iter_mut() {
        let linear = t.name.starts_with("model.layers.")
            && t.name.ends_with("_proj.weight")
            && t.shape.len() == 2
            && t.shape[1] % 32 == 0;
        if !linear {
            continue;
        }
        assert_eq!(t.dtype, Dtype::F32, "{}", t.name);
        let values: Vec<f32> = t
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        t.bytes = q8_0_rounded(&values, &t.shape)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        rounded += 1;
    }
    assert!(rounded >= 7, "every projection of every layer rounded");
    let refs: Vec<_> = tensors.iter().collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).expect("write");

    let dense = load(&dir, None);
    let q8 = load(&dir, Some(Quantization::Q8_0));
    assert!(
        q8.quant_summary().by_type.get("q8_0").copied().unwrap_or(0) >= rounded,
        "the projections are held in Q8_0: {:?}",
        q8.quant_summary().by_type
    );
    let (want_full, want_fork) = common::full_and_fork(&dense, spec.vocab);
    let (got_full, got_fork) = common::full_and_fork(&q8, spec.vocab);
    Tolerance::CPU_F32_LOGITS.assert_close("full prompt", &got_full, &want_full);
    Tolerance::CPU_F32_LOGITS.assert_close("prefill + fork", &got_fork, &want_fork);
}
